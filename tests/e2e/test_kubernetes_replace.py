"""The whole ``replace-node`` playbook on real Slurm and the Kubernetes API emulator together.

pitcrew is the real ``python -m bot.cli serve`` (mode auto, ``integrations.cluster: kubernetes``,
``kubernetes.replace.strategy: cluster-api``), reaching the emulator over HTTP through a kubeconfig
and the session's real Slurm cluster. Kubernetes node names are the Slurm node names. On the faulty
node the emulator holds a DaemonSet pod, a mirror pod and a training worker whose budget
(minAvailable 1) refuses its eviction until the second worker turns Ready a while later, and the API
server misbehaves once each way (a read that times out, a 500 and a 409 on the cordon write, a 429
on the pod list, a 500 on the Machine delete): every one is retried within its step's budget.

Shown: Slurm DOWN with pitcrew's reason → cordon (after the DOWN) → drain (429 from the budget, then
201; the DaemonSet and mirror pods stay) → the node's Machine deleted exactly once → the MachineSet
stand-in's new node appears NotReady and turns Ready → validation Job on it → RESUME → the training job confirmed resumed
from its checkpoint elsewhere → closed.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

import pytest

from bot.integrations.kubernetes.jobs import job_name
from proving_ground.kubernetes.faults import Fault
from proving_ground.kubernetes.host_slurmds import HostSlurmds
from proving_ground.kubernetes.world import (
    KubeWorld,
    gpu_fleet,
    karpenter_fleet,
    pod_ready,
    pods_like_the_fixture,
)
from proving_ground.slurm import SlurmCluster
from tests.e2e.kube_config import slurm_and_kubernetes
from tests.e2e.slurm_engine import action_at, open_incident, training_on_a_node
from tests.harness.proc import wait_until
from tests.harness.scenarios import delivery, events, step_result

pytestmark = pytest.mark.slow

PDB_HOLD = 2.0  # seconds the budget keeps refusing after the first refusal


def test_replace_node_on_slurm_and_kubernetes(
    slurm: SlurmCluster,
    pitcrew_factory: Any,
    kube_world: KubeWorld,
    host_slurmds: Callable[..., HostSlurmds],
    tmp_path: Any,
) -> None:
    kube_world.call(lambda e: gpu_fleet(e, list(slurm.nodes)))
    hosts = host_slurmds()

    def slow_machineset(e: Any) -> None:
        e.replace_delay, e.ready_delay = 1.0, 2.0

    kube_world.call(slow_machineset)
    job_id, node = training_on_a_node(slurm)
    elsewhere = next(n for n in slurm.nodes if n != node)
    kube_world.call(lambda e: pods_like_the_fixture(e, node, elsewhere))
    flaky = [  # the API server misbehaves once at each of these
        Fault(None, verb="get", resource="nodes", name=node, delay=3.0),  # a timeout (request_timeout 1.5 s)
        Fault(500, verb="patch", resource="nodes", name=node),
        Fault(409, verb="patch", resource="nodes", name=node),
        Fault(429, verb="list", resource="pods", retry_after=1),
        Fault(500, verb="delete", resource="machines"),  # the client retries its own DELETE
    ]
    kube_world.call(lambda e: [e.faults.add(f) for f in flaky])

    validation = tmp_path / "dcgm-diag-job.yaml"
    validation.write_text(
        "spec:\n  template:\n    spec:\n      containers:\n"
        "        - {name: diag, image: nvcr.io/nvidia/cloud-native/dcgm:3.3.9-1-ubuntu22.04, command: [dcgmi, diag, -r, '2']}\n"
    )
    config = slurm_and_kubernetes(
        slurm,
        kube_world,
        tmp_path / "kube",
        never_drain_namespaces=[],
        request_timeout=1.5,
        replace={"strategy": "cluster-api"},
        jobs={"validation_template": str(validation)},
    )
    server = pitcrew_factory("k8s-replace", config=config, simulated=False).start()
    incident_id = open_incident(server, delivery("xid79-firing.json", node=node))

    def refused() -> bool:
        return any(e.subresource == "eviction" and e.status == 429 for e in kube_world.log())

    wait_until(refused, timeout=60, interval=0.1, what="the budget to refuse the worker's eviction")
    first_refusal = time.time()
    time.sleep(PDB_HOLD)
    kube_world.call(lambda e: pod_ready(e, "training", "llama-pretrain-worker-1"))

    final = server.wait_incident(incident_id, "resolved", "failed", timeout=180)
    assert final["state"] == "resolved", final["outcome"]
    assert final["playbook"] == "replace-node"

    log = kube_world.log()
    assert kube_world.call(lambda e: [f.hits for f in e.faults.faults or []]) == [1] * len(flaky)
    retried = {e["step"] for e in final["events"] if e["kind"] == "step_retry"}
    assert {"cordon", "drain"} <= retried, retried
    evictions = [(e.name, e.status) for e in log if e.subresource == "eviction"]
    assert ("llama-pretrain-worker-0", 429) in evictions and evictions[-1] == ("llama-pretrain-worker-0", 201)
    assert {name for name, _ in evictions} == {"llama-pretrain-worker-0"}  # DaemonSet and mirror pods stay
    assert kube_world.call(lambda e: e.get("pods", f"node-exporter-{node}", "monitoring")) is not None
    assert kube_world.call(lambda e: e.get("pods", f"gpu-health-agent-{node}", "kube-system")) is not None
    deleted = [(e.resource, e.name, e.status) for e in log if e.verb == "delete"]
    machine = f"gpu-east-gpu-h100-x7b2n-m{slurm.nodes.index(node)}"
    assert deleted == [("machines", machine, 500), ("machines", machine, 200)]  # one delete that landed
    cordons = [e for e in log if e.verb == "patch" and e.resource == "nodes" and e.name == node]
    assert cordons and all(e.user_agent.startswith("pitcrew/") for e in cordons)

    new_nodes = kube_world.call(
        lambda e: {
            n["metadata"]["name"]: [c["status"] for c in n["status"]["conditions"] if c["type"] == "Ready"]
            for (kind, _, _), n in e.objects.items()
            if kind == "nodes" and n["metadata"]["name"].startswith(f"{node}-")
        }
    )
    [(new_node, ready)] = new_nodes.items()
    assert ready == ["True"]
    assert step_result(final, "wait_ready")["node"] == new_node
    assert step_result(final, "wait_ready")["validated"] is True
    diag_job = job_name("validation", incident_id, new_node, "replace-node")
    diag = kube_world.call(lambda e: e.get("jobs", diag_job, "pitcrew-jobs"))
    assert diag is not None
    assert diag["spec"]["template"]["spec"]["nodeName"] == new_node and diag["status"]["succeeded"] == 1
    assert step_result(final, "replace")["handle"].startswith("cluster-api machine/gpu-east/")

    order = [action_at(final, a) for a in ("slurm_down", "cordon", "evict", "replace", "slurm_resume")]
    assert order == sorted(order), order
    assert action_at(final, "evict") >= first_refusal + PDB_HOLD - 0.5
    [job] = step_result(final, "confirm_resumed")["jobs"]
    assert job["job_id"] == job_id and job["status"] == "resumed", job
    assert not slurm.node(node).down
    # The successor's slurmd registered the Slurm node again before pitcrew returned it.
    assert hosts.error is None and hosts.moves == [(node, "stop"), (node, "start")], hosts.moves
    print(
        f"\n[k8s-replace] {incident_id}: node {node} → {new_node}; evictions {evictions}; "
        f"closed {final['closed_at']}"
    )


REPLACE_STEPS = ["notify", "slurm_down", "cordon", "drain", "replace", "wait_ready", "slurm_resume",
                 "confirm_resumed", "close"]  # fmt: skip


@pytest.mark.parametrize("force", [True, False], ids=["force-allowed", "force-refused"])
def test_replace_a_dead_node_whose_pods_stay_terminating(
    slurm: SlurmCluster,
    pitcrew_factory: Any,
    kube_world: KubeWorld,
    host_slurmds: Callable[..., HostSlurmds],
    tmp_path: Any,
    force: bool,
) -> None:
    """The node's kubelet is gone: Ready Unknown, the ``unreachable`` taints, and the taint manager
    has marked its pods for deletion, which no kubelet will ever confirm. With the policy allowing
    it, the drain force-deletes them and the replacement goes ahead; without it, the drain escalates
    at once naming them (not after its 15-minute deadline)."""
    kube_world.call(lambda e: gpu_fleet(e, list(slurm.nodes)))
    job_id, node = training_on_a_node(slurm)
    elsewhere = next(n for n in slurm.nodes if n != node)
    kube_world.call(lambda e: pods_like_the_fixture(e, node, elsewhere))
    kube_world.call(lambda e: e.kubelet_gone(node))
    host_slurmds()
    site = slurm_and_kubernetes(
        slurm,
        kube_world,
        tmp_path / "kube",
        never_drain_namespaces=[],
        request_timeout=1.5,
        replace={"strategy": "cluster-api"},
        force_delete_not_ready=force,
    )
    steps: list[Any] = [
        {"step": "drain", "options": {"force_delete_on_dead_node": True}} if s == "drain" else s
        for s in REPLACE_STEPS
    ]
    config = {**site, "playbooks": {"replace-node": {"steps": steps}}}
    server = pitcrew_factory("k8s-dead-node", config=config, simulated=False).start()
    incident_id = open_incident(server, delivery("xid79-firing.json", node=node))
    final = server.wait_incident(incident_id, "resolved", "failed", timeout=180)
    log = kube_world.log()
    forced = [(e.name, e.status) for e in log if e.verb == "delete" and e.resource == "pods"]
    if not force:
        assert final["state"] == "failed", final["outcome"]
        text = json.dumps(final["events"])
        assert "llama-pretrain-worker-0" in text and "not Ready" in text, text
        assert forced == [] and not [e for e in log if e.resource == "machines" and e.verb == "delete"]
        return
    assert final["state"] == "resolved", final["outcome"]
    assert ("llama-pretrain-worker-0", 200) in forced
    assert kube_world.call(lambda e: e.get("pods", "llama-pretrain-worker-0", "training")) is None
    assert step_result(final, "replace")["handle"].startswith("cluster-api machine/gpu-east/")
    [job] = step_result(final, "confirm_resumed")["jobs"]
    assert job["job_id"] == job_id and job["status"] == "resumed", job


LIMITED = 'all available instance types exceed limits for nodepool: "gpu-h100"'


def test_replace_through_karpenter_with_slurmd_as_a_daemonset(
    slurm: SlurmCluster,
    pitcrew_factory: Any,
    kube_world: KubeWorld,
    host_slurmds: Callable[..., HostSlurmds],
    tmp_path: Any,
) -> None:
    """Karpenter launches a node only for a pending pod, and slurmd run as a DaemonSet pod is never
    pending: deleting the NodeClaim alone would replace nothing. pitcrew's placeholder pod (the
    node's GPUs, its NodePool) is that demand; the successor is the new NodeClaim's node, guarded
    with ``karpenter.sh/do-not-disrupt`` before the placeholder goes (holding only DaemonSet pods it
    is empty to Karpenter's consolidation), and the Slurm job resumes from its checkpoint. Karpenter
    first finds nothing to launch (a NodePool limit): the wait says so in Karpenter's words, and goes
    on once Karpenter launches."""
    kube_world.call(lambda e: karpenter_fleet(e, list(slurm.nodes)))
    kube_world.call(lambda e: setattr(e, "karpenter_cannot_launch", LIMITED))
    host_slurmds()
    job_id, node = training_on_a_node(slurm)
    site = slurm_and_kubernetes(
        slurm, kube_world, tmp_path / "kube", request_timeout=1.5, replace={"strategy": "karpenter"}
    )
    config = {**site, "playbooks": {"replace-node": {"steps": REPLACE_STEPS}}}
    server = pitcrew_factory("k8s-karpenter", config=config, simulated=False).start()
    incident_id = open_incident(server, delivery("xid79-firing.json", node=node))

    def karpenter_said() -> list[str]:
        waits = events(server.incident(incident_id), "step_waiting", "wait_ready")
        return [e["detail"] for e in waits if "Karpenter: " in e["detail"]]

    wait_until(
        karpenter_said, timeout=90, interval=0.2, what="the wait to say why Karpenter launches nothing"
    )
    assert karpenter_said()[0].endswith(f"; Karpenter: Failed to schedule pod, {LIMITED}"), karpenter_said()
    kube_world.call(lambda e: setattr(e, "karpenter_cannot_launch", None))  # the limit raised
    final = server.wait_incident(incident_id, "resolved", "failed", timeout=180)
    assert final["state"] == "resolved", final["outcome"]

    claim = f"gpu-h100-k{slurm.nodes.index(node)}"
    assert step_result(final, "replace")["handle"].startswith(f"karpenter nodeclaim/{claim} ")
    log = kube_world.log()
    assert not [e for e in log if e.subresource == "eviction" and e.name == f"slurmd-{node}"]  # a DaemonSet's
    new_node = step_result(final, "wait_ready")["node"]
    state: dict[str, Any] = kube_world.call(
        lambda e: {
            "node": e.get("nodes", new_node),
            "claims": [c["status"]["nodeName"] for (k, _, _), c in e.objects.items() if k == "nodeclaims"],
            "placeholder": e.get("pods", f"pitcrew-successor-{claim}", "pitcrew-jobs"),
            "consolidated": list(e.consolidated),
        }
    )
    assert state["node"] is not None and state["consolidated"] == []
    assert state["node"]["metadata"]["annotations"]["karpenter.sh/do-not-disrupt"] == "true"
    assert new_node in state["claims"] and node not in state["claims"]
    assert state["placeholder"] is None
    [job] = step_result(final, "confirm_resumed")["jobs"]
    assert job["job_id"] == job_id and job["status"] == "resumed", job


def test_a_reboot_returns_the_slurm_node_only_once_its_rebooted_slurmd_registered(
    slurm: SlurmCluster,
    pitcrew_factory: Any,
    kube_world: KubeWorld,
    host_slurmds: Callable[..., HostSlurmds],
    tmp_path: Any,
) -> None:
    """``reboot-node`` under ``identity``: pitcrew's reboot Job takes the node down (the emulator: a
    new boot id, the Job's pod gone with the node) and the machine's slurmd starts again 3 s into
    the boot (``HostSlurmds``). slurmctld answers for the old slurmd all along (``SlurmdTimeout``
    300 s, the default): the Slurm node is never NOT_RESPONDING, and only a ``SlurmdStartTime``
    other than the one Slurm reported before the reboot tells pitcrew the new slurmd registered.
    It RESUMEs the node after that, not before (a RESUME before would be undone by the new slurmd's
    registration, "Node unexpectedly rebooted": node_mgr.c ``validate_node_specs``)."""
    kube_world.call(lambda e: gpu_fleet(e, list(slurm.nodes)))
    hosts = host_slurmds(boot_seconds=3.0)
    node = slurm.nodes[2]
    before = slurm.node(node).slurmd_started_at
    reboot = tmp_path / "reboot-job.yaml"
    reboot.write_text(
        "spec:\n  template:\n    spec:\n      hostPID: true\n      containers:\n"
        "        - {name: reboot, image: busybox, command: [sh, -c, 'chroot /host systemctl reboot'],"
        " securityContext: {privileged: true}}\n"
    )
    site = slurm_and_kubernetes(
        slurm, kube_world, tmp_path / "kube", request_timeout=1.5, jobs={"reboot_template": str(reboot)}
    )
    config = {
        **site,
        "engine": {"poll_interval": "1s"},
        "catalog": {"overrides": {"79": {"playbook": "reboot-node"}}},
    }
    server = pitcrew_factory("k8s-reboot", config=config, simulated=False).start()
    incident_id = open_incident(server, delivery("xid79-firing.json", node=node))
    final = server.wait_incident(incident_id, "resolved", "failed", timeout=90)
    assert final["state"] == "resolved", final["outcome"]
    assert hosts.error is None and hosts.moves == [(node, "stop"), (node, "start")], hosts.moves
    resumed = action_at(final, "slurm_resume")
    assert resumed >= hosts.started[node], (resumed, hosts.started)
    waits = [e["detail"] for e in events(final, "step_waiting", "wait_ready")]
    assert f"slurmd on {node} has not registered again since the reboot" in waits, waits
    [seen] = step_result(final, "reboot")["slurmd_before"]
    assert seen["slurm_node"] == node and seen["started_at"] is not None
    after = slurm.node(node)
    assert after.slurmd_started_at != before and not after.taken_out, after
