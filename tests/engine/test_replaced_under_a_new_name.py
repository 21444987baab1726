"""A replacement whose slurmd registers under a new Slurm node name, in virtual time.

With a Slinky NodeSet in DaemonSet scaling mode (``DaemonSetNodeSet``), the Slurm node a node
serves is named after the Kubernetes node; the node Cluster API or Karpenter makes in its place
has a new name, so its slurmd registers a new Slurm node and the failed node's record stays
behind, its slurmd gone. Under ``node_mapping: slinky`` (the operator drains the Slurm node on
pitcrew's cordon) and ``annotation`` on ``hostname-override`` (a site whose controller names each
node's Slurm node; pitcrew takes the node out of Slurm itself).

Cases: ``wait_ready`` waits for the successor's Slurm node (named by pitcrew's node mapping), not
the old one (one Slurm does not know yet, its slurmd not registered, is waited for), and records
it in its result; ``slurm_resume`` never RESUMEs the record left behind
(it stays out with the reason it had), and the timeline and the closing summary say so. A
rollback after such a repair leaves the record alone: ``test_rollback``
(``after-replace-node-under-a-new-name``). A StatefulSet-mode NodeSet (slurm-operator's default)
makes the failed node's replica again on the replacement: the same Slurm node comes back, nothing
is left behind.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from bot.domain.jobs import SlurmNodeState
from bot.domain.nodemap import SLINKY_HOSTNAME_OVERRIDE
from bot.domain.ownership import SLINKY_PRESTOP_REASON
from bot.engine.errors import PermanentError, Reason
from tests.engine.harness import Answer, DaemonSetNodeSet, EngineHarness, StatefulSetNodeSet

NODE = "gpu-node-02"
SUCCESSOR = "gpu-node-02-x7b2n"
OTHER = "gpu-node-04"


#: The mappings that read a node's Slurm nodes from it, with the simulated NodeSet each fits.
MAPPINGS: dict[str, tuple[dict[str, str], Callable[[Any], DaemonSetNodeSet]]] = {
    "slinky": ({"node_mapping": "slinky"}, DaemonSetNodeSet),
    "annotation": (
        {"node_mapping": "annotation", "node_mapping_key": SLINKY_HOSTNAME_OVERRIDE},
        functools.partial(DaemonSetNodeSet, annotated=True),
    ),
}


@pytest.mark.parametrize("mapping", list(MAPPINGS))
async def test_the_successors_slurm_node_is_waited_for_and_the_old_one_left(
    tmp_path: Path, mapping: str
) -> None:
    keys, cluster = MAPPINGS[mapping]
    async with EngineHarness(tmp_path, cluster=cluster, mapping=keys) as h:
        incident = await h.alert(NODE)
        done = await h.until_ended(incident)
        assert done.state.value == "resolved", await h.timeline(incident)
        ready = (await h.steps(incident))["wait_ready"].result
        assert ready["node"] == SUCCESSOR
        assert ready["slurm_nodes"] == [SUCCESSOR]
        assert not [r for r in h.records() if r.get("op") == "slurm_resume"]  # no ghost RESUMEd
        old = await h.world.node(NODE)
        assert "NOT_RESPONDING" in old.states
        # Out of service, with the reason of the preStop hook its pod ran as the node went (over
        # pitcrew's own DOWN reason, under ``annotation``).
        assert old.taken_out and old.reason == SLINKY_PRESTOP_REASON, old
        [left] = await h.events(incident, "left_behind")
        assert NODE in left.detail and SUCCESSOR in left.detail
        [summary] = h.notices("summary", incident)
        assert any(NODE in line and SUCCESSOR in line for line in summary["lines"]), summary["lines"]


async def test_a_statefulset_nodesets_replacement_serves_the_same_slurm_node(tmp_path: Path) -> None:
    """The replica made again on the replacement registers the same Slurm node, which its old pod's
    preStop hook set DOWN as the old node was drained for its deletion ("slurm-operator: Pod is
    terminating"; the operator's undrain for the new pod relabels it and leaves the DOWN): Slurm
    keeps that DOWN when the slurmd registers again (``ReturnToService`` 0 or 1). pitcrew's
    replacement caused it and nothing else returns the node: pitcrew RESUMEs it, once."""
    async with EngineHarness(tmp_path, cluster=StatefulSetNodeSet, mapping={"node_mapping": "slinky"}) as h:
        incident = await h.alert(NODE)
        done = await h.until_ended(incident)
        assert done.state.value == "resolved", await h.timeline(incident)
        ready = (await h.steps(incident))["wait_ready"].result
        assert (ready["node"], ready["slurm_nodes"]) == (SUCCESSOR, [NODE])
        assert not await h.events(incident, "left_behind")
        assert [r["op"] for r in h.records() if r.get("node") == NODE and r["op"] == "prestop_down"]
        back = await h.world.node(NODE)
        assert back.in_service, back  # failed before: DOWN "slurm-operator: Pod (…) was uncordoned"
        assert len([r for r in h.records() if r.get("op") == "slurm_resume"]) == 1
        [acted] = [e for e in await h.events(incident, "action") if e.data.get("action") == "slurm_resume"]
        assert "preStop" in acted.detail, acted.detail
        [summary] = h.notices("summary", incident)
        assert any(line.startswith("node back in service after") for line in summary["lines"])


async def test_a_down_the_operator_did_not_make_is_left_and_said(tmp_path: Path) -> None:
    """A DOWN with a reason neither pitcrew's nor the preStop hook's (a person's, set while the node
    was being replaced) is not pitcrew's to undo: left as it is, and the incident does not claim the
    node is back in service; its summary says the Slurm node is still out."""

    class PersonDowns(StatefulSetNodeSet):
        async def replace(self, name: str, **kwargs: Any) -> str:
            handle = await super().replace(name, **kwargs)
            await self._world.journal.append({"op": "slurm_down", "node": NODE, "reason": "hw check by ops"})
            return handle

    async with EngineHarness(tmp_path, cluster=PersonDowns, mapping={"node_mapping": "slinky"}) as h:
        incident = await h.alert(NODE)
        done = await h.until_ended(incident)
        assert not [r for r in h.records() if r.get("op") == "slurm_resume"]
        assert (await h.world.node(NODE)).reason == "hw check by ops"
        resume = (await h.steps(incident))["slurm_resume"].result
        assert resume["still_out"] == [NODE] and resume["returned_at"] is None, resume
        [summary] = h.notices("summary", incident)
        assert not any(line.startswith("node back in service") for line in summary["lines"]), summary
        assert any(NODE in line and "still out of service" in line for line in summary["lines"]), summary
        assert done.state.value == "resolved", await h.timeline(incident)


async def test_a_new_slurm_node_slurm_does_not_know_yet_is_waited_for(tmp_path: Path) -> None:
    """A dynamic node exists in slurmctld only once its slurmd registers (``slurmd -Z``): until then
    Slurm answers that it knows no such node, which is no reason to give up on the repair."""
    async with EngineHarness(tmp_path, cluster=DaemonSetNodeSet, mapping={"node_mapping": "slinky"}) as h:

        def registers_late(state: SlurmNodeState) -> SlurmNodeState:
            if state.name == SUCCESSOR and h.time.elapsed < 600:
                raise PermanentError(f"Invalid node name specified: {SUCCESSOR}", reason=Reason.UNKNOWN_NODE)
            return state

        h.scheduler.always("node", Answer(registers_late))
        incident = await h.alert(NODE)
        done = await h.until_ended(incident)
        assert done.state.value == "resolved", await h.timeline(incident)
        waits = [e.detail for e in await h.events(incident, "step_waiting", "wait_ready")]
        assert any("Slurm does not know it" in w for w in waits), waits
        finished = (await h.events(incident, "step_finished", "wait_ready"))[-1]
        assert (finished.at - done.opened_at).total_seconds() >= 600


async def test_the_record_left_behind_is_no_node_to_the_breaker(tmp_path: Path) -> None:
    """The failed node's record stays out of service without slurmd (slurm-operator keeps it under
    ``pruneSlurmNodeRecords: Never``, the default): no node stands behind it, its replacement is in
    service. The breaker counts every node out of service, whoever took it out, but not that record:
    counted, one replacement under a new name would hold every later repair at ``max_nodes`` 1
    (a fleet under 40 nodes at the default ``max_fraction``) for as long as the record stays."""
    breaker = {"max_nodes": 1, "window": timedelta(minutes=10)}
    async with EngineHarness(
        tmp_path, cluster=DaemonSetNodeSet, mapping={"node_mapping": "slinky"}, breaker=breaker
    ) as h:
        first = await h.alert(NODE)
        assert (await h.until_ended(first)).state.value == "resolved", await h.timeline(first)
        await h.time.advance(11 * 60)  # the first repair is out of the breaker's window
        assert "NOT_RESPONDING" in (await h.world.node(NODE)).states  # the record is still there
        second = await h.alert(OTHER)
        done = await h.until_ended(second)
        assert done.state.value == "resolved", await h.timeline(second)
