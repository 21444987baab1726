"""A replacement that serves the SAME Slurm node name, on real Slurm (a dynamic node) and the emulator:
slurm-operator's default scaling mode, StatefulSet.

A StatefulSet-mode NodeSet names its pods by ordinal (``GetOrdinalPodName``), and each pod's hostname
is its Slurm node's name; its slurmd registers that node dynamically (``slurmd -Z --conf
'Features=<nodeset>'``, ``internal/builder/workerbuilder/worker_app.go``). Once the pod is gone the
NodeSet makes it again under the same name, unbound (``NewNodeSetStatefulSetPod`` clears
``nodeName``): pending, it is the demand Karpenter launches the successor for, and its slurmd
registers the Slurm record that is still there (proc_req.c ``find_node_record2``: no new node).
From slurm-operator v1.2.0 the slurmd container's preStop hook sets that record DOWN (``scontrol
update nodename=$(hostname) state=down reason='slurm-operator: Pod is terminating'``) when the pod
is evicted, and Slurm keeps a DOWN when the slurmd registers again unless ``ReturnToService=2``
(node_mgr.c ``validate_node_specs``); slurm-operator writes none (Slurm's default: 0).

The world: the real cluster has the NodeSet (``SlurmCluster(nodeset=..., return_to_service=0)``) and
its replica ``slurm-worker-gpu-h100-0`` running as a dynamic node; its static nodes, all busy, leave
the training job no other node (their slurmds run outside Kubernetes). The emulator holds the Karpenter node ``gpu-node-02`` (NodeClaim,
NodePool ``gpu-h100``) running that replica's pod (``world.statefulset_worker``), slurm-operator's
drain on cordon through ``scontrol`` (``ScontrolSlurm``) and its preStop hook. ``SlurmdPods`` runs
the pod's slurmd for real: stopped when the pod is evicted, started again under the same name once
the NodeSet's new pod runs on the node Karpenter launched.

Shown: XID 79 on ``gpu-node-02`` while the job runs on the replica's Slurm node: cordon, the
operator's drain, the drain requeues the job at the end of its grace and evicts the slurmd pod (the
hook's DOWN), the NodeClaim deleted, the successor is the node the pod lands on, the same Slurm node
registers again and Slurm keeps it DOWN (the operator's undrain of the replica on the successor,
not cordoned, relabels it "Pod (slurm/<replica>) was uncordoned"); pitcrew RESUMEs it once (audited, ``prestop_resumed``), the
job runs again there from its checkpoint, the incident resolves with the node in service.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from proving_ground.kubernetes.slurmd_pods import SlurmdPods
from proving_ground.kubernetes.world import KubeWorld, statefulset_worker
from proving_ground.slurm import SlurmCluster
from proving_ground.sync_loop import SyncLoop
from proving_ground.train_job import read_checkpoint
from tests.e2e.kube_config import slurm_and_kubernetes
from tests.e2e.slinky_world import NODESET, nodeset_cluster, operator_on, training_on
from tests.e2e.slurm_engine import open_incident, replace_node, running_on
from tests.harness.proc import wait_until
from tests.harness.scenarios import delivery, events, step_result
from tests.harness.slurm import BACKENDS

pytestmark = pytest.mark.slow

REPLICA = f"{NODESET}-0"  # its replica 0: the pod's name, hostname and Slurm node


@pytest.fixture
def replica_slurm(slurm_version: str) -> Iterator[SlurmCluster]:
    """A cluster of its own with the NodeSet, Slurm's own ReturnToService (0, slurm-operator's) and
    SlurmdTimeout (300 s: slurm-operator writes none), and the replica's slurmd running as a dynamic
    node."""
    with nodeset_cluster(
        slurm_version, "pitcrew-slurm-replica-", return_to_service=0, slurmd_timeout=300
    ) as cluster:
        cluster.start_dynamic(REPLICA)
        yield cluster


class OperatorSyncAfter(SyncLoop):
    """slurm-operator's sync of the replica made again on the successor, held
    (``slinky_sync_held``) until pitcrew's wait_ready has waited on the replica's slurmd: that
    sync's UNDRAIN makes Slurm set the record NOT_RESPONDING until the slurmd registers
    (node_mgr.c ``update_node``, ``NODE_STATE_UNDRAIN``: ``_require_node_reg``), so pitcrew, had it
    looked after, would have read no more than that."""

    def __init__(self, world: KubeWorld, server: Any, incident_id: str) -> None:
        super().__init__("operator-sync-after", 0.1)
        self.world, self.server, self.incident_id = world, server, incident_id

    def sync(self) -> None:
        waits = events(self.server.incident(self.incident_id), "step_waiting", "wait_ready")
        if any(f"slurmd on {REPLICA} has not registered" in e["detail"] for e in waits):
            self.world.call(lambda e: e.slinky_release())
            self._stop.set()


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_statefulset_replica_made_again_on_the_successor_is_resumed_and_runs_the_job_again(
    replica_slurm: SlurmCluster, pitcrew_factory: Any, kube_world: KubeWorld, tmp_path: Path, backend: str
) -> None:
    slurm = replica_slurm
    kube_node, replica = kube_world.call(statefulset_worker)
    assert replica == REPLICA

    operator_on(kube_world, slurm)
    kube_world.call(lambda e: setattr(e, "slinky_sync_held", True))
    job_id = training_on(slurm, REPLICA)

    site = slurm_and_kubernetes(
        slurm, kube_world, tmp_path / "kube", backend=backend, replace={"strategy": "karpenter"}
    )
    config = {
        **site,
        "slurm": {**site["slurm"], "node_mapping": "slinky"},
        "playbooks": replace_node(
            drain={"timeout": "60s", "options": {"slurm_drain_grace_seconds": 3}},
            # The requeued job cannot start elsewhere (every other node is busy): a short hold.
            slurm_resume={"options": {"requeue_wait_seconds": 2}},
        ),
    }
    # The static nodes' slurmds are not pods. The replica's slurmd comes up on the successor 12 s
    # after its pod lands there (an image pulled on a fresh node). Meanwhile the record its old
    # slurmd left is DOWN without NOT_RESPONDING (no ping of it is due before SlurmdTimeout/3, 100 s)
    # until the operator's sync undrains it, then DOWN and NOT_RESPONDING; ReturnToService=0 keeps
    # the DOWN when the slurmd registers. pitcrew's first look may come in either: the operator's
    # sync waits for it, so that pitcrew reads the record that says nothing of the slurmd first.
    with SlurmdPods(kube_world, slurm, running=[REPLICA], start_after=12) as pods:
        server = pitcrew_factory("slinky-same-name", config=config, simulated=False).start()
        incident_id = open_incident(server, delivery("xid79-firing.json", node=kube_node))
        with OperatorSyncAfter(kube_world, server, incident_id) as operator:
            final = server.wait_incident(incident_id, "resolved", "failed", timeout=90)
        server.stop()
    assert operator.error is None, operator.error
    assert pods.error is None, pods.error
    assert final["state"] == "resolved", (final["outcome"], [e["detail"] for e in final["events"]])

    # The pod evicted (its hook's DOWN, its slurmd stopped), made again on the successor Karpenter
    # launched for it, its slurmd registered under the same Slurm node name.
    assert pods.moves == [(REPLICA, "stop"), (REPLICA, "start")]
    assert kube_world.call(lambda e: e.slinky_prestops) == [REPLICA]
    new_node = step_result(final, "wait_ready")["node"]
    assert new_node != kube_node
    landed = kube_world.call(lambda e: e.get("pods", REPLICA, "slurm"))
    assert landed is not None and landed["spec"]["nodeName"] == new_node
    assert step_result(final, "slurm_down")["slurm_nodes"] == [REPLICA]
    # wait_ready waited for that slurmd to register again, not only for the successor to be Ready.
    started = slurm.node(REPLICA).slurmd_started_at
    ready_at = datetime.fromisoformat(step_result(final, "wait_ready")["ready_at"])
    assert started is not None and ready_at >= started, (ready_at, started)
    waits = [e["detail"] for e in events(final, "step_waiting", "wait_ready")]
    assert any(f"slurmd on {REPLICA} has not registered again" in w for w in waits), waits

    # Slurm kept the hook's DOWN over the registration, the operator's undrain of the replica on
    # the (uncordoned) successor relabelled it; pitcrew RESUMEd it, once, and said why.
    [resume] = [e for e in events(final, "action") if e["data"].get("action") == "slurm_resume"]
    assert resume["data"].get("node") == REPLICA and "preStop hook" in resume["detail"], resume
    assert f"slurm-operator: Pod (slurm/{REPLICA}) was uncordoned" in resume["detail"], resume
    resumed = step_result(final, "slurm_resume")
    assert resumed["prestop_resumed"] == [REPLICA] and resumed["resumed"] == [REPLICA], resumed
    assert not resumed["still_out"], resumed

    # The job ran again on the same Slurm node, from its checkpoint; the node is in service.
    [job] = step_result(final, "confirm_resumed")["jobs"]
    assert job["job_id"] == job_id and job["status"] == "resumed" and job["new_nodes"] == [REPLICA], job
    again = running_on(slurm, job_id)
    assert again.nodes == (REPLICA,) and again.restarts >= 1
    assert read_checkpoint(slurm.job_dir, job_id) >= 3
    node = slurm.node(REPLICA)
    assert not node.down and not node.drained, node


def test_a_reboot_leaves_the_statefulset_replica_on_the_rebooted_node(
    replica_slurm: SlurmCluster, pitcrew_factory: Any, kube_world: KubeWorld, tmp_path: Path
) -> None:
    """``reboot-node`` on the replica's node: had the drain evicted the replica, the NodeSet would
    make it again unbound, kube-scheduler could not place it on the cordoned node, Karpenter would
    launch a node for it, and the Slurm node would come back there, the rebooted machine serving
    nothing. The drain leaves it (said in the timeline); the reboot (a new boot id) restarts its
    slurmd on the same node, and pitcrew returns the Slurm node there once that slurmd registered."""
    slurm = replica_slurm
    kube_node, replica = kube_world.call(statefulset_worker)
    operator_on(kube_world, slurm)
    reboot = tmp_path / "reboot-job.yaml"
    reboot.write_text(
        "spec:\n  template:\n    spec:\n      hostPID: true\n      containers:\n"
        "        - {name: reboot, image: busybox, command: [sh, -c, 'chroot /host systemctl reboot'],"
        " securityContext: {privileged: true}}\n"
    )
    site = slurm_and_kubernetes(slurm, kube_world, tmp_path / "kube", jobs={"reboot_template": str(reboot)})
    config = {
        **site,
        "slurm": {**site["slurm"], "node_mapping": "slinky"},
        "engine": {"poll_interval": "1s"},
        "catalog": {"overrides": {"79": {"playbook": "reboot-node"}}},
    }
    with SlurmdPods(kube_world, slurm, running=[REPLICA], start_after=2) as pods:
        server = pitcrew_factory("slinky-reboot", config=config, simulated=False).start()
        incident_id = open_incident(server, delivery("xid79-firing.json", node=kube_node))
        final = server.wait_incident(incident_id, "resolved", "failed", timeout=90)
        server.stop()
    assert pods.error is None, pods.error
    assert final["state"] == "resolved", (final["outcome"], [e["detail"] for e in final["events"]])

    assert not [e for e in kube_world.log() if e.subresource == "eviction" and e.name == replica]
    [kept] = events(final, "nodeset_kept", "drain")
    assert f"slurm/{replica}" in kept["detail"], kept
    state: dict[str, Any] = kube_world.call(
        lambda e: {
            "pod": e.get("pods", replica, "slurm"),
            "claims": [
                c["status"].get("nodeName") for (k, _, _), c in e.objects.items() if k == "nodeclaims"
            ],
        }
    )
    assert state["pod"]["spec"]["nodeName"] == kube_node and state["claims"] == [kube_node], state
    # Its slurmd went down with the node and started again there; the Slurm node is back in service.
    assert pods.moves == [(replica, "stop"), (replica, "start")], pods.moves
    assert step_result(final, "wait_ready")["node"] == kube_node
    # The operator's drain from the cordon ends with its undrain, a sync after pitcrew's uncordon.
    wait_until(lambda: not slurm.node(replica).taken_out, timeout=10, interval=0.2, what="the undrain")
    node = slurm.node(replica)
    assert not node.down and not node.drained, node
