"""A reboot in place under a Slinky NodeSet (either scaling mode), in virtual time.

pitcrew's ``reboot`` step reboots the node where it stands (a privileged Job pinned to it, or an
operator command). A node that shuts down through systemd (``systemctl reboot``, the ``reboot``
command, a cloud's ACPI stop) with the kubelet's graceful node shutdown configured
(``shutdownGracePeriod``; the ``GracefulNodeShutdown`` gate is on by default from Kubernetes 1.21)
has its pods terminated as on any deletion first: "Kubelet ensures that pods follow the normal pod
termination process during the node shutdown" (kubernetes.io, Concepts > Cluster Administration >
Node Shutdowns; ``pkg/kubelet/nodeshutdown/nodeshutdown_manager_linux.go``, which kills each pod
through the kubelet's ``killPodFunc`` with its grace period), preStop hooks included. The slurmd
container's hook (slurm-operator v1.2 on, ``internal/builder/workerbuilder/worker_app.go``) sets the
node's Slurm node DOWN "slurm-operator: Pod is terminating"; after the reboot the same pod's slurmd
(DaemonSet mode: the node's pod; StatefulSet mode: its replica, on the node again) registers the
same Slurm node, and Slurm keeps the DOWN (``ReturnToService`` 0 or 1, node_mgr.c
``validate_node_specs``). The operator's undrain after pitcrew's uncordon relabels it and leaves it
DOWN. pitcrew caused it (its reboot was issued): ``slurm_resume`` RESUMEs it, once, and the node is
back in service.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from bot.domain.jobs import SlurmNodeState
from bot.domain.nodemap import SlurmdPod
from tests.engine.harness import Answer, DaemonSetNodeSet, EngineHarness, StatefulSetNodeSet, permanent

NODE = "gpu-node-02"
REBOOT = {"79": {"playbook": "reboot-node"}}  # the catalog override selecting the reboot


@pytest.mark.parametrize("cluster", [DaemonSetNodeSet, StatefulSetNodeSet], ids=lambda c: c.mode)
async def test_a_reboot_in_place_returns_the_slurm_node_its_slurmd_pods_prestop_set_down(
    tmp_path: Path, cluster: type[DaemonSetNodeSet]
) -> None:
    async with EngineHarness(
        tmp_path, cluster=cluster, mapping={"node_mapping": "slinky"}, catalog=REBOOT
    ) as h:
        incident = await h.alert(NODE)
        done = await h.until_ended(incident)
        assert done.state.value == "resolved", await h.timeline(incident)
        steps = await h.steps(incident)
        assert "replace" not in steps and steps["reboot"].result["issued"]
        ops = [r["op"] for r in h.records() if r.get("node") == NODE]
        # The reboot's graceful shutdown ran the slurmd container's preStop hook.
        assert ops.index("reboot") < ops.index("prestop_down") < ops.index("slurm_resume"), ops
        back = await h.world.node(NODE)
        assert back.in_service, back
        assert len([r for r in h.records() if r.get("op") == "slurm_resume"]) == 1
        [acted] = [e for e in await h.events(incident, "action") if e.data.get("action") == "slurm_resume"]
        assert "preStop" in acted.detail, acted.detail
        assert steps["slurm_resume"].result["prestop_resumed"] == [NODE]
        [summary] = h.notices("summary", incident)
        assert any(line.startswith("node back in service after") for line in summary["lines"])


async def test_a_reboot_without_graceful_node_shutdown_leaves_the_operators_drain_to_its_undrain(
    tmp_path: Path,
) -> None:
    """The kubelet's default (``shutdownGracePeriod`` 0): the node goes down with its pods running
    and no hook runs; the slurmd starts again after the boot. The Slurm node holds only the
    operator's drain from pitcrew's cordon, which its undrain ends after the uncordon: pitcrew
    RESUMEs nothing, and the node is back in service."""

    class Abrupt(DaemonSetNodeSet):
        graceful_node_shutdown = False

    async with EngineHarness(
        tmp_path, cluster=Abrupt, mapping={"node_mapping": "slinky"}, catalog=REBOOT
    ) as h:
        incident = await h.alert(NODE)
        done = await h.until_ended(incident)
        assert done.state.value == "resolved", await h.timeline(incident)
        ops = [r["op"] for r in h.records() if r.get("node") == NODE]
        assert "prestop_down" not in ops and "slurm_resume" not in ops, ops
        assert ops.index("uncordon") < ops.index("operator_undrain"), ops
        assert (await h.world.node(NODE)).in_service
        [summary] = h.notices("summary", incident)
        assert any(line.startswith("node back in service after") for line in summary["lines"])


async def test_the_wait_is_for_a_slurmd_started_since_the_reboot(tmp_path: Path) -> None:
    """The node is Ready again before its slurmd pod's container has started slurmd: Slurm's record
    still answers for the slurmd from before the reboot (slurmctld marks it NOT_RESPONDING only after
    ``SlurmdTimeout``, 300 s by default), and a RESUME then would return a node with no slurmd, which
    Slurm sets DOWN "Not responding" and, under ``ReturnToService=0``, keeps DOWN when slurmd comes.
    ``wait_ready`` waits for a ``SlurmdStartTime`` since the reboot was issued."""
    async with EngineHarness(
        tmp_path, cluster=DaemonSetNodeSet, mapping={"node_mapping": "slinky"}, catalog=REBOOT
    ) as h:
        before = h.time.now() - timedelta(days=3)

        def slurmd_late(state: SlurmNodeState) -> SlurmNodeState:
            late = h.time.elapsed < 600
            return replace(state, slurmd_started_at=before if late else h.time.now())

        h.scheduler.always("node", Answer(slurmd_late))
        incident = await h.alert(NODE)
        done = await h.until_ended(incident)
        assert done.state.value == "resolved", await h.timeline(incident)
        waits = [e.detail for e in await h.events(incident, "step_waiting", "wait_ready")]
        assert f"slurmd on {NODE} has not registered again since the reboot" in waits, waits
        finished = (await h.events(incident, "step_finished", "wait_ready"))[-1]
        assert (finished.at - done.opened_at).total_seconds() >= 600
        assert len([r for r in h.records() if r.get("op") == "slurm_resume"]) == 1


#: The catalog overrides selecting each repair that keeps the machine.
IN_PLACE = {"reboot-node": REBOOT, "reset-gpu": {"79": {"playbook": "reset-gpu"}}}


@pytest.mark.parametrize("cluster", [DaemonSetNodeSet, StatefulSetNodeSet], ids=lambda c: c.mode)
@pytest.mark.parametrize("playbook", sorted(IN_PLACE))
async def test_a_repair_in_place_leaves_the_nodesets_slurmd_pod_on_the_node(
    tmp_path: Path, playbook: str, cluster: type[DaemonSetNodeSet]
) -> None:
    """Evicted from the cordoned node, a NodeSet's slurmd pod does not come back to it. In
    StatefulSet mode (slurm-operator's default) it is made again under the same name, its Slurm
    node's, unbound (``NewNodeSetStatefulSetPod``), and kube-scheduler cannot place it on the
    cordoned node: it lands on another node, or pends and Karpenter launches one for it, and the
    Slurm node comes back there. In DaemonSet mode it is made again only on a node it should run on
    (``podsShouldBeOnNode``, ``PodShouldRunOnNode``), which a cordoned node with pitcrew's
    NoSchedule taint is not (its template tolerates neither that nor the cordon's
    ``node.kubernetes.io/unschedulable``): the node serves no Slurm node until the uncordon, which
    comes after ``wait_ready``. A reboot or a GPU reset repairs this machine: its drain leaves the
    pod where it is (the Slurm node is already out of service, and the operator drained it from the
    cordon), the repair restarts it there, and the Slurm node comes back on the repaired machine."""
    async with EngineHarness(
        tmp_path, cluster=cluster, mapping={"node_mapping": "slinky"}, catalog=IN_PLACE[playbook]
    ) as h:
        incident = await h.alert(NODE)
        done = await h.until_ended(incident)
        assert done.state.value == "resolved", await h.timeline(incident)
        pod = h.cluster.slurmd_pod(NODE).ref
        assert not [r for r in h.records() if r.get("pod") == pod], "the slurmd pod was evicted"
        assert h.cluster.gone == {} and getattr(h.cluster, "moved", {}) == {}
        steps = await h.steps(incident)
        assert steps["drain"].result["nodeset_kept"] == [pod]
        assert steps["wait_ready"].result["slurm_nodes"] == [NODE]
        assert (await h.world.node(NODE)).in_service


#: A playbook that takes the node out and empties it, leaving its repair to humans: no reset or
#: reboot of pitcrew's will restart a slurmd pod left there.
DRAIN_ONLY: dict[str, dict[str, Any]] = {
    "drain-only": {"steps": ["notify", "slurm_down", "cordon", "drain", "close"]}
}


@pytest.mark.parametrize("cluster", [DaemonSetNodeSet, StatefulSetNodeSet], ids=lambda c: c.mode)
async def test_a_drain_that_leaves_the_repair_to_humans_empties_the_node_of_its_slurmd_pod(
    tmp_path: Path, cluster: type[DaemonSetNodeSet]
) -> None:
    """Only a repair in place keeps the NodeSet's slurmd pod on the node: pitcrew restarts it there.
    A plan that leaves the repair to humans (no ``reset_gpu``, ``reboot`` or ``replace``) empties the
    node as any drain does, the slurmd pod too, as its operator and the people after it expect."""
    async with EngineHarness(
        tmp_path,
        cluster=cluster,
        mapping={"node_mapping": "slinky"},
        playbooks=DRAIN_ONLY,
        catalog={"79": {"playbook": "drain-only"}},
    ) as h:
        incident = await h.alert(NODE)
        done = await h.until_ended(incident)
        assert done.state.value == "resolved", await h.timeline(incident)
        pod = h.cluster.slurmd_pod(NODE).ref
        assert [r["op"] for r in h.records() if r.get("pod") == pod] == ["evict"]
        assert (await h.steps(incident))["drain"].result["nodeset_kept"] == []


async def test_after_a_reboot_a_slurm_node_come_back_on_another_node_is_not_the_repairs_success(
    tmp_path: Path,
) -> None:
    """The slurmd pod left the rebooted node all the same (a graceful node shutdown ends it Failed,
    and slurm-operator deletes a failed pod and makes it again, ``processNodeSetPod``; or a human
    deleted it): made again unbound it runs on another node, and its slurmd registers the Slurm node
    there. A new slurmd is no proof that the rebooted machine serves again: ``wait_ready`` does not
    take it, says where the Slurm node is served, and the incident goes to a human."""
    async with EngineHarness(
        tmp_path, cluster=StatefulSetNodeSet, mapping={"node_mapping": "slinky"}, catalog=REBOOT
    ) as h:
        rebooted = False

        def elsewhere(pods: list[SlurmdPod]) -> list[SlurmdPod]:
            nonlocal rebooted
            rebooted = rebooted or any(r.get("op") == "reboot" for r in h.records())
            if not rebooted:
                return pods
            return [replace(p, node_name="gpu-node-09") if p.slurm_node == NODE else p for p in pods]

        h.cluster.always("slurmd_pods", Answer(elsewhere))
        incident = await h.alert(NODE)
        done = await h.until_ended(incident)
        assert done.state.value == "failed", await h.timeline(incident)
        assert not [r for r in h.records() if r.get("op") == "slurm_resume"]
        waits = [e.detail for e in await h.events(incident, "step_waiting", "wait_ready")]
        assert any(f"{NODE} does not serve Slurm node {NODE}" in w for w in waits), waits


async def test_a_climb_from_a_reboot_to_a_replacement_drains_the_slurmd_pod_the_reboots_drain_left(
    tmp_path: Path,
) -> None:
    """``reboot-then-replace``: the reboot's drain left the slurmd pod on the node; the reboot fails
    and the incident climbs to ``replace-node``, whose replacement needs that pod evicted (made
    again unbound, pending, it is the successor's demand; standing on the node it is workload the
    replacement refuses to start under). The drain does not carry over into the replacement's
    rung: it runs again and evicts it, and the Slurm node comes back on the successor."""
    async with EngineHarness(
        tmp_path,
        cluster=StatefulSetNodeSet,
        mapping={"node_mapping": "slinky"},
        catalog={"79": {"playbook": "reboot-then-replace"}},
    ) as h:
        h.cluster.script("reboot", *permanent())
        incident = await h.alert(NODE)
        done = await h.until_ended(incident)
        assert done.state.value == "resolved", await h.timeline(incident)
        assert done.playbook == "replace-node"
        replica = h.cluster.replica(NODE).ref
        ops = [(r["op"], r.get("pod")) for r in h.records()]
        assert ops.index(("evict", replica)) < ops.index(("replace", None)), ops
        steps = await h.steps(incident)
        assert steps["drain"].result["nodeset_replicas"] == [replica]
        assert steps["wait_ready"].result["slurm_nodes"] == [NODE]
