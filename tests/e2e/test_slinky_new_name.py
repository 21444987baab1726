"""A replacement that serves a NEW Slurm node name, on real Slurm (dynamic nodes) and the emulator.

With a Slinky NodeSet in DaemonSet scaling mode the Slurm node is named after the Kubernetes node
(slurm-operator's ``GetDaemonSetPodHostname``), and its slurmd registers it dynamically (``slurmd -Z
--conf 'Features=<nodeset>'``). The node Cluster API makes in place of a failed one has a new name, so
its slurmd registers a new Slurm node and the failed node's record stays behind.

The world: the real cluster has the NodeSet (``SlurmCluster(nodeset=...)``: ``MaxNodeCount``,
``TreeWidth=65533``, ``NodeSet=<name> Feature=<name>``, its partition ``Nodes=<name>``), its static
nodes ``gpu-001..003`` carrying the feature stand for the pods there at the start; the emulator holds
``kube-gpu-00N`` (each a Machine's, with the ``hostname-override`` naming its Slurm node) running the
NodeSet's slurmd pods, slurm-operator's drain on cordon (``ScontrolSlurm``) and the MachineSet's
replacement, on which the NodeSet makes its pod (named after the new node: it has no override).
``SlurmdPods`` runs each pod's slurmd for real: a new pod's registers its new Slurm node, an evicted
one's preStop sets its Slurm node DOWN and its slurmd stops.

Shown: XID 79 on ``kube-gpu-001`` while the training job runs on ``gpu-001`` and the other two nodes
are busy: the operator drains ``gpu-001`` with pitcrew's reason, the drain requeues the job at the end
of its grace and evicts the slurmd pod, the Machine is deleted once; ``wait_ready`` waits for the new
node's Slurm node (unknown to Slurm until its slurmd registers) and records it; the job runs again
there from its checkpoint; ``gpu-001`` is never RESUMEd (DOWN, the preStop's reason); the incident
resolves and its summary names ``gpu-001`` as left behind. Once Slurm finds no slurmd for ``gpu-001``
(NOT_RESPONDING), a fault on another node passes the breaker at ``max_nodes`` 1: the record left
behind is no node out of service.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from proving_ground.kubernetes.slinky import TERMINATING
from proving_ground.kubernetes.slurmd_pods import SlurmdPods
from proving_ground.kubernetes.world import KubeWorld, slinky_workers
from proving_ground.slurm import SlurmCluster
from proving_ground.train_job import read_checkpoint
from tests.e2e.kube_config import slurm_and_kubernetes
from tests.e2e.slinky_world import nodeset_cluster, operator_on, training_on
from tests.e2e.slurm_engine import open_incident, replace_node, running_on
from tests.harness.proc import wait_until
from tests.harness.scenarios import delivery, events, notices, step_result
from tests.harness.slurm import BACKENDS

pytestmark = pytest.mark.slow


@pytest.fixture
def nodeset_slurm(slurm_version: str) -> Iterator[SlurmCluster]:
    """A cluster of its own with the NodeSet (the session's has none)."""
    with nodeset_cluster(slurm_version, "pitcrew-slurm-nodeset-") as cluster:
        yield cluster


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_replacement_under_a_new_slurm_name_runs_the_job_again(
    nodeset_slurm: SlurmCluster, pitcrew_factory: Any, kube_world: KubeWorld, tmp_path: Path, backend: str
) -> None:
    slurm = nodeset_slurm
    names = kube_world.call(lambda e: slinky_workers(e, list(slurm.nodes), machines=True))
    kube_node, old = next(iter(names.items()))

    operator_on(kube_world, slurm)
    job_id = training_on(slurm, old)

    site = slurm_and_kubernetes(
        slurm, kube_world, tmp_path / "kube", backend=backend, replace={"strategy": "cluster-api"}
    )
    config = {
        **site,
        # One node at a time, and only while it is being repaired: the second fault below is judged
        # against what is out of service then, the first repair out of the window.
        "guards": {"breaker": {"max_nodes": 1, "max_fraction": 1.0, "window": "1s"}},
        "slurm": {**site["slurm"], "node_mapping": "slinky"},
        "playbooks": replace_node(drain={"timeout": "60s", "options": {"slurm_drain_grace_seconds": 3}}),
    }
    with SlurmdPods(kube_world, slurm) as pods:
        server = pitcrew_factory("slinky-new-name", config=config, simulated=False).start()
        incident_id = open_incident(server, delivery("xid79-firing.json", node=kube_node))
        final = server.wait_incident(incident_id, "resolved", "failed", timeout=90)
        assert pods.error is None, pods.error
        # The record left behind: DOWN, and soon no slurmd answering for it (SlurmdTimeout). No node
        # stands behind it: a fault on another node is not held back by it at max_nodes 1.
        wait_until(
            lambda: "NOT_RESPONDING" in slurm.node(old).states,
            timeout=30,
            interval=0.2,
            what=f"Slurm to find no slurmd for {old}",
        )
        other = next(k for k in names if k != kube_node)
        second = open_incident(server, delivery("xid79-firing.json", node=other))
        guards = server.wait_event(second, "guards", timeout=30)
        server.stop()  # its repair is not this test's (one dynamic slurmd per host)
    assert guards["detail"] == "all guards passed", guards
    assert final["state"] == "resolved", (final["outcome"], [e["detail"] for e in final["events"]])

    [new] = [name for name, what in pods.moves if what == "start"]
    assert pods.moves == [(old, "stop"), (new, "start")]
    ready = step_result(final, "wait_ready")
    assert new.startswith(f"{kube_node}-") and ready["node"] == new
    assert ready["slurm_nodes"] == [new]
    assert step_result(final, "slurm_down")["slurm_nodes"] == [old]
    waits = [e["detail"] for e in events(final, "step_waiting", "wait_ready")]
    # The new node Ready, its slurmd not started yet: Slurm knew no such node, which pitcrew waited out.
    assert f"slurmd on {new} has not registered yet (Slurm does not know it)" in waits, waits

    # The job ran again on the new Slurm node, from its checkpoint.
    [job] = step_result(final, "confirm_resumed")["jobs"]
    assert job["job_id"] == job_id and job["status"] == "resumed" and job["new_nodes"] == [new], job
    again = running_on(slurm, job_id)
    assert again.nodes == (new,) and again.restarts >= 1
    assert read_checkpoint(slurm.job_dir, job_id) >= 3

    # The old record: never RESUMEd, DOWN with the slurmd container's preStop reason, no slurmd.
    assert not [e for e in events(final, "action") if e["data"].get("action") == "slurm_resume"]
    record = slurm.node(old)
    assert record.down and record.reason == TERMINATING, record
    assert kube_world.call(lambda e: e.slinky_prestops) == [old]
    [left] = [e["detail"] for e in events(final, "left_behind")]
    assert old in left and new in left
    [summary] = [n for n in notices(server.journal_records(), "summary") if n["incident_id"] == incident_id]
    assert any(old in line and new in line for line in summary["lines"]), summary["lines"]
