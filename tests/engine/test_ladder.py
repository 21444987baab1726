"""The repair ladder inside one incident: a playbook's ``next`` rung, climbed when its repair fails.

The far side is the simulated cluster with an operator's validation Job (``Validating``): it
fails on the first repaired node it checks and passes afterwards, as a GPU reset that did not
clear the fault and the reboot that did. Cases: in ``auto`` a reset whose validation fails
climbs to ``reboot-node`` by itself, the node taken out once (what the reset rung did carries
over), rebooted, validated (each rung's validation asked for in its own rung's name, which keeps
the far side's runs apart: ``bot.integrations.kubernetes.jobs.job_name``) and returned, and the
incident resolves; the timeline records the
climb and both rungs, the trust ledger counts the failed rung's retest (``climbed``) and the
reboot's (``passed``). In ``approve`` the climb asks again, under the new rung's name, and a
rejection ends it with nothing more done. Without ``next`` the failed validation goes to
humans, as before. A ladder naming no playbook, or climbing in a circle, is refused.

The fault back after the node's return (``fault_returns_within``): the reset passes its
validation and the node goes back into service, the incident stays open for the window, and
the same fault firing again inside it climbs to ``reboot-node`` within the same incident (filed by
another replica, unsignalled, it is seen at the next poll) — the
node taken out again, rebooted and returned, the ledger counting the reset ``climbed`` and the
reboot ``passed``; in ``approve`` the climb asks again and nothing of the reboot runs before the
approval. The same fault firing while the node is still out is the fault under repair, not its
return: no climb. With no fault back the incident closes when the window has passed. A guard
that refuses the climb (pitcrew paused) hands the incident to humans. A window without a next
rung is refused.

The shipped ``reboot-then-replace``, selected for XID 79 by its one catalog override and nothing
else: the reboot's validation fails and the incident climbs to ``replace-node`` by itself, the node
taken out once and replaced; the ledger counts the reboot rung ``climbed``.

Rollback after a climb undoes what each rung did, once: after the fault came back, the reboot
rung's DOWN and cordon (the reset rung's were undone by its own return); after a failed
validation climbed to a rung that does not take the node out (``ask-human``), the reset rung's
DOWN and cordon, which that rung carried over.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

from bot.domain.alerts import parse_webhook
from bot.domain.labels import LabelRules
from bot.domain.playbooks import Playbook, PlaybookSet
from bot.engine.errors import PermanentError, Reason
from bot.engine.intake import to_delivery
from bot.engine.steps import REGISTRY
from tests.engine.harness import EngineHarness, Slow
from tests.harness.scenarios import delivery
from tests.simulator.cluster import SimulatedCluster
from tests.simulator.world import SimulatedWorld

NODE = "gpu-node-02"
RESET = "xid48-then-xid154-1-after-xid48.json"  # XID 48 → reset-gpu
RESET_THEN_REBOOT = {
    "reset-gpu": {
        "steps": [
            "notify",
            "slurm_down",
            "cordon",
            "drain",
            "reset_gpu",
            {"step": "wait_ready", "timeout": "15m"},
            "slurm_resume",
            {"step": "confirm_resumed", "timeout": "45m"},
            "close",
        ],
        "next": "reboot-node",
    }
}


class Validating(SimulatedCluster):
    """The simulated cluster with a validation Job that fails its first run."""

    runs: list[bool] = []

    def __init__(self, world: SimulatedWorld) -> None:
        super().__init__(world)
        self.runs = []
        self.rungs: list[tuple[str, str]] = []  # (node, rung) of each validation

    async def validate(self, name: str, *, incident_id: str, rung: str) -> bool | None:
        passed = bool(self.runs)
        self.runs.append(passed)
        self.rungs.append((name, rung))
        if not passed:
            raise PermanentError(
                f"validation Job failed on {name}: dcgmi diag level 3", reason=Reason.JOB_FAILED
            )
        return True


#: The reset rung keeps its incident open 30 minutes after the node's return.
WATCHED = {"reset-gpu": {**RESET_THEN_REBOOT["reset-gpu"], "fault_returns_within": "30m"}}
WINDOW = 30 * 60


def harness(tmp_path: Path, mode: str, playbooks: dict[str, Any] | None = RESET_THEN_REBOOT) -> EngineHarness:
    return EngineHarness(tmp_path, mode=mode, playbooks=playbooks, cluster=Validating)


async def fault_again(h: EngineHarness, incident: str) -> None:
    """The same fault fires again on the node, as a new alert (a new startsAt)."""
    outcome = await h.deliver(delivery(RESET, node=NODE, starts=h.time.now()))
    assert set(outcome.recurred) == {incident} and not outcome.opened and not outcome.changed, outcome


async def node_state(h: EngineHarness) -> tuple[bool, list[str], str]:
    k8s, slurm = await h.cluster.node(NODE), await h.scheduler.node(NODE)
    return k8s.unschedulable, sorted(slurm.states), slurm.reason


async def test_a_failed_reset_climbs_to_reboot_by_itself_in_auto(tmp_path: Path) -> None:
    async with harness(tmp_path, "auto") as h:
        incident = await h.alert(NODE, RESET)
        done = await h.until_ended(incident)
        assert done.state.value == "resolved", await h.timeline(incident)
        assert done.playbook == "reboot-node"
        [climbed] = await h.events(incident, "climbed")
        assert climbed.data["from"] == "reset-gpu" and climbed.data["to"] == "reboot-node"
        assert "validation Job failed" in climbed.detail
        calls = h.calls()
        assert calls[("reset_gpu", NODE)] == 1 and calls[("reboot", NODE)] == 1
        assert calls[("cordon", NODE)] == 1 and calls[("slurm_down", NODE)] == 1  # taken out once
        assert h.cluster.runs == [False, True]
        # Each rung's validation is its own run at the far side (its own Job), named by the rung.
        assert h.cluster.rungs == [(NODE, "reset-gpu"), (NODE, "reboot-node")]
        planned = [e.detail for e in await h.events(incident, "planned")]
        assert planned[0].startswith("reset-gpu")
        ledger = {
            outcome: h.sample(
                "pitcrew_trust_retests_total", playbook=playbook, fault_class=fc, outcome=outcome
            )
            for playbook, fc, outcome in [
                ("reset-gpu", done.plan.decisive.fault_class, "climbed"),  # type: ignore[union-attr]
                ("reboot-node", done.plan.decisive.fault_class, "passed"),  # type: ignore[union-attr]
            ]
        }
        assert ledger == {"climbed": 1, "passed": 1}


async def test_one_catalog_override_reboots_xid79_first_and_climbs_to_replace(tmp_path: Path) -> None:
    override = {"79": {"playbook": "reboot-then-replace"}}
    async with EngineHarness(tmp_path, mode="auto", catalog=override, cluster=Validating) as h:
        incident = await h.alert(NODE, "xid79-firing.json")
        done = await h.until_ended(incident)
        assert done.state.value == "resolved", await h.timeline(incident)
        assert done.playbook == "replace-node"
        [climbed] = await h.events(incident, "climbed")
        assert climbed.data["from"] == "reboot-then-replace" and climbed.data["to"] == "replace-node"
        assert "validation Job failed" in climbed.detail
        calls = h.calls()
        assert calls[("reboot", NODE)] == 1 and calls[("replace", NODE)] == 1
        assert calls[("slurm_down", NODE)] == 1 and calls[("cordon", NODE)] == 1  # taken out once
        # The replacement is validated in its own rung's name, not read off the reboot's failed one.
        assert [rung for _, rung in h.cluster.rungs] == ["reboot-then-replace", "replace-node"]
        fault_class = done.plan.decisive.fault_class  # type: ignore[union-attr]
        climbed_count = h.sample(
            "pitcrew_trust_retests_total",
            playbook="reboot-then-replace",
            fault_class=fault_class,
            outcome="climbed",
        )
        assert climbed_count == 1


async def test_the_climb_asks_again_in_approve_mode(tmp_path: Path) -> None:
    async with harness(tmp_path, "approve") as h:
        incident = await h.alert(NODE, RESET)
        await h.until_state(incident, "awaiting_approval")
        assert (await h.commands.approve(incident, "alice")).ok
        await h.until_event(incident, "climbed")
        await h.until_state(incident, "awaiting_approval")
        asked = await h.events(incident, "approval_requested")
        assert len(asked) == 2
        assert h.calls()[("reboot", NODE)] == 0  # nothing of the new rung before its approval
        assert (await h.commands.reject(incident, "alice")).ok
        done = await h.until_ended(incident)
        assert done.state.value == "suppressed" and done.playbook == "reboot-node"
        assert h.calls()[("reboot", NODE)] == 0


async def test_without_a_next_rung_a_failed_validation_goes_to_humans(tmp_path: Path) -> None:
    async with harness(tmp_path, "auto", playbooks=None) as h:
        incident = await h.alert(NODE, RESET)
        done = await h.until_ended(incident)
        assert done.state.value == "failed" and done.playbook == "reset-gpu"
        assert not await h.events(incident, "climbed")
        assert h.calls()[("reboot", NODE)] == 0


def test_a_ladder_must_name_playbooks_and_never_circle() -> None:
    steps = {"steps": ["notify", "close"]}
    bad = PlaybookSet(
        playbooks={
            "a": Playbook.model_validate({**steps, "next": "b"}),
            "b": Playbook.model_validate({**steps, "next": "a"}),
            "c": Playbook.model_validate({**steps, "next": "nowhere"}),
        }
    )
    problems = bad.problems(REGISTRY)
    assert "playbooks.c: next rung 'nowhere' is not a playbook" in problems
    assert any("climbs in a circle (a → b → a)" in p for p in problems), problems


def test_a_rung_that_takes_a_node_climbs_only_to_one_that_gives_it_back() -> None:
    taking = ["notify", "slurm_down", "capacity", "cordon", "drain", "reboot", "wait_ready"]
    back = ["give_back", "slurm_resume", "close"]
    ladder = PlaybookSet(
        playbooks={
            "borrow-then-ask": Playbook.model_validate({"steps": [*taking, *back], "next": "ask"}),
            "borrow-then-replace": Playbook.model_validate({"steps": [*taking, *back], "next": "replace"}),
            "ask": Playbook.model_validate({"steps": ["notify", "close"]}),
            "replace": Playbook.model_validate(
                {"steps": ["notify", "slurm_down", "cordon", "drain", "replace", "wait_ready", *back]}
            ),
        }
    )
    lent = [p for p in ladder.problems(REGISTRY) if "give_back" in p]
    assert lent == [
        "playbooks.borrow-then-ask: takes a node from a pool (capacity) and climbs to 'ask', which has no"
        " give_back: after a climb the node taken would stay lent until a rollback"
    ]


# ------------------------------------------------------------ the fault back after the return
async def test_the_fault_back_after_the_return_climbs_to_the_next_rung(tmp_path: Path) -> None:
    async with EngineHarness(tmp_path, mode="auto", playbooks=WATCHED) as h:
        incident = await h.alert(NODE, RESET)
        await h.until_event(incident, "return_watch")
        assert (await h.incident(incident)).state.value == "verifying"
        assert h.calls()[("slurm_resume", NODE)] == 1  # the node is back in service
        await h.time.advance(600)
        await fault_again(h, incident)
        # Signalled by this replica's intake: the watch ends at once, not at its next poll.
        assert await h.run_until(lambda: _climbed(h, incident), about=incident) == 0
        done = await h.until_ended(incident)
        assert done.state.value == "resolved", await h.timeline(incident)
        assert done.playbook == "reboot-node"
        [climbed] = await h.events(incident, "climbed")
        assert climbed.data["fault_back"] is True and climbed.step == "slurm_resume"
        assert climbed.detail == (
            "reset-gpu → reboot-node: xid48@gpu0 fired again 10m after slurm_resume returned the node"
        )
        calls = h.calls()
        assert calls[("reset_gpu", NODE)] == 1 and calls[("reboot", NODE)] == 1
        # Taken out again by the reboot rung, and returned again.
        assert calls[("slurm_down", NODE)] == 2 and calls[("cordon", NODE)] == 2
        assert calls[("slurm_resume", NODE)] == 2 and calls[("uncordon", NODE)] == 2
        assert await node_state(h) == (False, ["IDLE"], "")
        fault_class = done.plan.decisive.fault_class  # type: ignore[union-attr]
        ledger = {
            (playbook, outcome): h.sample(
                "pitcrew_trust_retests_total", playbook=playbook, fault_class=fault_class, outcome=outcome
            )
            for playbook in ("reset-gpu", "reboot-node")
            for outcome in ("passed", "climbed")
        }
        assert ledger == {
            ("reset-gpu", "passed"): 0,  # its summary never went out: the fault came back first
            ("reset-gpu", "climbed"): 1,
            ("reboot-node", "passed"): 1,
            ("reboot-node", "climbed"): 0,
        }
        # Every step of the reset rung was superseded: nothing of it carries over after the return.
        superseded = {e.step for e in await h.events(incident, "step_superseded")}
        assert {"slurm_down", "cordon", "reset_gpu", "slurm_resume", "return_watch"} <= superseded


async def test_a_fault_back_filed_by_another_replica_is_seen_at_the_next_poll(tmp_path: Path) -> None:
    async with EngineHarness(tmp_path, mode="auto", playbooks=WATCHED) as h:
        incident = await h.alert(NODE, RESET)
        await h.until_event(incident, "return_watch")
        await h.time.advance(60)
        body = delivery(RESET, node=NODE, starts=h.time.now())
        # Stored as another replica's webhook stores it: this engine is not signalled.
        await h.store.ingest(to_delivery(parse_webhook(body), h.catalog, LabelRules()), h.time.now())
        took = await h.run_until(lambda: _climbed(h, incident), about=incident)
        assert took <= h.deps.settings.poll_interval.total_seconds()
        done = await h.until_ended(incident)
        assert (done.state.value, done.playbook) == ("resolved", "reboot-node")


async def _climbed(h: EngineHarness, incident: str) -> bool:
    return bool(await h.events(incident, "climbed"))


async def test_the_climb_after_the_return_asks_again_in_approve_mode(tmp_path: Path) -> None:
    async with EngineHarness(tmp_path, mode="approve", playbooks=WATCHED) as h:
        incident = await h.alert(NODE, RESET)
        await h.until_state(incident, "awaiting_approval")
        assert (await h.commands.approve(incident, "alice")).ok
        await h.until_event(incident, "return_watch")
        await h.time.advance(60)
        await fault_again(h, incident)
        await h.until_event(incident, "climbed")
        await h.until_state(incident, "awaiting_approval")
        assert len(await h.events(incident, "approval_requested")) == 2
        await h.time.advance(600)
        assert h.calls()[("reboot", NODE)] == 0 and h.calls()[("slurm_down", NODE)] == 1
        assert (await h.commands.approve(incident, "alice")).ok
        done = await h.until_ended(incident)
        assert (done.state.value, done.playbook) == ("resolved", "reboot-node")
        assert h.calls()[("reboot", NODE)] == 1


async def test_the_fault_firing_while_the_node_is_out_is_not_its_return(tmp_path: Path) -> None:
    async with EngineHarness(tmp_path, mode="auto", playbooks=WATCHED) as h:
        h.cluster.script("reset_gpu", Slow(300))
        incident = await h.alert(NODE, RESET)
        await h.run_until(lambda: h.cluster.calls["reset_gpu"] > 0)
        await h.time.advance(60)
        await fault_again(h, incident)  # a flap while the node is out: the fault under repair
        done = await h.until_ended(incident)
        assert (done.state.value, done.playbook) == ("resolved", "reset-gpu")
        assert not await h.events(incident, "climbed")
        assert h.calls()[("reboot", NODE)] == 0


async def test_with_no_fault_back_the_incident_closes_when_the_window_has_passed(tmp_path: Path) -> None:
    async with EngineHarness(tmp_path, mode="auto", playbooks=WATCHED) as h:
        incident = await h.alert(NODE, RESET)
        watch = await h.until_event(incident, "return_watch")
        assert "open until" in watch.detail and "climbs to reboot-node" in watch.detail
        returned = (await h.steps(incident))["slurm_resume"].ended_at
        done = await h.until_ended(incident)
        assert (done.state.value, done.playbook) == ("resolved", "reset-gpu")
        [closed] = [e for e in await h.events(incident, "state") if e.outcome == "resolved"]
        assert returned is not None and (closed.at - returned).total_seconds() >= WINDOW
        over = (await h.events(incident, "return_watch"))[-1]
        assert (over.outcome, over.detail) == ("ok", "the fault did not come back in 30m")
        assert (await h.steps(incident))["return_watch"].status == "ok"
        assert not await h.events(incident, "climbed")
        assert (
            h.sample(
                "pitcrew_trust_retests_total",
                playbook="reset-gpu",
                fault_class=done.plan.decisive.fault_class,  # type: ignore[union-attr]
                outcome="passed",
            )
            == 1
        )


async def test_a_guard_refusing_the_climb_hands_the_incident_to_humans(tmp_path: Path) -> None:
    async with EngineHarness(tmp_path, mode="auto", playbooks=WATCHED) as h:
        incident = await h.alert(NODE, RESET)
        await h.until_event(incident, "return_watch")
        assert (await h.commands.pause("bob", "maintenance")).ok
        await h.time.advance(60)
        await fault_again(h, incident)
        done = await h.until_ended(incident)
        assert (done.state.value, done.playbook) == ("failed", "reset-gpu")
        [blocked] = await h.events(incident, "climb_blocked")
        assert blocked.detail.startswith("reset-gpu → reboot-node refused:") and "paused" in blocked.detail
        assert done.outcome is not None and done.outcome.startswith("the fault came back after the repair:")
        [escalation] = h.notices("escalation", incident)
        assert "the fault came back after the repair" in escalation["title"]
        assert h.calls()[("reboot", NODE)] == 0 and h.calls()[("slurm_down", NODE)] == 1


def test_a_return_window_needs_a_next_rung() -> None:
    lone = PlaybookSet(
        playbooks={"a": Playbook.model_validate({"steps": ["notify", "close"], "fault_returns_within": "5m"})}
    )
    assert lone.problems(REGISTRY) == ["playbooks.a: fault_returns_within needs a next rung to climb to"]


# ------------------------------------------------------------------ rollback after a climb
async def test_a_rollback_after_the_fault_came_back_undoes_the_reboot_rung_once(tmp_path: Path) -> None:
    async with EngineHarness(tmp_path, mode="auto", playbooks=WATCHED) as h:
        h.cluster.always("reboot", Slow(3600))
        incident = await h.alert(NODE, RESET)
        await h.until_event(incident, "return_watch")
        await h.time.advance(60)
        await fault_again(h, incident)
        await h.run_until(lambda: h.cluster.calls["reboot"] > 0)
        calls_before = h.calls()
        result = await h.commands.rollback(incident, "alice")
        assert result.ok, result
        assert result.data == {
            "report": [
                "reboot: irreversible — a reboot cannot be undone",
                "drain: irreversible — evicted pods are not brought back; they reschedule once the node is "
                "uncordoned",
                f"cordon: {NODE} uncordoned and untainted",
                f"slurm_down: {NODE} resumed",
            ]
        }
        assert h.calls() - calls_before == Counter({("uncordon", NODE): 1, ("slurm_resume", NODE): 1})
        assert await node_state(h) == (False, ["IDLE"], "")


async def test_a_rollback_after_a_climb_undoes_what_the_earlier_rung_carried_over(tmp_path: Path) -> None:
    to_a_human = {"reset-gpu": {**RESET_THEN_REBOOT["reset-gpu"], "next": "ask-human"}}
    async with harness(tmp_path, "auto", playbooks=to_a_human) as h:
        incident = await h.alert(NODE, RESET)
        await h.until_event(incident, "climbed")
        await h.resolve(incident)
        done = await h.until_ended(incident)
        assert (done.state.value, done.playbook) == ("resolved", "ask-human")
        assert await node_state(h) == (True, ["DOWN", "DRAIN"], f"pitcrew: {incident} XID 48 gpu0")
        result = await h.commands.rollback(incident, "alice")
        assert result.ok, result
        assert result.data == {
            "report": [
                "drain: irreversible — evicted pods are not brought back; they reschedule once the node is "
                "uncordoned",
                f"cordon: {NODE} uncordoned and untainted",
                f"slurm_down: {NODE} resumed",
            ]
        }
        assert await node_state(h) == (False, ["IDLE"], "")
