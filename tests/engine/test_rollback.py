"""Rollback in process: undo, in reverse, only what pitcrew itself did.

Cases (one table row each): after cordon-and-ask the node is exactly as before (uncordon
first, then RESUME: the reverse of the playbook); a cordon and a DOWN someone else set are
left alone; a rollback mid-way through replace-node stops the playbook before the
replacement and reports the drain as irreversible; after replace-node has finished the
replacement and the drain are reported irreversible and nothing is touched; where the
replacement serves a new Slurm node (a DaemonSet-mode Slinky NodeSet), the failed node's record,
its slurmd gone, is never RESUMEd: after the repair, while the new one registers, or before the
replacement has come at all (which Slurm node it serves is not known yet); a node an
operator took over after pitcrew (a DOWN with their reason) keeps their DOWN, and so does a
node another pitcrew incident took (its reason is pitcrew's, not this incident's); a rollback
while an approval is pending has nothing to undo, ends the incident and withdraws the
approval (it can no longer be given).

Twice: a second rollback through the engine undoes nothing again and reaches no far side;
through the commands it is refused and audited, as are rollbacks of a suppressed or unknown
incident; the second rollback keeps the first one's outcome and count; two rollbacks at once
(a double click) undo once, the other is a conflict.
"""

from __future__ import annotations

import asyncio
import functools
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from bot.domain.jobs import SlurmNodeState
from bot.domain.nodemap import SLINKY_HOSTNAME_OVERRIDE
from bot.engine.errors import PermanentError, Reason
from tests.engine.harness import Answer, DaemonSetNodeSet, Effect, EngineHarness, Slow, fleet
from tests.harness.scenarios import fault_delivery, gpu_node

Drive = Callable[[EngineHarness], Awaitable[str]]

INVENTORY = fleet(
    ("gpu-node-02", "gpu-node-04", "gpu-node-05"),
    extra={
        "gpu-node-01": gpu_node("ml-train/a", annotations={"team": "ml"}, labels={"pool": "h100"}),
        "gpu-node-03": gpu_node(
            "ml-train/c", unschedulable=True, slurm_state="DOWN", slurm_reason="ops: fan check"
        ),
    },
)


async def _node(h: EngineHarness, name: str) -> dict[str, Any]:
    """The far side's view of a node, through the ports pitcrew uses."""
    k8s = await h.cluster.node(name)
    slurm = await h.scheduler.node(name)
    return {
        "unschedulable": k8s.unschedulable,
        "taints": sorted(t.key for t in k8s.taints),
        "annotations": dict(k8s.annotations),
        "labels": dict(k8s.labels),
        "slurm": sorted(slurm.states),
        "reason": slurm.reason,
    }


def _cordon_and_ask(node: str, *, then: Callable[[EngineHarness], Awaitable[None]] | None = None) -> Drive:
    async def drive(h: EngineHarness) -> str:
        incident = await h.opens(
            fault_delivery("health-fail", alertname="GpuHealthFail", node=node, starts=h.time.now())
        )
        assert (await h.until_ended(incident)).state.value == "resolved"
        if then is not None:
            await then(h)
        return incident

    return drive


async def _operator_downs_node_01(h: EngineHarness) -> None:
    # A human, straight to Slurm: scontrol's DOWN alone, without the DRAIN pitcrew's carries.
    await h.world.write("slurm_down", node="gpu-node-01", reason="ops: RMA", drain=False)


async def _another_incident_downs_node_01(h: EngineHarness) -> None:
    # pitcrew's own reason, for another incident (a later one, or another pitcrew on the node)
    await h.world.down("gpu-node-01", "pitcrew: pc-99999 XID 79 gpu3")


async def _mid_drain(h: EngineHarness) -> str:
    h.cluster.script("evict", Slow(60))
    incident = await h.alert("gpu-node-02")
    await h.run_until(lambda: h.cluster.calls["evict"] > 0)
    return incident


async def _after_replace_node(h: EngineHarness) -> str:
    incident = await h.alert("gpu-node-02")
    assert (await h.until_ended(incident)).state.value == "resolved"
    return incident


def _until_waiting(for_what: str, *, slurm: Effect | None = None, cluster: Effect | None = None) -> Drive:
    """The incident of gpu-node-02 replaced, its ``wait_ready`` waiting ``for_what``: the far sides'
    answers changed by ``slurm`` (the scheduler's ``node``) and ``cluster`` (its ``successor``)."""

    async def drive(h: EngineHarness) -> str:
        if slurm is not None:
            h.scheduler.always("node", slurm)
        if cluster is not None:
            h.cluster.always("successor", cluster)
        incident = await h.alert("gpu-node-02")

        async def waiting() -> bool:
            return any(for_what in e.detail for e in await h.events(incident, "step_waiting", "wait_ready"))

        await h.run_until(waiting, about=incident)
        return incident

    return drive


def _unknown_to_slurm(name: str) -> Effect:
    """Slurm knows no ``name`` yet: a dynamic node before its slurmd registers (``slurmd -Z``)."""

    def answer(state: SlurmNodeState) -> SlurmNodeState:
        if state.name == name:
            raise PermanentError(f"Invalid node name specified: {name}", reason=Reason.UNKNOWN_NODE)
        return state

    return Answer(answer)


async def _awaiting_approval(h: EngineHarness) -> str:
    incident = await h.alert("gpu-node-02")
    await h.until_state(incident, "awaiting_approval")
    return incident


#: A Slinky DaemonSet-mode NodeSet, each node's Slurm name read from its annotation: the replacement
#: serves a new Slurm node (gpu-node-02-x7b2n), and gpu-node-02's record keeps no slurmd.
NEW_NAME: dict[str, Any] = {
    "cluster": functools.partial(DaemonSetNodeSet, annotated=True),
    "mapping": {"node_mapping": "annotation", "node_mapping_key": SLINKY_HOSTNAME_OVERRIDE},
}
#: The report's first lines once the replacement has started.
REPLACED = (
    "replace: the replacement has already started and cannot be cancelled",
    "drain: irreversible — evicted pods are not brought back; they reschedule once the node is uncordoned",
    "cordon: the node no longer carries pitcrew's annotation; left as is",
)


@dataclass(frozen=True)
class RollbackCase:
    drive: Drive
    node: str
    #: The rollback report, in order.
    report: list[str]
    #: What the rollback itself changed on the far side.
    undone: dict[tuple[str, str], int]
    #: The node afterwards: as it was before the incident (None), or with these values.
    node_after: dict[str, Any] | None = None
    harness: dict[str, Any] = field(default_factory=dict)


ROLLBACKS = {
    "after-cordon-and-ask": RollbackCase(
        _cordon_and_ask("gpu-node-01"),
        "gpu-node-01",
        ["cordon: gpu-node-01 uncordoned and untainted", "slurm_down: gpu-node-01 resumed"],
        {("uncordon", "gpu-node-01"): 1, ("slurm_resume", "gpu-node-01"): 1},
    ),
    "someone-elses-cordon-and-down": RollbackCase(
        _cordon_and_ask("gpu-node-03"),
        "gpu-node-03",
        [
            "cordon: the node was cordoned by someone else; left as is",
            "slurm_down: gpu-node-03 left DOWN (reason 'ops: fan check' is not pitcrew's)",
        ],
        {},
    ),
    "mid-replace-node": RollbackCase(
        _mid_drain,
        "gpu-node-02",
        [
            "drain: irreversible — evicted pods are not brought back; they reschedule once the node is uncordoned",
            "cordon: gpu-node-02 uncordoned and untainted",
            "slurm_down: gpu-node-02 resumed",
        ],
        {("uncordon", "gpu-node-02"): 1, ("slurm_resume", "gpu-node-02"): 1},
    ),
    "after-replace-node": RollbackCase(
        _after_replace_node,
        "gpu-node-02",
        [
            *REPLACED,
            "slurm_down: gpu-node-02 already in service",
        ],
        {},
        node_after={"unschedulable": False, "slurm": ["IDLE"], "reason": ""},
    ),
    # A Slinky DaemonSet-mode NodeSet, each node's Slurm name read from its annotation: the
    # replacement serves gpu-node-02-x7b2n; gpu-node-02's record has no slurmd, and a RESUME would
    # return a ghost.
    "after-replace-node-under-a-new-name": RollbackCase(
        _after_replace_node,
        "gpu-node-02",
        [
            *REPLACED,
            "slurm_down: gpu-node-02 left as it is: the node's replacement serves gpu-node-02-x7b2n, "
            "not gpu-node-02",
        ],
        {},
        node_after={"unschedulable": False, "slurm": ["DOWN", "DRAIN", "NOT_RESPONDING"]},
        harness=NEW_NAME,
    ),
    # The same, rolled back while ``wait_ready`` waits for the replacement's new Slurm node to
    # register: the old record is as much a ghost as after the repair.
    "while-a-new-slurm-name-registers": RollbackCase(
        _until_waiting("Slurm does not know it", slurm=_unknown_to_slurm("gpu-node-02-x7b2n")),
        "gpu-node-02",
        [
            *REPLACED,
            "slurm_down: gpu-node-02 left as it is: the node's replacement serves gpu-node-02-x7b2n, "
            "not gpu-node-02",
        ],
        {},
        node_after={"unschedulable": False, "slurm": ["DOWN", "DRAIN", "NOT_RESPONDING"]},
        harness=NEW_NAME,
    ),
    # ... and before the replacement has even come: which Slurm node it will serve is not known,
    # and a RESUME of the old record may return a ghost.
    "before-a-replacement-under-a-new-name-comes": RollbackCase(
        _until_waiting("has registered yet", cluster=Answer(lambda _: None)),
        "gpu-node-02",
        [
            *REPLACED,
            "slurm_down: gpu-node-02 left as it is: the node was replaced, and the Slurm node(s) its "
            "replacement serves are not known yet (node_mapping annotation reads them from the node, "
            "and a new node may serve a new name); resume gpu-node-02 by hand if its slurmd comes back",
        ],
        {},
        node_after={"unschedulable": False, "slurm": ["DOWN", "DRAIN", "NOT_RESPONDING"]},
        harness=NEW_NAME,
    ),
    "operator-took-the-node-after": RollbackCase(
        _cordon_and_ask("gpu-node-01", then=_operator_downs_node_01),
        "gpu-node-01",
        [
            "cordon: gpu-node-01 uncordoned and untainted",
            "slurm_down: gpu-node-01 left DOWN (reason 'ops: RMA' is not pitcrew's)",
        ],
        {("uncordon", "gpu-node-01"): 1},
        node_after={"unschedulable": False, "slurm": ["DOWN"], "reason": "ops: RMA"},
    ),
    "another-incident-took-the-node-after": RollbackCase(
        _cordon_and_ask("gpu-node-01", then=_another_incident_downs_node_01),
        "gpu-node-01",
        [
            "cordon: gpu-node-01 uncordoned and untainted",
            "slurm_down: gpu-node-01 left DOWN/DRAIN (reason 'pitcrew: pc-99999 XID 79 gpu3' belongs to pitcrew "
            "incident pc-99999)",
        ],
        {("uncordon", "gpu-node-01"): 1},
        node_after={
            "unschedulable": False,
            "slurm": ["DOWN", "DRAIN"],
            "reason": "pitcrew: pc-99999 XID 79 gpu3",
        },
    ),
    "while-awaiting-approval": RollbackCase(
        _awaiting_approval, "gpu-node-02", [], {}, harness={"mode": "approve"}
    ),
}


@pytest.mark.parametrize("case", ROLLBACKS.values(), ids=ROLLBACKS.keys())
async def test_rollback(case: RollbackCase, tmp_path: Path) -> None:
    async with EngineHarness(tmp_path, inventory=INVENTORY, **case.harness) as h:
        before = await _node(h, case.node)
        incident = await case.drive(h)
        calls_before = h.calls()
        result = await h.commands.rollback(incident, "alice")
        assert result.ok, result
        assert result.data == {"report": case.report}
        await h.time.advance(3600)  # the playbook does not go on
        assert h.calls() - calls_before == Counter(case.undone)
        after = await _node(h, case.node)
        expected = before if case.node_after is None else {**after, **case.node_after}
        assert after == expected
        done = await h.incident(incident)
        assert (done.state.value, done.outcome) == ("rolled_back", "rolled back by alice")
        undone = [e.step for e in await h.events(incident, "step_undone")]
        assert undone == [line.split(":")[0] for line in case.report]
        assert all(e.actor == "alice" for e in await h.events(incident, "step_undone"))
        [notice] = h.notices("rollback", incident)
        assert notice["lines"] == (case.report or ["nothing to undo"])
        assert (
            h.sample("pitcrew_incidents_closed_total", state="rolled_back", playbook=done.playbook or "") == 1
        )


# -------------------------------------------------------------------------- twice
async def test_a_second_rollback_through_the_engine_undoes_nothing(tmp_path: Path) -> None:
    async with EngineHarness(tmp_path, inventory=INVENTORY) as h:
        incident = await _cordon_and_ask("gpu-node-01")(h)
        assert (await h.commands.rollback(incident, "alice")).ok
        calls, steps = h.calls(), await h.steps(incident)
        await h.engine.request_rollback(await h.incident(incident), "bob")
        assert h.calls() == calls  # nothing reached the far side again
        again = await h.steps(incident)
        assert {n: r for n, r in again.items() if n != "rollback"} == {
            n: r for n, r in steps.items() if n != "rollback"
        }
        assert again["rollback"].result["report"] == []
        assert len(await h.events(incident, "step_undone")) == 2  # from the first rollback only
        assert h.notices("rollback", incident)[-1]["lines"] == ["nothing to undo"]


async def test_a_second_rollback_leaves_the_first_ones_outcome_and_count(tmp_path: Path) -> None:
    async with EngineHarness(tmp_path, inventory=INVENTORY) as h:
        incident = await _cordon_and_ask("gpu-node-01")(h)
        assert (await h.commands.rollback(incident, "alice")).ok
        await h.engine.request_rollback(await h.incident(incident), "bob")
        assert (await h.incident(incident)).outcome == "rolled back by alice"
        assert h.sample("pitcrew_incidents_closed_total", state="rolled_back", playbook="cordon-and-ask") == 1


async def test_two_rollbacks_at_once_undo_once(tmp_path: Path) -> None:
    async with EngineHarness(tmp_path, inventory=INVENTORY) as h:
        incident = await _cordon_and_ask("gpu-node-01")(h)
        calls = h.calls()
        first, second = await asyncio.gather(
            h.commands.rollback(incident, "alice"), h.commands.rollback(incident, "bob")
        )
        assert h.calls() - calls == Counter(
            {("uncordon", "gpu-node-01"): 1, ("slurm_resume", "gpu-node-01"): 1}
        )
        assert first.data == {
            "report": ["cordon: gpu-node-01 uncordoned and untainted", "slurm_down: gpu-node-01 resumed"]
        }
        assert second.status == "conflict" or second.data == first.data
        assert len(await h.events(incident, "step_undone")) == 2
        assert len(h.notices("rollback", incident)) == 1


async def test_an_approval_left_by_a_rollback_cannot_be_given(tmp_path: Path) -> None:
    async with EngineHarness(tmp_path, inventory=INVENTORY, mode="approve") as h:
        incident = await _awaiting_approval(h)
        assert (await h.commands.rollback(incident, "alice")).ok
        result = await h.commands.approve(incident, "alice")
        await h.time.advance(600)
        assert not h.calls()  # holds today: the rolled-back incident never runs
        assert result.status == "conflict", result
        assert h.sample("pitcrew_approvals_total", outcome="approved") == 0


REFUSED = {
    "twice": ("rolled_back", "conflict"),
    "suppressed-incident": ("suppressed", "conflict"),
    "unknown-incident": (None, "not_found"),
}


@pytest.mark.parametrize(("state", "status"), REFUSED.values(), ids=REFUSED.keys())
async def test_rollback_refused(state: str | None, status: str, tmp_path: Path) -> None:
    async with EngineHarness(tmp_path, inventory=INVENTORY) as h:
        incident = "pc-99999"
        if state == "rolled_back":
            incident = await _cordon_and_ask("gpu-node-01")(h)
            assert (await h.commands.rollback(incident, "alice")).ok
        elif state == "suppressed":
            await h.commands.pause("oncall")
            incident = await h.alert("gpu-node-02")
            await h.until_state(incident, "suppressed")
        calls = h.calls()
        result = await h.commands.rollback(incident, "mallory")
        assert result.status == status
        assert h.calls() == calls
        if state is not None:
            assert (await h.incident(incident)).state.value == state
            [refused] = await h.events(incident, "rollback_refused")
            assert (refused.actor, refused.outcome) == ("mallory", "conflict")
