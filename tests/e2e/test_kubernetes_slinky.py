"""Slinky mapping on the emulator with the real pitcrew process: Slurm is taken out before the drain.

The emulator holds one Kubernetes node per Slurm node, each running its NodeSet slurmd pod, busy
(``pod-protect``) and guarded by slurm-operator's budget (``maxUnavailable: 0``); its slurm-operator
stand-in drains the Slurm node of a cordoned Kubernetes node with the cordon-reason annotation it
finds, and drops ``pod-protect`` once the Slurm node is idle. pitcrew (mode auto,
``slurm.node_mapping: slinky``) maps the alert's Kubernetes node to its Slurm node through the slurmd
pods, writes the cordon reason before the cordon (so the operator drains with pitcrew's reason),
and its drain evicts the slurmd pod once the budget allows it — refused while Slurm was busy,
never forced. The operator stand-in drains the real Slurm node (``scontrol``) and keeps
``pod-protect`` while it is busy: a long job on it holds the drain until pitcrew requeues it at the
end of the drain's grace period, instead of waiting out the step's deadline. The evicted slurmd pod's
preStop hook (slurm-operator's ``worker_app.go``) then sets the Slurm node DOWN with its own reason.
"""

from __future__ import annotations

import time
from typing import Any

import pytest

from proving_ground.kubernetes.slinky import TERMINATING, ScontrolSlurm
from proving_ground.kubernetes.world import KubeWorld, slinky_workers
from proving_ground.slurm import SlurmCluster
from tests.e2e.kube_config import slurm_and_kubernetes
from tests.e2e.slurm_engine import open_incident
from tests.harness.proc import wait_until
from tests.harness.scenarios import delivery, step_result

pytestmark = pytest.mark.slow

PLAYBOOK = {
    "slinky-drain": {
        "description": "Take the node out through slurm-operator and empty it.",
        "steps": [
            "notify",
            "slurm_down",
            "cordon",
            {"step": "drain", "timeout": "60s", "options": {"slurm_drain_grace_seconds": 3}},
            "close",
        ],
    }
}


def test_slinky_drain_follows_the_operator(
    slurm: SlurmCluster, pitcrew_factory: Any, kube_world: KubeWorld, tmp_path: Any
) -> None:
    names = kube_world.call(lambda e: slinky_workers(e, list(slurm.nodes)))
    kube_node, slurm_node = next(iter(names.items()))
    kube_world.call(lambda e: setattr(e, "slinky_drain_delay", 1.5))
    kube_world.call(lambda e: setattr(e, "slinky_slurm", ScontrolSlurm(slurm)))  # the operator's Slurm
    job = slurm.submit("--requeue", f"--nodelist={slurm_node}", "--wrap=sleep 600")  # a long job
    deadline = time.monotonic() + 20
    while not slurm.node(slurm_node).states & {"ALLOCATED", "MIXED"}:  # the job has started there
        assert time.monotonic() < deadline, slurm.node(slurm_node)
        time.sleep(0.2)
    site = slurm_and_kubernetes(slurm, kube_world, tmp_path / "kube")
    config = {
        **site,
        "slurm": {**site["slurm"], "node_mapping": "slinky"},
        "playbooks": PLAYBOOK,
        "catalog": {"overrides": {"79": {"playbook": "slinky-drain"}}},
    }
    server = pitcrew_factory("k8s-slinky", config=config, simulated=False).start()
    incident_id = open_incident(server, delivery("xid79-firing.json", node=kube_node))
    # The operator drains the real Slurm node with pitcrew's reason under its prefix; the long job
    # keeps the slurmd pod protected until pitcrew requeues it at the end of the grace period.
    wait_until(
        lambda: slurm.node(slurm_node).reason.startswith(f"slurm-operator: pitcrew: {incident_id} "),
        timeout=30,
        interval=0.1,
        what="the operator to drain the Slurm node with pitcrew's reason",
    )
    final = server.wait_incident(incident_id, "resolved", "failed", timeout=90)
    assert final["state"] == "resolved", final["outcome"]

    assert step_result(final, "slurm_down")["slurm_nodes"] == [slurm_node]
    reason = kube_world.call(lambda e: e.slinky_reasons[kube_node])
    assert reason is not None and reason.startswith(f"pitcrew: {incident_id} "), reason
    # The evicted slurmd pod's preStop hook then set the node DOWN with its own reason.
    assert kube_world.call(lambda e: e.slinky_prestops) == [slurm_node]
    after = slurm.node(slurm_node)
    assert after.down and after.reason == TERMINATING, after
    assert step_result(final, "drain")["requeued"] == [job]
    snapshot = slurm.job(job)
    assert snapshot is not None and slurm_node not in snapshot.nodes
    log = kube_world.log()
    patches = [e for e in log if e.verb == "patch" and e.name == kube_node]
    assert len(patches) == 2  # the reason, then the cordon
    evictions = [(e.name, e.status) for e in log if e.subresource == "eviction"]
    # Not one eviction while the job ran (the grace wait comes first); then refused only while Slurm
    # was still completing the requeued job, and let through.
    assert evictions[-1] == (f"slurm-worker-{slurm_node}", 201)
    assert all(code == 429 for _, code in evictions[:-1]), evictions
    assert not [e for e in log if e.verb == "delete"]  # nothing forced
    assert kube_world.call(lambda e: e.get("pods", f"slurm-worker-{slurm_node}", "slurm")) is None
