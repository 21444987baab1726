"""SIGKILL between pitcrew's cordon request and its acknowledgement, on real Slurm and the emulator.

The emulator applies the cordon PATCH and holds the answer; pitcrew (the real process, mode auto,
``cordon-and-ask``) is killed with SIGKILL while it waits. Restarted on the same store, the cordon
step reads the node, finds it cordoned by this incident and writes nothing: the node saw exactly one
cordon write, with the taint and the ownership annotation together, and the incident closes with the
cordon recorded as pitcrew's (so a rollback would undo it). Likewise for the Machine delete of
``replace-node``: the handle is recorded before the delete, the resumed step finds the replacement
started and deletes nothing more, and ``wait_ready`` follows the handle to the new node although the
old node (which carried the handle too) is gone.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from bot.domain.ownership import OWNER_ANNOTATION, TAINT_KEY
from proving_ground.kubernetes.faults import Fault
from proving_ground.kubernetes.host_slurmds import HostSlurmds
from proving_ground.kubernetes.world import KubeWorld, gpu_fleet
from proving_ground.slurm import SlurmCluster
from tests.e2e.kube_config import slurm_and_kubernetes
from tests.e2e.slurm_engine import open_incident
from tests.harness.proc import wait_until
from tests.harness.scenarios import delivery, step_result

pytestmark = pytest.mark.slow


def test_sigkill_between_cordon_and_its_ack_never_writes_twice(
    slurm: SlurmCluster, pitcrew_factory: Any, kube_world: KubeWorld, tmp_path: Any
) -> None:
    node = slurm.nodes[0]
    kube_world.call(lambda e: gpu_fleet(e, list(slurm.nodes)))
    kube_world.call(lambda e: e.faults.add(Fault(verb="patch", resource="nodes", name=node, delay_after=60)))
    config = {
        **slurm_and_kubernetes(slurm, kube_world, tmp_path / "kube", request_timeout=120),
        "catalog": {"overrides": {"79": {"playbook": "cordon-and-ask"}}},
        "store": {"lease": {"ttl": "2s", "renew_every": "0.5s"}},  # the restart acts once it lapses
    }
    server = pitcrew_factory("k8s-crash", config=config, simulated=False).start()
    incident_id = open_incident(server, delivery("xid79-firing.json", node=node))

    def patches() -> list[Any]:
        return [e for e in kube_world.log() if e.verb == "patch" and e.resource == "nodes" and e.name == node]

    wait_until(
        lambda: [p.status for p in patches()] == [200], timeout=60, interval=0.05, what="the cordon to land"
    )
    server.kill()  # the answer is still held by the emulator
    applied = kube_world.call(lambda e: e.get("nodes", node))
    assert applied is not None
    assert applied["spec"]["unschedulable"] is True
    assert applied["metadata"]["annotations"][OWNER_ANNOTATION] == incident_id
    assert TAINT_KEY in [t["key"] for t in applied["spec"]["taints"]]

    server.start()
    final = server.wait_incident(incident_id, "resolved", "failed", timeout=60)
    assert final["state"] == "resolved", final["outcome"]
    assert len(patches()) == 1  # the resumed step wrote nothing
    assert step_result(final, "cordon")["owned"] is True


def test_sigkill_between_machine_delete_and_its_ack_never_deletes_twice(
    slurm: SlurmCluster,
    pitcrew_factory: Any,
    kube_world: KubeWorld,
    host_slurmds: Callable[..., HostSlurmds],
    tmp_path: Any,
) -> None:
    node = slurm.nodes[1]
    kube_world.call(lambda e: gpu_fleet(e, list(slurm.nodes)))
    hosts = host_slurmds()
    kube_world.call(lambda e: e.faults.add(Fault(verb="delete", resource="machines", delay_after=60)))
    kube = slurm_and_kubernetes(
        slurm, kube_world, tmp_path / "kube", request_timeout=120, replace={"strategy": "cluster-api"}
    )
    config = {**kube, "store": {"lease": {"ttl": "2s", "renew_every": "0.5s"}}}  # acts once it lapses
    server = pitcrew_factory("k8s-crash-replace", config=config, simulated=False).start()
    incident_id = open_incident(server, delivery("xid79-firing.json", node=node))

    def deletes() -> list[Any]:
        return [e for e in kube_world.log() if e.verb == "delete"]

    wait_until(lambda: [d.status for d in deletes()] == [200], timeout=60, interval=0.05, what="the delete")
    server.kill()
    server.start()
    final = server.wait_incident(incident_id, "resolved", "failed", timeout=90)
    assert final["state"] == "resolved", final["outcome"]
    assert [(d.resource, d.status) for d in deletes()] == [("machines", 200)]  # once, across the crash
    replaced = step_result(final, "replace")
    # The handle was recorded before the delete: the answer never came, the node is gone, and yet
    # wait_ready knew what to look for.
    assert replaced["issued"] is True and replaced["assumed"] is False
    assert replaced["handle"].startswith("cluster-api machine/gpu-east/gpu-east-gpu-h100-x7b2n-m1 ")
    assert step_result(final, "wait_ready")["node"].startswith(f"{node}-")
    # The start time read before the intent, persisted with it, outlived the crash: the wait ended
    # once the successor's slurmd had registered the Slurm node again.
    assert [s["slurm_node"] for s in replaced["slurmd_before"]] == [node]
    assert hosts.error is None and hosts.moves == [(node, "stop"), (node, "start")], hosts.moves
