"""Guards, as the running engine applies them (in process, fake time).

Cases (one table row each): pause suppresses a new plan, with the reason and a notice; the
opt-out label means hands off; the breaker trips on max_nodes and on max_fraction of the
fleet, with one summary notice; an open breaker suppresses quietly (no notice per
incident); a second remediation inside the cooldown is refused, one after it is not; the
per-node attempts cap; an alert older than the stale cutoff after a breaker reset is
skipped; a playbook that touches nothing passes every guard even while paused.

Pause on a running incident: it is held before its next mutating step, returning the node
(RESUME, uncordon) included: nothing more reaches the far side while paused, and it goes on
after resume; a pause between two calls of one step (two evictions) holds the next call and
the step goes on after resume with a fresh deadline. A rollback under way is held by a pause
set after it started (the command answers "held"), and so is a rollback resumed after a
crash while paused; both finish after resume. A rollback forced while paused is not held. Observe mode: every mutating step of the playbook is
recorded as skipped with what it would have done, nothing reaches the far side.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from bot.engine.errors import PermanentError, Reason, TransientError
from bot.engine.registry import Track
from bot.engine.steps import REGISTRY
from tests.engine.harness import EngineHarness, Fail, Scripted, Slow, fleet
from tests.harness.scenarios import delivery, fault_delivery, gpu_node

Setup = Callable[[EngineHarness], Awaitable[str]]


async def _paused(h: EngineHarness) -> str:
    await h.commands.pause("oncall", "drill")
    return await h.alert("gpu-node-02")


async def _one_alert(h: EngineHarness) -> str:
    return await h.alert("gpu-node-02")


async def _two_nodes(h: EngineHarness) -> str:
    await h.alert("gpu-node-01")
    return await h.alert("gpu-node-02")


async def _three_nodes(h: EngineHarness) -> str:
    await h.alert("gpu-node-01")
    await h.alert("gpu-node-02")
    return await h.alert("gpu-node-03")


def _again_after(minutes: int, times: int = 1) -> Setup:
    async def setup(h: EngineHarness) -> str:
        for _ in range(times):
            first = await h.alert("gpu-node-02")
            assert (await h.until_ended(first)).state.value == "resolved"
            await h.time.advance(minutes * 60)
        return await h.alert("gpu-node-02")

    return setup


async def _stale(h: EngineHarness) -> str:
    await h.commands.reset_breaker("oncall")
    await h.time.advance(60)
    return await h.alert("gpu-node-02", starts=h.time.now() - timedelta(minutes=20))


async def _hands_off_while_paused(h: EngineHarness) -> str:
    await h.commands.pause("oncall")
    return await h.alert("gpu-node-02", fixture="exporter-down-firing.json")


@dataclass(frozen=True)
class GuardCase:
    setup: Setup
    #: States the judged incident settles in (terminal, or waiting).
    until: tuple[str, ...]
    #: Guards that said no (empty: let through).
    blocking: frozenset[str]
    #: Words in the outcome (suppressed) or in the guards' decisions (let through).
    words: str
    notices: dict[str, int] = field(default_factory=dict)
    harness: dict[str, Any] = field(default_factory=dict)


GUARDS = {
    "pause": GuardCase(
        _paused,
        ("suppressed",),
        frozenset({"pause"}),
        "pitcrew is paused by oncall",
        {"suppressed": 1, "incident": 0},
    ),
    "opt-out-label": GuardCase(
        _one_alert,
        ("suppressed",),
        frozenset({"opt-out"}),
        "carries pitcrew.dev/opt-out=true: hands off",
        {"suppressed": 1},
        {
            "inventory": fleet(
                ("gpu-node-01",), extra={"gpu-node-02": gpu_node(labels={"pitcrew.dev/opt-out": "true"})}
            )
        },
    ),
    "breaker-max-nodes": GuardCase(
        _two_nodes,
        ("suppressed",),
        frozenset({"breaker"}),
        "more than max_nodes 1",
        {"breaker": 1, "suppressed": 0},
        {"breaker": {"max_nodes": 1}},
    ),
    "breaker-max-fraction": GuardCase(
        _two_nodes,
        ("suppressed",),
        frozenset({"breaker"}),
        "2 of 10 nodes (20.0%) would be out of service or under remediation",
        {"breaker": 1},
        {
            "breaker": {"max_nodes": 10, "max_fraction": 0.1},
            "inventory": fleet(tuple(f"gpu-node-{n:02d}" for n in range(1, 11))),
        },
    ),
    "breaker-open-is-quiet": GuardCase(
        _three_nodes,
        ("suppressed",),
        frozenset({"breaker"}),
        "circuit breaker is open",
        {"breaker": 1, "suppressed": 0},
        {"breaker": {"max_nodes": 1}},
    ),
    "cooldown": GuardCase(
        _again_after(minutes=10),
        ("suppressed",),
        frozenset({"cooldown"}),
        "inside the 30m cooldown",
        {"suppressed": 1},
        {"node": {"cooldown": timedelta(minutes=30)}},
    ),
    "cooldown-passed": GuardCase(
        _again_after(minutes=40),
        ("resolved",),
        frozenset(),
        "no remediation on this node in the last 30m",
        {"suppressed": 0, "summary": 2},
        {"node": {"cooldown": timedelta(minutes=30)}},
    ),
    "attempts-cap": GuardCase(
        _again_after(minutes=1, times=2),
        ("suppressed",),
        frozenset({"attempts"}),
        "2 remediations on this node in the last 1d (cap 2)",
        {"suppressed": 1, "summary": 2},
        {"node": {"max_attempts": 2}},
    ),
    "stale-after-breaker-reset": GuardCase(
        _stale,
        ("suppressed",),
        frozenset({"stale"}),
        "stale alert: it started 20m ago, before the breaker reset",
        {"suppressed": 1},
    ),
    "hands-off-passes-while-paused": GuardCase(
        _hands_off_while_paused,
        ("guarded",),  # and watching: it closes when the alert resolves
        frozenset(),
        "notify-only does not touch the node; no guard applies",
        {"incident": 1, "suppressed": 0},
    ),
}


@pytest.mark.parametrize("case", GUARDS.values(), ids=GUARDS.keys())
async def test_guard(case: GuardCase, tmp_path: Path) -> None:
    async with EngineHarness(tmp_path, **case.harness) as h:
        judged = await case.setup(h)
        incident = await h.until_state(judged, *case.until)
        guards = (await h.events(judged, "guards"))[-1]
        blocking = {d["guard"] for d in guards.data["decisions"] if not d["ok"]}
        assert blocking == case.blocking
        said = " / ".join(d["words"] for d in guards.data["decisions"])
        assert case.words in (incident.outcome if case.blocking else said), (incident.outcome, said)
        if case.blocking:
            assert not await h.steps(judged)  # not one step ran
            assert not h.changes_for(judged)  # nothing reached the far side for it
            for guard in case.blocking:
                assert h.sample("pitcrew_guard_blocks_total", guard=guard) >= 1
        for kind, count in case.notices.items():
            assert len(h.notices(kind)) == count, (kind, h.notices())


# ------------------------------------------------------------- pause mid-way
PAUSE_POINTS = {
    # the call made slow, the step held next (returning the node is a change too: held)
    "during-slurm_down": ("scheduler", "down", "cordon"),
    "during-cordon": ("cluster", "cordon", "drain"),
    # after the replacement, returning capacity to a spare pool is the next change (then RESUME)
    "during-replace": ("cluster", "replace", "give_back"),
}


@pytest.mark.parametrize(("port", "call", "held_at"), PAUSE_POINTS.values(), ids=PAUSE_POINTS.keys())
async def test_pause_holds_the_next_mutating_step(port: str, call: str, held_at: str, tmp_path: Path) -> None:
    async with EngineHarness(tmp_path) as h:
        getattr(h, port).script(call, Slow(20))
        incident = await h.alert("gpu-node-02")
        await h.run_until(lambda: getattr(h, port).calls[call] > 0)
        await h.commands.pause("oncall", "maintenance")
        held = await h.until_event(incident, "held")
        assert held.step == held_at and held.detail == "paused by oncall"
        frozen = h.calls()
        await h.time.advance(3600)  # an hour of virtual time: nothing more happens
        assert h.calls() == frozen
        assert (await h.incident(incident)).state.value in {"running", "verifying"}
        assert held_at not in await h.steps(incident)
        await h.commands.resume("oncall")
        done = await h.until_ended(incident)
        assert done.state.value == "resolved"
        assert h.calls()[("replace", "gpu-node-02")] == 1
        assert h.calls()[("slurm_down", "gpu-node-02")] == 1
        assert h.calls()[("slurm_resume", "gpu-node-02")] == 1


async def test_pause_holds_the_next_call_inside_a_step(tmp_path: Path) -> None:
    """A pause set while a step is between two changes (the drain, between two evictions) holds
    the next one; after resume the step goes on with a fresh deadline and evicts each pod once."""
    two_pods = fleet(("gpu-node-01",), extra={"gpu-node-02": gpu_node("ml-train/a", "ml-train/b")})
    async with EngineHarness(tmp_path, inventory=two_pods) as h:
        h.cluster.script("evict", Slow(20))
        incident = await h.alert("gpu-node-02")
        await h.run_until(lambda: h.cluster.calls["evict"] > 0)
        await h.commands.pause("oncall", "maintenance")
        held = await h.until_event(incident, "held")
        assert held.step == "drain" and "evict held until resume" in held.detail, held
        assert (await h.steps(incident))["drain"].status == "held"
        frozen = h.calls()
        await h.time.advance(3600)  # longer than the drain's 15 min budget: it must not fail for it
        assert h.calls() == frozen and sum(n for (op, _), n in frozen.items() if op == "evict") == 1
        await h.commands.resume("oncall")
        done = await h.until_ended(incident)
        assert done.state.value == "resolved", done.outcome
        assert h.calls()[("evict", "ml-train/a")] == 1 and h.calls()[("evict", "ml-train/b")] == 1


def _rollback_with_slow_uncordon(h: EngineHarness, incident: str) -> asyncio.Task[Any]:
    """The rollback of a cordon-and-ask incident, its first change (uncordon) slow to answer."""
    h.cluster.script("uncordon", Slow(20))
    return asyncio.ensure_future(h.commands.rollback(incident, "alice"))


async def _cordoned_and_down(h: EngineHarness) -> str:
    incident = await h.opens(
        fault_delivery("health-fail", alertname="GpuHealthFail", node="gpu-node-02", starts=h.time.now())
    )
    assert (await h.until_ended(incident)).state.value == "resolved"
    return incident


async def test_a_rollback_under_way_is_held_by_a_pause_set_after_it_started(tmp_path: Path) -> None:
    async with EngineHarness(tmp_path) as h:
        incident = await _cordoned_and_down(h)
        rollback = _rollback_with_slow_uncordon(h, incident)
        await h.run_until(lambda: h.cluster.calls["uncordon"] > 0)
        await h.commands.pause("oncall", "maintenance")
        await h.run_until(rollback.done)
        answer = rollback.result()
        assert answer.ok and answer.data == {"report": [], "held": True}, answer
        await h.time.advance(3600)
        assert h.calls()[("slurm_resume", "gpu-node-02")] == 0  # held, for as long as the pause lasts
        assert (await h.incident(incident)).state.value == "resolved"  # not yet rolled back
        assert await h.events(incident, "rollback_held")
        await h.commands.resume("oncall")
        done = await h.until_state(incident, "rolled_back")
        assert done.outcome == "rolled back by alice"
        assert h.calls()[("slurm_resume", "gpu-node-02")] == 1 and h.calls()[("uncordon", "gpu-node-02")] == 1
        [notice] = h.notices("rollback", incident)
        assert notice["lines"] == [
            "cordon: gpu-node-02 uncordoned and untainted",
            "slurm_down: gpu-node-02 resumed",
        ]


async def _mid_drain(h: EngineHarness) -> str:
    h.cluster.script("evict", Slow(60))
    incident = await h.alert("gpu-node-02")
    await h.run_until(lambda: h.cluster.calls["evict"] > 0)
    return incident


@pytest.mark.parametrize("drive", [_cordoned_and_down, _mid_drain], ids=["closed", "mid-drain"])
async def test_a_rollback_resumed_after_a_crash_while_paused_changes_nothing(
    drive: Callable[[EngineHarness], Awaitable[str]], tmp_path: Path
) -> None:
    async with EngineHarness(tmp_path) as h:
        incident = await drive(h)
        state = (await h.incident(incident)).state.value
        rollback = _rollback_with_slow_uncordon(h, incident)
        await h.run_until(lambda: h.cluster.calls["uncordon"] > 0)
        await h.commands.pause("oncall", "maintenance")
        rollback.cancel()  # SIGKILL: the command dies with pitcrew
        await asyncio.gather(rollback, return_exceptions=True)
        await h.restart()
        await h.time.advance(3600)
        assert h.calls()[("slurm_resume", "gpu-node-02")] == 0
        assert (await h.incident(incident)).state.value == state
        await h.commands.resume("oncall")
        done = await h.until_state(incident, "rolled_back")
        assert done.outcome == "rolled back by alice"
        assert h.calls()[("slurm_resume", "gpu-node-02")] == 1


async def test_a_forced_rollback_is_not_held(tmp_path: Path) -> None:
    async with EngineHarness(tmp_path) as h:
        incident = await _cordoned_and_down(h)
        await h.commands.pause("oncall", "maintenance")
        answer = await h.commands.rollback(incident, "alice", force=True)
        assert answer.ok and answer.data == {
            "report": ["cordon: gpu-node-02 uncordoned and untainted", "slurm_down: gpu-node-02 resumed"]
        }
        assert (await h.incident(incident)).state.value == "rolled_back"


# ------------------------------------------------------------- observe mode
OBSERVED = {
    "replace-node": ("xid79-firing.json", None, "DOWN"),
    "reset-gpu": ("xid48-then-xid154-1-after-xid48.json", None, "DOWN"),
    "cordon-and-ask": ("row-remap-failure-firing.json", "health-fail", "DRAIN"),
}


@pytest.mark.parametrize(("fixture", "fault", "action"), OBSERVED.values(), ids=OBSERVED.keys())
async def test_observe_mode_records_what_it_would_do(
    fixture: str, fault: str | None, action: str, tmp_path: Path
) -> None:
    async with EngineHarness(tmp_path, mode="observe") as h:
        now = h.time.now()
        body = (
            fault_delivery(fault, alertname="GpuHealthFail", node="gpu-node-02", fixture=fixture, starts=now)
            if fault
            else delivery(fixture, node="gpu-node-02", starts=now)
        )
        incident = await h.opens(body)
        await h.until_event(incident, "watching")
        await h.time.advance(600)  # observe incidents stay open while the fault fires
        record = await h.incident(incident)
        assert not record.state.terminal
        assert record.plan is not None and record.plan.mode.value == "observe"
        steps = await h.steps(incident)
        mutating = [s for s in record.plan.steps if REGISTRY[s].mutating]
        assert len(mutating) >= 2, record.plan.steps
        for step in mutating:
            assert steps[step].status == "skipped"
            assert steps[step].result["would"] == REGISTRY[step].would.format(action=action)
        assert steps["notify"].status == "ok" and len(h.notices("incident")) == 1
        assert not h.calls()
        await h.resolve(incident)
        done = await h.until_ended(incident)
        assert done.state.value == "suppressed"
        assert done.outcome == f"observe mode: {record.playbook} was not run"
        assert not h.calls()


async def test_observe_mode_records_the_steps_it_skips_in_one_write(tmp_path: Path) -> None:
    """The node track's run of skipped steps, and the job track's steps it passes, are one write with
    the cursor past them, where each was a move of its own (the incident and its steps read, the
    steps again, the skip, the cursor): the same records and events, in the plan's order, and the
    tracks go on from where they stand."""
    wrapped: list[Scripted] = []

    def counted(store: Any, time: Any) -> Any:
        wrapped.append(Scripted(store, time))
        return wrapped[0]

    async with EngineHarness(tmp_path, mode="observe", store=counted) as h:
        incident = await h.opens(delivery("xid79-firing.json", node="gpu-node-02", starts=h.time.now()))
        await h.until_event(incident, "watching")
        record = await h.incident(incident)
        assert record.plan is not None
        node_track = [s for s in record.plan.steps if REGISTRY[s].track is Track.NODE]
        skipped = [s for s in node_track if not REGISTRY[s].in_observe]
        assert len(skipped) >= 6, record.plan.steps
        calls = wrapped[0].calls
        steps = await h.steps(incident)
        # One write for the run, the job track's steps among it (no job track has started to run
        # them); the cursor moved with each step's end, never on its own.
        assert calls["steps_skipped"] == 1 and calls["advance"] == 0, calls
        job_track = [s for s in record.plan.steps if REGISTRY[s].track is Track.JOB]
        assert job_track and all(steps[s].status == "skipped" for s in job_track)
        events = await h.events(incident, "step_skipped")
        assert [e.step for e in events] == [s for s in record.plan.steps if s in {*skipped, *job_track}]
        assert len({e.at for e in events}) == 1
        assert all(steps[s].status == "skipped" for s in skipped)
        assert record.step_index == record.plan.steps.index("close")
        await h.resolve(incident)
        assert (await h.until_ended(incident)).state.value == "suppressed"
        assert not h.calls()


# ------------------------------------------------------------- the allowance
NINE = fleet(tuple(f"gpu-node-0{n}" for n in range(1, 10)))


async def test_an_incident_that_changed_nothing_releases_its_place(tmp_path: Path) -> None:
    """An alert for a name no far side knows fails before any change; the next real fault on a
    9-node fleet (default breaker: 5 % of 9 is one node at a time) is remediated, not held."""
    async with EngineHarness(tmp_path, inventory=NINE, breaker={"max_nodes": 3, "max_fraction": 0.05}) as h:
        unknown = await h.alert("gpu-node-08.example.com")
        failed = await h.until_ended(unknown)
        assert failed.state.value == "failed" and "slurm_down" in failed.outcome
        assert not h.changes_for(unknown)  # nothing reached the far side for it
        real = await h.alert("gpu-node-03")
        done = await h.until_ended(real)
        assert done.state.value == "resolved", done.outcome
        assert h.calls()[("replace", "gpu-node-03")] == 1
        assert (await h.commands.status())["breaker"]["open"] is False
        guards = (await h.events(real, "guards"))[-1]
        [breaker] = [d for d in guards.data["decisions"] if d["guard"] == "breaker"]
        assert breaker["ok"] and breaker["words"].startswith(
            "1 of max 3 nodes out of service or under remediation"
        ), breaker


async def test_an_incident_that_changed_something_keeps_its_place(tmp_path: Path) -> None:
    """The other side of the allowance: a failed incident that did take its node out still counts."""
    async with EngineHarness(tmp_path, inventory=NINE, breaker={"max_nodes": 3, "max_fraction": 0.05}) as h:
        h.cluster.always("cordon", Fail(PermanentError("cordon refused", reason=Reason.FORBIDDEN)))
        first = await h.alert("gpu-node-02")
        assert (await h.until_ended(first)).state.value == "failed"
        assert h.calls()[("slurm_down", "gpu-node-02")] == 1
        second = await h.alert("gpu-node-03")
        held = await h.until_ended(second)
        assert held.state.value == "suppressed" and "breaker trips" in held.outcome
        assert not h.changes_for(second)


# ------------------------------------------------------------- the whole fleet
OUT_BY_OTHERS = fleet(
    ("gpu-node-04",),
    extra={
        "gpu-node-01": gpu_node(slurm_state="DRAIN", slurm_reason="admin: bios update"),
        "gpu-node-02": gpu_node(slurm_state="DRAIN", slurm_reason="admin: bios update"),
        "gpu-node-03": gpu_node(slurm_state="DRAIN", slurm_reason="NHC: check_gpu failed"),
    },
)


async def test_nodes_others_took_out_count_toward_the_blast_radius(tmp_path: Path) -> None:
    """3 of 4 nodes already out (2 by an administrator, 1 by Slurm's health check): the fourth is
    not taken, and the breaker opens naming the three and why (default breaker: max 3 nodes)."""
    async with EngineHarness(tmp_path, inventory=OUT_BY_OTHERS, breaker={"max_nodes": 3}) as h:
        incident = await h.alert("gpu-node-04")
        held = await h.until_ended(incident)
        assert held.state.value == "suppressed"
        assert not h.calls()
        said = (
            "3 of 4 nodes already out: 2 by an administrator (gpu-node-01: admin: bios update, gpu-node-02: "
            "admin: bios update), 1 by Slurm's health check (gpu-node-03: NHC: check_gpu failed)"
        )
        assert (
            held.outcome.startswith("breaker trips: 4 nodes would be out of service") and said in held.outcome
        )
        status = await h.commands.status()
        assert status["breaker"]["open"] and said in status["breaker"]["reason"]
        [notice] = h.notices("breaker")
        assert said in notice["lines"][0]


async def test_a_storm_reads_the_fleet_once_per_poll_interval(tmp_path: Path) -> None:
    """Twenty alerts in one poll interval cost one list of Slurm nodes and one of Kubernetes
    nodes, not twenty of each; the next interval reads again."""
    nodes = tuple(f"gpu-node-{n:02d}" for n in range(1, 41))
    async with EngineHarness(tmp_path, inventory=fleet(nodes), breaker={"max_nodes": 50}) as h:
        for node in nodes[:20]:
            await h.alert(node, "exporter-down-firing.json")  # hands off: only admission runs
        await h.run_until(lambda: len(h.notices("incident")) == 20)
        assert (h.scheduler.calls["nodes"], h.cluster.calls["nodes"]) == (1, 1)
        assert h.cluster.calls["count_nodes"] == 0
        await h.time.advance(61)
        await h.alert(nodes[30])
        await h.run_until(lambda: h.scheduler.calls["nodes"] == 2)
        assert h.cluster.calls["nodes"] == 2


async def test_a_far_side_that_cannot_list_its_nodes_is_said_and_not_hammered(tmp_path: Path) -> None:
    """Slurm cannot list its nodes: the decision says so and counts what Kubernetes listed; a
    failed read is kept for the interval like a good one (one read, not one per alert); once
    Slurm answers again, the last good view of each far side stands in for a later failure."""
    async with EngineHarness(tmp_path, inventory=NINE, breaker={"max_nodes": 50}) as h:
        h.scheduler.always("nodes", Fail(TransientError("slurmctld down", reason=Reason.UNAVAILABLE)))
        first = await h.alert("gpu-node-01", "exporter-down-firing.json")
        await h.until_event(first, "guards")
        for node in ("gpu-node-02", "gpu-node-03"):
            await h.alert(node, "exporter-down-firing.json")
        real = await h.alert("gpu-node-04")
        guards = await h.until_event(real, "guards")
        [breaker] = [d for d in guards.data["decisions"] if d["guard"] == "breaker"]
        assert "Slurm nodes unreadable (unavailable): only what was read is counted" in breaker["words"], (
            breaker
        )
        assert h.scheduler.calls["nodes"] == 1 and h.cluster.calls["nodes"] == 1
        await h.world.drain("gpu-node-09", "admin: bios update")
        h.scheduler.always("nodes", None)
        await h.time.advance(61)
        again = await h.alert("gpu-node-05", "exporter-down-firing.json")
        await h.until_event(again, "guards")
        h.scheduler.always("nodes", Fail(TransientError("slurmctld down", reason=Reason.UNAVAILABLE)))
        await h.time.advance(61)
        last = await h.alert("gpu-node-06")
        guards = await h.until_event(last, "guards")
        [breaker] = [d for d in guards.data["decisions"] if d["guard"] == "breaker"]
        assert "gpu-node-09: admin: bios update" in breaker["words"], breaker  # the last good Slurm view
