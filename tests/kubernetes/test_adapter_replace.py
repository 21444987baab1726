"""Each replacement strategy through the real client against the emulator, and what replaced the node.

Cases, per strategy: ``cluster-api`` deletes the node's Machine (its MachineSet stand-in makes a new
Machine and Node), ``karpenter`` deletes the NodeClaim, ``delete-node`` runs its provider action
(terminating the instance: the cloud group stand-in brings a new one) and deletes the Node; deleting
a Node alone replaces nothing, so ``delete-node`` without that action is refused; each writes its handle on the node before the delete,
reports the replacement started, and ``successor`` finds the new fleet node of the same pool once it
is Ready. ``command`` runs the operator's executable with the node and incident in its environment,
its exit code the result; ``none`` hands the node to humans. Another system already repairing the
node (a Karpenter disruption taint, a cluster-autoscaler taint, a Machine someone else deletes) is
named by ``repair_owner``; then pitcrew deletes nothing (strategy ``watch`` only marks the node) and
follows that system's replacement to the new node. While Cluster API is paused for the Machine (its
Cluster's ``spec.paused``, its own paused annotation) pitcrew deletes nothing and fails the attempt as
one to retry, naming the pause. A replacement not yet started can be cancelled,
a started one cannot. A delete that landed but whose answer was lost (500) is retried by the client
and found done (404, or the Machine still deleting), not reported as a failure. The successor is
the node the new Machine (``status.nodeRef``) or NodeClaim (``status.nodeName``) became, not a
node merely alike: two replacements in one MachineSet at once, with an unrelated scale-up in the
same pool, each get a different new Machine's node and never the scale-up. Karpenter launches a
node only for a pending pod (a manual NodeClaim delete starts nothing, and DaemonSet-mode slurmd
pods are never pending): pitcrew's placeholder pod, asking for the node's GPUs in its NodePool, is
that demand; its node is the successor, and it is removed once that node is Ready. A placeholder
the scheduler bound to an existing node (one with the GPUs free) is no demand: the wait fails at
once, naming the node, and removes it, unless a NodeClaim of the pool made since is launching; so
does a placeholder found gone with no successor. Karpenter's own word on why it launches nothing
for the placeholder (its FailedScheduling) is what ``held_up`` says, the scheduler's is not. A
StatefulSet-mode NodeSet (Slinky's default) makes the slurmd pod the drain evicted again, pending:
that pod is the demand, pitcrew adds no placeholder, and the successor is the node it lands on; so
too when the NodeSet has not made it again yet (the drain's record names it): the wait says so.
Karpenter's termination of the old node held by pods it may not evict (a budget, ``do-not-disrupt``)
is said by ``termination_held``, naming them, while the successor comes all the same; so is Cluster
API's deletion of the old Machine held by its drain (a budget) or a delete hook, quoting its
``Deleting`` condition, while no successor comes (its MachineSet counts the deleting Machine); before
Cluster API v1.9, which writes v1beta1 conditions only (its drain's naming no pod), from those and
the pods left on the node, with the same bounds; where both are written ``Deleting`` alone is told.
A DaemonSet-mode NodeSet (the fixture's) makes its slurmd pod on the replacement named after the new
node, which carries no ``hostname-override``: pitcrew's ``slinky`` mapping finds that new Slurm name
on the successor.
"""

from __future__ import annotations

import asyncio
import copy
import sys
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from kubernetes.aio import client
from pydantic import ValidationError

from bot.config import KubernetesSettings, Settings
from bot.domain.ownership import REPLACE_ANNOTATION
from bot.engine.errors import PermanentError, Reason, TransientError
from bot.engine.ports import ClusterNode, OldNodeLook, PodRef
from bot.integrations.kubernetes import KubernetesCluster
from bot.runtime import slurm_names_for
from proving_ground.kubernetes.emulator import KubeEmulator, load_fixture, now_iso
from proving_ground.kubernetes.world import (
    cluster_api_release,
    do_not_disrupt_pod,
    gpu_fleet,
    nodeclaim_grace_period,
    pods_karpenter_may_not_evict,
    statefulset_slurmd,
    training_pdb,
    volume_attached,
)
from proving_ground.proc import eventually

NODE = "gpu-node-02"
INCIDENT = "pc-00042"
PAUSED = "cluster.x-k8s.io/paused"


async def _successor(
    cluster: KubernetesCluster, handle: str, name: str = NODE, within: float = 5.0
) -> ClusterNode:
    """The Ready node serving in ``name``'s place, never ``name`` itself: a handle's time is kept to
    the second, so a node made moments ago reads as made since its own replacement began until it
    is gone, and is passed over."""

    async def ready() -> ClusterNode | None:
        node = await cluster.successor(name, handle=handle)
        return node if node is not None and node.ready and node.name != name else None

    return await eventually(ready, timeout=within, what=f"a Ready successor of {name}", interval=0.05)


@pytest.mark.parametrize(
    ("strategy", "deleted"),
    [("cluster-api", "machines"), ("karpenter", "nodeclaims"), ("delete-node", "nodes")],
)
async def test_a_strategy_deletes_its_handle_once_and_a_new_node_comes(
    make_cluster: Callable[..., KubernetesCluster], k8s: KubeEmulator, strategy: str, deleted: str
) -> None:
    # delete-node's provider action: the cloud's terminate, after which the instance group replaces it.
    terminate = [sys.executable, "-m", "proving_ground.kubernetes.cloud", k8s.host]
    cluster = make_cluster(replace={"strategy": strategy, "command": terminate})
    k8s.ready_delay = 0.3
    k8s.replace_delay = 1.0  # cloud-controller-manager removes the terminated instance's Node after pitcrew
    assert not await cluster.replacement_started(NODE, incident_id=INCIDENT)
    assert await cluster.repair_owner(NODE) is None
    handle = await cluster.replace(NODE, strategy="configured", incident_id=INCIDENT)
    assert handle.startswith(f"{strategy} ") and "pool=node.cluster.x-k8s.io/pool=gpu-h100" in handle
    deletes = [e for e in k8s.log if e.verb == "delete"]
    assert [(e.resource, e.status) for e in deletes] == [(deleted, 200)]
    annotate = [e for e in k8s.log if e.verb == "patch" and e.resource == "nodes"]
    assert annotate and k8s.log.index(annotate[0]) < k8s.log.index(deletes[0])  # the mark goes on first
    assert await cluster.replacement_started(NODE, incident_id=INCIDENT)
    assert await cluster.repair_owner(NODE) is None  # pitcrew's own replacement, not someone else's
    assert not await cluster.cancel_replacement(NODE, incident_id=INCIDENT)
    new = await _successor(cluster, handle)
    assert new.name.startswith(f"{NODE}-") and new.gpus == 8 and not new.unschedulable
    assert k8s.get("nodes", NODE) is None
    assert k8s.terminated == ([NODE] if strategy == "delete-node" else [])


@pytest.mark.parametrize(
    "served",
    [("v1beta2", "v1beta1"), ("v1beta2",), ("v1beta1",)],
    ids=["capi-1.11-to-1.15", "capi-1.16-on", "capi-before-1.11"],
)
async def test_cluster_api_machines_are_read_and_deleted_in_the_version_served(
    make_cluster: Callable[..., KubernetesCluster], k8s: KubeEmulator, served: tuple[str, ...]
) -> None:
    """Cluster API serves v1beta2 from v1.11, and v1beta2 alone from v1.16 (April 2027): there a
    v1beta1 path answers 404, which a delete took for a Machine gone already, and the replacement
    then waited for a node that nothing was making. The Machine is read, deleted and listed in the
    first version served (v1beta2 where it is), the group's discovery asked once; a MachineHealthCheck's
    remediation is seen in either shape of its conditions."""
    k8s.capi_versions = served
    k8s.ready_delay = 0.3
    cluster = make_cluster(replace={"strategy": "cluster-api"})
    k8s.machine_health_check_fails("gpu-east", "gpu-east-gpu-h100-x7b2n-q4v9k")
    owner = await cluster.repair_owner(NODE)
    assert owner is not None and "OwnerRemediated False, WaitingForRemediation" in owner, owner
    handle = await cluster.replace(NODE, strategy="watch", incident_id=INCIDENT)
    k8s.machine_set_remediates("gpu-east", "gpu-east-gpu-h100-x7b2n-q4v9k")
    new = await _successor(cluster, handle)
    machines = [e for e in k8s.log if e.resource == "machines"]
    assert machines and {e.path.split("/")[3] for e in machines} == {served[0]}
    assert machines[0].status == 200  # read while it stood (404 once its MachineSet removed it)
    # A replacement of pitcrew's own on the successor: its Machine deleted in that version, once.
    k8s.log.clear()
    again = await cluster.replace(new.name, strategy="cluster-api", incident_id="pc-00043")
    deletes = [
        (e.path.split("/")[3], e.status) for e in k8s.log if e.verb == "delete" and e.resource == "machines"
    ]
    assert deletes == [(served[0], 200)]
    assert (await _successor(cluster, again, new.name)).name != new.name
    assert k8s.capi_discovered == (["v1beta2"] if "v1beta2" in served else ["v1beta2", "v1beta1"])


def test_delete_node_without_its_provider_action_is_refused_by_the_configuration() -> None:
    with pytest.raises(ValidationError, match="delete-node needs command"):
        KubernetesSettings.model_validate({"replace": {"strategy": "delete-node"}})


async def test_delete_node_asked_by_a_playbook_without_a_provider_action_writes_nothing(
    cluster: KubernetesCluster, k8s: KubeEmulator
) -> None:
    with pytest.raises(PermanentError, match=r"needs kubernetes\.replace\.command") as err:
        await cluster.replace(NODE, strategy="delete-node", incident_id=INCIDENT)
    assert err.value.reason == Reason.MISCONFIGURED
    assert [e.verb for e in k8s.log if e.verb != "get"] == [] and k8s.get("nodes", NODE) is not None


async def test_a_marked_replacement_that_never_left_can_be_cancelled(
    make_cluster: Callable[..., KubernetesCluster], k8s: KubeEmulator
) -> None:
    cluster = make_cluster(replace={"strategy": "cluster-api"})
    k8s.inject(500, verb="delete", resource="machines", times=10)  # the delete never lands
    with pytest.raises(Exception, match="500"):
        await cluster.replace(NODE, strategy="configured", incident_id=INCIDENT)
    assert REPLACE_ANNOTATION in k8s.get("nodes", NODE)["metadata"]["annotations"]  # type: ignore[index]
    assert not await cluster.replacement_started(NODE, incident_id=INCIDENT)
    assert await cluster.cancel_replacement(NODE, incident_id=INCIDENT)
    assert REPLACE_ANNOTATION not in k8s.get("nodes", NODE)["metadata"]["annotations"]  # type: ignore[index]


async def test_the_command_strategy_runs_the_operator_script(
    make_cluster: Callable[..., KubernetesCluster], tmp_path: Path
) -> None:
    out = tmp_path / "env.txt"
    script = tmp_path / "replace.py"
    script.write_text(
        "import os, sys\n"
        f"open({str(out)!r}, 'w').write(os.environ['PITCREW_NODE'] + ' ' + os.environ['PITCREW_INCIDENT'])\n"
        "sys.exit(int(sys.argv[1]))\n"
    )
    ok = make_cluster(replace={"strategy": "command", "command": [sys.executable, str(script), "0"]})
    handle = await ok.replace(NODE, strategy="configured", incident_id=INCIDENT)
    assert handle.startswith("command ") and out.read_text() == f"{NODE} {INCIDENT}"
    assert await ok.replacement_started(NODE, incident_id=INCIDENT)
    failing = make_cluster(replace={"strategy": "command", "command": [sys.executable, str(script), "3"]})
    with pytest.raises(PermanentError, match="exited 3") as err:
        await failing.replace(NODE, strategy="configured", incident_id="pc-00043")
    assert err.value.reason == "command_failed"


async def test_strategy_none_hands_the_node_to_humans(cluster: KubernetesCluster, k8s: KubeEmulator) -> None:
    with pytest.raises(PermanentError) as err:
        await cluster.replace(NODE, strategy="configured", incident_id=INCIDENT)
    assert err.value.reason == Reason.NOT_ALLOWED
    assert not [e for e in k8s.log if e.verb in ("patch", "delete")]


@pytest.mark.parametrize(
    ("taint", "who"),
    [
        ("karpenter.sh/disrupted", "karpenter"),
        ("karpenter.sh/disruption", "karpenter"),
        ("ToBeDeletedByClusterAutoscaler", "cluster-autoscaler"),
    ],
)
async def test_another_repairer_taint_is_named(
    cluster: KubernetesCluster, k8s: KubeEmulator, taint: str, who: str
) -> None:
    node = k8s.get("nodes", NODE)
    assert node is not None
    node["spec"]["taints"].append({"key": taint, "effect": "NoSchedule"})
    k8s.bump(node)
    owner = await cluster.repair_owner(NODE)
    assert owner is not None and owner.startswith(who) and taint in owner


async def test_a_machine_someone_else_deletes_is_named(
    make_cluster: Callable[..., KubernetesCluster], k8s: KubeEmulator
) -> None:
    cluster = make_cluster(replace={"strategy": "cluster-api"})
    k8s.replace_delay = 30  # the MachineSet has not acted yet
    machine = k8s.get("machines", "gpu-east-gpu-h100-x7b2n-q4v9k", "gpu-east")
    assert machine is not None
    machine["metadata"]["deletionTimestamp"] = "2026-11-29T08:49:10Z"
    k8s.bump(machine)
    assert (
        await cluster.repair_owner(NODE) == "cluster-api (Machine gpu-east-gpu-h100-x7b2n-q4v9k is deleting)"
    )


async def test_another_systems_replacement_is_watched_not_repeated(
    make_cluster: Callable[..., KubernetesCluster], k8s: KubeEmulator, k8s_client: client.ApiClient
) -> None:
    cluster = make_cluster(replace={"strategy": "karpenter"})
    node = k8s.get("nodes", NODE)
    assert node is not None
    node["spec"]["taints"].append({"key": "karpenter.sh/disrupted", "effect": "NoSchedule"})
    k8s.bump(node)
    assert (await cluster.repair_owner(NODE) or "").startswith("karpenter")
    handle = await cluster.replace(NODE, strategy="watch", incident_id=INCIDENT)
    assert handle.startswith("watch ")
    assert not [e for e in k8s.log if e.verb == "delete"]  # pitcrew deleted nothing
    assert await cluster.replacement_started(NODE, incident_id=INCIDENT)
    # Karpenter goes on with its own replacement (a request that is not pitcrew's): a disruption
    # launches the replacement NodeClaim itself, unlike a manual delete.
    k8s.karpenter_replaces_deleted_claims = True
    await client.CustomObjectsApi(k8s_client).delete_cluster_custom_object(
        "karpenter.sh", "v1", "nodeclaims", "gpu-h100-x7k2q"
    )
    new = await _successor(cluster, handle)
    assert new.name.startswith(f"{NODE}-")


async def test_a_machine_a_machinehealthcheck_remediates_is_watched_not_deleted_again(
    make_cluster: Callable[..., KubernetesCluster], k8s: KubeEmulator
) -> None:
    """Cluster API's MachineHealthCheck found the Machine unhealthy (``OwnerRemediated`` False): its
    MachineSet is about to delete it and make another. pitcrew names that, deletes nothing, and
    follows the new Machine's node."""
    cluster = make_cluster(replace={"strategy": "cluster-api"})
    k8s.replace_delay = 0.3
    k8s.machine_health_check_fails("gpu-east", "gpu-east-gpu-h100-x7b2n-q4v9k")
    owner = await cluster.repair_owner(NODE)
    assert owner == (
        "cluster-api MachineHealthCheck (Machine gpu-east-gpu-h100-x7b2n-q4v9k is marked for remediation "
        "by its owner: OwnerRemediated False, WaitingForRemediation)"
    )
    handle = await cluster.replace(NODE, strategy="watch", incident_id=INCIDENT)
    k8s.machine_set_remediates("gpu-east", "gpu-east-gpu-h100-x7b2n-q4v9k")  # once pitcrew watches
    new = await _successor(cluster, handle)
    assert new.name.startswith(f"{NODE}-")
    assert [(e.resource, e.user_agent.startswith("pitcrew/")) for e in k8s.log if e.verb == "delete"] == []


async def test_a_node_read_just_before_cluster_api_removed_it_is_not_taken_for_repaired_in_place(
    make_cluster: Callable[..., KubernetesCluster], k8s: KubeEmulator
) -> None:
    """Cluster API ends a remediation by deleting the Node, then letting the Machine go (its
    finalizer): read between the two, the Node is still there and its Machine already gone. That is
    not a node repaired in place — it is the old node, about to be deleted (a CI run took it for the
    successor)."""
    cluster = make_cluster(replace={"strategy": "cluster-api"})
    k8s.replace_delay = 30  # the MachineSet makes the new Machine only when the test says
    machine = "gpu-east-gpu-h100-x7b2n-q4v9k"
    k8s.machine_health_check_fails("gpu-east", machine)
    handle = await cluster.replace(NODE, strategy="watch", incident_id=INCIDENT)

    def cluster_api_finishes() -> None:  # between pitcrew's read of the Node and of its Machine
        del k8s.objects[("nodes", None, NODE)]
        del k8s.objects[("machines", "gpu-east", machine)]

    k8s.inject(None, verb="get", resource="machines", before=cluster_api_finishes)
    assert await cluster.successor(NODE, handle=handle) is None


@pytest.mark.parametrize(
    ("by", "said"),
    [
        ("cluster", "its Cluster gpu-east/gpu-east is paused (spec.paused: true)"),
        ("annotation", "it carries the cluster.x-k8s.io/paused annotation"),
    ],
)
async def test_a_paused_cluster_api_is_not_given_a_machine_to_delete(
    make_cluster: Callable[..., KubernetesCluster],
    k8s: KubeEmulator,
    k8s_client: client.ApiClient,
    by: str,
    said: str,
) -> None:
    """Cluster API's Machine controller does nothing while the Machine's Cluster is paused or the
    Machine carries the paused annotation: a Machine deleted then stays deleting and no new one
    comes, so the replacement would wait out its whole budget for nothing. pitcrew deletes nothing,
    writes no mark, and fails the attempt as one to retry (the step backs off, then escalates),
    naming the pause; once unpaused the replacement goes ahead."""
    cluster = make_cluster(replace={"strategy": "cluster-api"})
    custom, merge = client.CustomObjectsApi(k8s_client), "application/merge-patch+json"
    where = ("cluster.x-k8s.io", "v1beta2", "gpu-east")
    target = ("clusters", "gpu-east") if by == "cluster" else ("machines", "gpu-east-gpu-h100-x7b2n-q4v9k")
    pause: dict[str, Any] = (
        {"spec": {"paused": True}} if by == "cluster" else {"metadata": {"annotations": {PAUSED: "true"}}}
    )
    await custom.patch_namespaced_custom_object(*where, *target, pause, _content_type=merge)
    k8s.log.clear()
    with pytest.raises(TransientError) as err:
        await cluster.replace(NODE, strategy="configured", incident_id=INCIDENT)
    assert err.value.reason == Reason.UNAVAILABLE
    assert str(err.value) == (
        f"Cluster API is paused for Machine gpu-east/gpu-east-gpu-h100-x7b2n-q4v9k of node {NODE}: "
        f"{said}; it would not replace the node until unpaused"
    )
    assert [e.verb for e in k8s.log if e.verb in ("patch", "delete")] == []
    assert not await cluster.replacement_started(NODE, incident_id=INCIDENT)
    unpause: dict[str, Any] = (
        {"spec": {"paused": None}} if by == "cluster" else {"metadata": {"annotations": {PAUSED: None}}}
    )
    await custom.patch_namespaced_custom_object(*where, *target, unpause, _content_type=merge)
    handle = await cluster.replace(NODE, strategy="configured", incident_id=INCIDENT)
    assert (await _successor(cluster, handle)).name.startswith(f"{NODE}-")


@pytest.mark.parametrize(("strategy", "resource"), [("delete-node", "nodes"), ("cluster-api", "machines")])
async def test_a_delete_whose_answer_was_lost_is_not_an_error(
    make_cluster: Callable[..., KubernetesCluster], k8s: KubeEmulator, strategy: str, resource: str
) -> None:
    k8s.replace_delay = 30  # keep the world still while the client retries
    k8s.inject(None, verb="delete", resource=resource, lost_answer=500)
    cluster = make_cluster(replace={"strategy": strategy, "command": ["true"]})
    handle = await cluster.replace(NODE, strategy="configured", incident_id=INCIDENT)
    assert handle.startswith(strategy)
    deletes = [e.status for e in k8s.log if e.verb == "delete"]
    assert deletes[0] == 500 and len(deletes) == 2  # the client's own retry found it done
    assert await cluster.replacement_started(NODE, incident_id=INCIDENT)


async def test_an_unknown_strategy_is_refused_before_anything_is_written(
    cluster: KubernetesCluster, k8s: KubeEmulator
) -> None:
    with pytest.raises(PermanentError, match="unknown replace strategy 'terraform'"):
        await cluster.replace(NODE, strategy="terraform", incident_id=INCIDENT)
    assert not [e for e in k8s.log if e.verb in ("patch", "delete")]


async def test_two_replacements_in_one_pool_each_bind_their_own_machines_node(
    make_cluster: Callable[..., KubernetesCluster], k8s: KubeEmulator
) -> None:
    gpu_fleet(k8s, ["gpu-a", "gpu-b"])  # Machines of the same MachineSet, nodes of the same pool
    cluster = make_cluster(replace={"strategy": "cluster-api"})
    handles = {
        name: await cluster.replace(name, strategy="configured", incident_id=f"pc-{name}")
        for name in ("gpu-a", "gpu-b")
    }
    assert all("owner=machineset/gpu-east/gpu-east-gpu-h100-x7b2n" in h for h in handles.values())
    # An unrelated scale-up in the same pool, Ready at once: alike in every label, made by no Machine of ours.
    scale_up = copy.deepcopy(k8s.get("nodes", NODE))
    assert scale_up is not None
    scale_up["metadata"]["name"] = "a-scale-up"
    scale_up["metadata"].pop("creationTimestamp", None)
    k8s.add("nodes", scale_up)
    found: dict[str, str] = {}
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 5.0
    while len(found) < 2 and loop.time() < deadline:
        for name, handle in handles.items():
            node = await cluster.successor(name, handle=handle)
            if node is not None and node.ready:
                found[name] = node.name
        await asyncio.sleep(0.05)
    assert len(found) == 2 and found["gpu-a"] != found["gpu-b"], found
    assert "a-scale-up" not in found.values()
    machines = [m for (kind, _, _), m in k8s.objects.items() if kind == "machines"]
    made = {m["status"]["nodeRef"]["name"] for m in machines}
    assert set(found.values()) <= made
    for name, successor in found.items():  # asked again, each keeps its own
        again = await cluster.successor(name, handle=handles[name])
        assert again is not None and again.name == successor


async def test_karpenter_replaces_a_node_only_for_pitcrews_pending_placeholder(
    make_cluster: Callable[..., KubernetesCluster], k8s: KubeEmulator, k8s_client: client.ApiClient
) -> None:
    # A manual delete alone: the Node goes with its NodeClaim and nothing comes back.
    await client.CustomObjectsApi(k8s_client).delete_cluster_custom_object(
        "karpenter.sh", "v1", "nodeclaims", "gpu-h100-x7k2q"
    )
    assert k8s.ready_delay is not None
    await asyncio.sleep(k8s.replace_delay + k8s.ready_delay + 0.2)  # let the stand-in's controllers run
    assert not [k for k in k8s.objects if k[0] in ("nodes", "nodeclaims")]


async def test_the_karpenter_strategy_creates_the_demand_and_removes_it_once_the_successor_is_ready(
    make_cluster: Callable[..., KubernetesCluster], k8s: KubeEmulator
) -> None:
    cluster = make_cluster(replace={"strategy": "karpenter"})
    handle = await cluster.replace(NODE, strategy="configured", incident_id=INCIDENT)
    assert "owner=nodepool/gpu-h100" in handle
    placeholder = k8s.get("pods", "pitcrew-successor-gpu-h100-x7k2q", "pitcrew-jobs")
    assert placeholder is not None
    spec = placeholder["spec"]
    assert spec["nodeSelector"] == {"karpenter.sh/nodepool": "gpu-h100"}
    assert spec["containers"][0]["resources"]["requests"] == {"nvidia.com/gpu": "8"}
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in spec["tolerations"]
    new = await _successor(cluster, handle)
    claims = [c for (kind, _, _), c in k8s.objects.items() if kind == "nodeclaims"]
    assert [c["status"]["nodeName"] for c in claims] == [new.name]
    assert k8s.get("pods", "pitcrew-successor-gpu-h100-x7k2q", "pitcrew-jobs") is None
    # With the placeholder gone the new node holds only DaemonSet pods: empty to Karpenter, whose
    # consolidation would take it but for the do-not-disrupt pitcrew put on before the placeholder went.
    await asyncio.sleep(k8s.karpenter_consolidate_after * 3)
    node = k8s.get("nodes", new.name)
    assert node is not None and k8s.consolidated == []
    assert node["metadata"]["annotations"]["karpenter.sh/do-not-disrupt"] == "true"
    guard, drop = (
        next(i for i, e in enumerate(k8s.log) if e.verb == "patch" and e.name == new.name and i > 0),
        next(i for i, e in enumerate(k8s.log) if e.verb == "delete" and e.resource == "pods"),
    )
    assert guard < drop


PLACEHOLDER = "pitcrew-successor-gpu-h100-x7k2q"


async def _slurmd_made_again(cluster: KubernetesCluster, k8s: KubeEmulator, slurmd: str) -> dict[str, Any]:
    """The drain's part: cordon, evict the slurmd pod; its NodeSet's new pod of the same name."""
    await cluster.cordon(NODE, incident_id=INCIDENT, reason="XID 79")
    old_uid = k8s.get("pods", slurmd, "slurm")["metadata"]["uid"]  # type: ignore[index]
    await cluster.evict(PodRef("slurm", slurmd, owner_kind="NodeSet"))

    async def made_again() -> dict[str, Any] | None:
        pod = k8s.get("pods", slurmd, "slurm")
        return pod if pod is not None and pod["metadata"]["uid"] != old_uid else None

    return await eventually(made_again, timeout=5.0, what="the NodeSet's new slurmd pod", interval=0.02)


async def test_karpenter_takes_a_statefulset_nodesets_pending_slurmd_pod_for_the_demand(
    make_cluster: Callable[..., KubernetesCluster], k8s: KubeEmulator
) -> None:
    """Slinky's default scaling mode (StatefulSet): the drain's eviction of the node's slurmd pod
    makes its NodeSet create it again under the same name (the Slurm node's), unbound; pending, it
    is already the demand Karpenter launches a node for. pitcrew adds none of its own (a placeholder
    asking for the node's 8 GPUs beside slurmd's 4 would launch a second node, left idle), and the
    successor is the node that pod lands on, where the Slurm node runs again."""
    slurmd = statefulset_slurmd(k8s)
    cluster = make_cluster(replace={"strategy": "karpenter"})
    again = await _slurmd_made_again(cluster, k8s, slurmd)
    assert not again["spec"].get("nodeName")  # pending: the old node is cordoned
    handle = await cluster.replace(NODE, strategy="configured", incident_id=INCIDENT, slurm_nodes=[slurmd])
    assert f"demand=pod/slurm/{slurmd}" in handle
    assert k8s.get("pods", PLACEHOLDER, "pitcrew-jobs") is None
    await _one_node_launched_where_it_lands(cluster, k8s, handle, slurmd)


async def _one_node_launched_where_it_lands(
    cluster: KubernetesCluster, k8s: KubeEmulator, handle: str, slurmd: str
) -> None:
    """The successor is the node Karpenter launched for the NodeSet's slurmd pod, which landed there,
    and Karpenter launched no other."""
    new = await _successor(cluster, handle)
    landed = k8s.get("pods", slurmd, "slurm")
    assert landed is not None and landed["spec"]["nodeName"] == new.name
    await asyncio.sleep(k8s.replace_delay + (k8s.ready_delay or 0) + 0.2)  # nothing else launches
    claims = [c for (kind, _, _), c in k8s.objects.items() if kind == "nodeclaims"]
    assert [c["status"]["nodeName"] for c in claims] == [new.name]


async def test_karpenter_takes_the_node_a_statefulset_nodesets_slurmd_pod_found_room_on(
    make_cluster: Callable[..., KubernetesCluster], k8s: KubeEmulator
) -> None:
    """The same, where a node of the pool had room: kube-scheduler placed the new slurmd pod there
    at once, nothing is pending and Karpenter launches nothing. That node is the successor; a
    placeholder (8 GPUs, 4 left there) would have launched a node no Slurm node ever runs on."""
    spare = copy.deepcopy(k8s.get("nodes", NODE))
    assert spare is not None
    spare["metadata"]["name"] = "gpu-node-03"
    spare["metadata"]["labels"].update(
        {"kubernetes.io/hostname": "gpu-node-03", "karpenter.sh/nodepool": "gpu-h100"}
    )
    slurmd = statefulset_slurmd(k8s)
    k8s.add("nodes", spare)
    cluster = make_cluster(replace={"strategy": "karpenter"})
    again = await _slurmd_made_again(cluster, k8s, slurmd)
    assert again["spec"].get("nodeName") == "gpu-node-03"
    handle = await cluster.replace(NODE, strategy="configured", incident_id=INCIDENT, slurm_nodes=[slurmd])
    assert k8s.get("pods", PLACEHOLDER, "pitcrew-jobs") is None
    new = await _successor(cluster, handle)
    assert new.name == "gpu-node-03"
    await asyncio.sleep(k8s.replace_delay + (k8s.ready_delay or 0) + 0.2)
    assert not [k for k in k8s.objects if k[0] == "nodeclaims"]  # the old one gone, none launched


async def test_karpenter_waits_for_the_slurmd_pod_its_statefulset_nodeset_has_not_made_again_yet(
    make_cluster: Callable[..., KubernetesCluster], k8s: KubeEmulator
) -> None:
    """The drain is done (the evicted slurmd pod is gone) but its NodeSet has not made it again yet:
    slurm-operator makes it on a sync after the old one is removed, which may come late. pitcrew
    knows the pod from the drain, so the replacement waits for that pod as its demand (said while
    it waits) and adds no placeholder: one would launch a node of its own, and then a second one
    for the slurmd pod, the first never running slurmd."""
    k8s.nodeset_recreate_delay = 1.0
    slurmd = statefulset_slurmd(k8s)
    cluster = make_cluster(replace={"strategy": "karpenter"})
    await cluster.cordon(NODE, incident_id=INCIDENT, reason="XID 79")
    drained = [p for p in await cluster.pods_on_node(NODE) if p.owner_kind == "NodeSet"]
    for pod in drained:
        await cluster.evict(pod)

    async def gone() -> bool:
        return k8s.get("pods", slurmd, "slurm") is None

    await eventually(gone, timeout=5.0, what="the evicted slurmd pod gone", interval=0.02)
    replicas = [p.ref for p in drained if p.nodeset_replica]  # what the drain step records
    assert replicas == [f"slurm/{slurmd}"]
    handle = await cluster.replace(
        NODE, strategy="configured", incident_id=INCIDENT, slurm_nodes=[slurmd], nodeset_pods=replicas
    )
    assert f"demand=pod/slurm/{slurmd}" in handle
    assert k8s.get("pods", PLACEHOLDER, "pitcrew-jobs") is None
    said = await cluster.held_up(NODE, handle=handle)
    assert said is not None and f"slurm/{slurmd}" in said and "NodeSet" in said, said
    await _one_node_launched_where_it_lands(cluster, k8s, handle, slurmd)


async def test_a_daemonset_nodesets_slurmd_pod_is_not_taken_for_one_made_again(
    make_cluster: Callable[..., KubernetesCluster], k8s: KubeEmulator
) -> None:
    """The fixture's slurmd pod (DaemonSet mode) is made again only on a new node, under a new name:
    the drain records no demand from it, and Karpenter's placeholder stays the demand."""
    cluster = make_cluster(replace={"strategy": "karpenter"})
    [slurmd] = [p for p in await cluster.pods_on_node(NODE) if p.owner_kind == "NodeSet"]
    assert not slurmd.nodeset_replica


@pytest.mark.parametrize("grace", [None, "1h0m0s"], ids=["no-grace-period", "grace-period"])
async def test_karpenter_termination_held_by_pods_it_may_not_evict_is_said_without_holding_the_successor(
    make_cluster: Callable[..., KubernetesCluster], k8s: KubeEmulator, grace: str | None
) -> None:
    """After the NodeClaim's delete Karpenter drains the old node, and a pod whose budget allows no
    eviction or that is annotated ``do-not-disrupt`` keeps it there (the instance billed): without
    ``spec.terminationGracePeriod`` for good. ``termination_held`` names each pod and why, and
    when, if ever, Karpenter forces them out; the successor comes all the same. Karpenter's
    ``FailedDraining`` names no refused pod (its recorder keeps the drain's "N pods are waiting"
    for two minutes), so the budgeted pod is named once it still stands a minute into the drain,
    nothing on the node terminating. Once they are gone the node goes: gone, nothing said."""
    nodeclaim_grace_period(k8s, grace)
    budgeted, annotated = pods_karpenter_may_not_evict(k8s)
    cluster = make_cluster(replace={"strategy": "karpenter"})
    await cluster.cordon(NODE, incident_id=INCIDENT, reason="XID 79")
    handle = await cluster.replace(NODE, strategy="configured", incident_id=INCIDENT)
    await _successor(cluster, handle)

    async def said() -> str | None:
        return (await cluster.termination_held(NODE, handle=handle)).held

    text = await eventually(said, timeout=5.0, what="the hold said", interval=0.05)
    assert f"pod {annotated} (annotated karpenter.sh/do-not-disrupt)" in text, text
    assert budgeted not in text, text  # not a minute into the drain yet: it may still go
    _drain_began(k8s, seconds_ago=90)
    text = await said() or ""
    assert f"pod {budgeted} (not evicted a minute into Karpenter's drain" in text, text
    assert f"pod {annotated} (annotated karpenter.sh/do-not-disrupt)" in text, text
    assert NODE in text and "gpu-h100-x7k2q" in text
    if grace is None:
        assert "no spec.terminationGracePeriod" in text, text
    else:
        stamp = k8s.get("nodeclaims", "gpu-h100-x7k2q")["metadata"]["annotations"]  # type: ignore[index]
        assert f"regardless at {stamp['karpenter.sh/nodeclaim-termination-timestamp']}" in text, text
    assert k8s.get("nodes", NODE) is not None
    k8s.objects.pop(("poddisruptionbudgets", "training", "llama-pretrain"))
    k8s.objects.pop(("pods", "training", "notebook-0"))

    async def gone() -> bool:
        return k8s.get("nodes", NODE) is None

    await eventually(gone, timeout=5.0, what="the old node gone", interval=0.05)
    assert await cluster.termination_held(NODE, handle=handle) == OldNodeLook(gone=True)
    other = handle.replace("karpenter", "cluster-api", 1)
    assert await cluster.termination_held(NODE, handle=other) == OldNodeLook(gone=True)


MACHINE = "gpu-east-gpu-h100-x7b2n-q4v9k"


@pytest.mark.parametrize(
    ("served", "timeout"),
    [(("v1beta2", "v1beta1"), None), (("v1beta1",), "10m0s")],
    ids=["v1beta2-no-drain-timeout", "v1beta1-drain-timeout"],
)
async def test_cluster_api_deletion_held_by_a_pod_its_drain_cannot_evict_is_said(
    make_cluster: Callable[..., KubernetesCluster],
    k8s: KubeEmulator,
    served: tuple[str, ...],
    timeout: str | None,
) -> None:
    """After the Machine's delete Cluster API's Machine controller drains the old node itself; a pod
    whose budget allows no eviction keeps the Machine, the node and its instance, for ever without
    ``nodeDrainTimeout``. Its ``Deleting`` condition names the pod at once, evictions under way, so
    ``termination_held`` tells nothing until the drain is a minute old; then it names the pod and
    why in Cluster API's words, and when (if ever) Cluster API gives the drain up. Its MachineSet
    counts the deleting Machine toward its replicas: no successor comes meanwhile. Once the pod is
    let go the Machine goes (gone) and the successor comes."""
    k8s.capi_versions = served
    machine = k8s.get("machines", MACHINE, "gpu-east")
    assert machine is not None
    if timeout is None:
        del machine["spec"]["nodeDrainTimeout"]
    k8s.add("poddisruptionbudgets", training_pdb(min_available=1))
    cluster, handle = await _replaced_by_cluster_api(make_cluster)

    await _until_deleting_says(
        k8s, "Cluster API's drain refused", lambda said: "cannot evict pod" in said.get("message", "")
    )
    assert await cluster.termination_held(NODE, handle=handle) == OldNodeLook()  # evictions may go on
    began = _capi_drain_began(k8s, seconds_ago=90)
    await asyncio.sleep(0.3)  # the controller looks again, its message's start moved with it
    text = (await cluster.termination_held(NODE, handle=handle)).held or ""
    assert (
        "Pod training/llama-pretrain-worker-2: cannot evict pod as it would violate the pod's disruption "
        "budget. The disruption budget llama-pretrain needs 1 healthy pods and has 1 currently"
    ) in text, text
    assert f"drain started at {began.strftime('%Y-%m-%dT%H:%M:%SZ')}" in text, text
    assert "(Deleting condition DrainingNode," in text and "v1beta1 condition" not in text, text  # told once
    assert f"old node {NODE} (Machine gpu-east/{MACHINE} deleting" in text, text
    if timeout is None:
        assert "the Machine has no nodeDrainTimeout" in text and "drains for ever" in text, text
    else:
        end = (began + timedelta(minutes=10)).strftime("%Y-%m-%dT%H:%M:%SZ")
        assert f"Cluster API stops draining at {end} (the Machine's nodeDrainTimeout)" in text, text
    assert await cluster.successor(NODE, handle=handle) is None
    # What the wait for a successor says meanwhile (the timeline, and the escalation if it runs out).
    waiting = await cluster.held_up(NODE, handle=handle) or ""
    assert f"Cluster API has not deleted the old Machine gpu-east/{MACHINE} yet" in waiting, waiting
    assert "its MachineSet makes the new Machine only once the old one is gone" in waiting, waiting
    k8s.objects.pop(("poddisruptionbudgets", "training", "llama-pretrain"))
    await _successor(cluster, handle)
    assert k8s.get("machines", MACHINE, "gpu-east") is None and k8s.get("nodes", NODE) is None
    assert await cluster.termination_held(NODE, handle=handle) == OldNodeLook(gone=True)


async def test_cluster_api_deletion_held_by_a_delete_hook_is_said_and_a_failed_read_raises(
    make_cluster: Callable[..., KubernetesCluster], k8s: KubeEmulator
) -> None:
    """A ``pre-terminate.delete.hook.machine.cluster.x-k8s.io`` annotation its owner never removes
    holds the drained Machine before its instance is deleted, with no timeout (and no successor
    comes): told ten minutes after the delete, naming the hook as Cluster API's ``Deleting`` says
    it. A Machine read that fails raises, for the engine to look again."""
    hook = "pre-terminate.delete.hook.machine.cluster.x-k8s.io/backup"
    machine = k8s.get("machines", MACHINE, "gpu-east")
    assert machine is not None
    machine["metadata"].setdefault("annotations", {})[hook] = "backup-operator"
    cluster, handle = await _replaced_by_cluster_api(make_cluster)

    await _until_deleting_says(
        k8s, "the hook waited for", lambda said: said["reason"] == "WaitingForPreTerminateHook"
    )
    assert await cluster.termination_held(NODE, handle=handle) == OldNodeLook()
    machine = k8s.get("machines", MACHINE, "gpu-east")
    assert machine is not None
    machine["metadata"]["deletionTimestamp"] = now_iso(-11 * 60)
    text = (await cluster.termination_held(NODE, handle=handle)).held or ""
    assert f"Waiting for pre-terminate hooks to succeed (hooks: {hook})" in text, text
    assert "no timeout applies to a hook, so Cluster API waits for ever" in text, text
    k8s.inject(500, verb="get", resource="machines", times=10)  # the client's retries fail too
    with pytest.raises(TransientError):
        await cluster.termination_held(NODE, handle=handle)


async def test_cluster_api_deletion_held_by_volumes_that_do_not_detach_is_said(
    make_cluster: Callable[..., KubernetesCluster], k8s: KubeEmulator
) -> None:
    """Drained, Cluster API waits for the node's volumes to detach, for ever without
    ``nodeVolumeDetachTimeout``: told once the wait is longer than the 6 minutes after which
    Kubernetes' attach-detach controller detaches from an unhealthy node, naming the volumes' claims
    as its ``Deleting`` condition does; with the timeout set, when Cluster API stops waiting."""
    volume_attached(k8s, NODE)
    cluster, handle = await _replaced_by_cluster_api(make_cluster)

    await _until_deleting_says(
        k8s, "the volumes waited for", lambda said: said["reason"] == "WaitingForVolumeDetach"
    )
    assert await cluster.termination_held(NODE, handle=handle) == OldNodeLook()
    machine = k8s.get("machines", MACHINE, "gpu-east")
    assert machine is not None
    machine["status"]["deletion"]["waitForNodeVolumeDetachStartTime"] = began = now_iso(-7 * 60)
    text = (await cluster.termination_held(NODE, handle=handle)).held or ""
    assert (
        f"it waits for the node's volumes to detach (Deleting condition WaitingForVolumeDetach since {began}: "
        "PersistentVolumeClaims: training/llama-ckpt)"
    ) in text, text
    assert "the Machine has no nodeVolumeDetachTimeout" in text and "waits for ever" in text, text
    machine["spec"]["nodeVolumeDetachTimeout"] = "1h0m0s"
    text = (await cluster.termination_held(NODE, handle=handle)).held or ""
    end = (datetime.strptime(began, "%Y-%m-%dT%H:%M:%SZ") + timedelta(hours=1)).strftime("%Y-%m-%dT%H:%M:%SZ")
    assert f"Cluster API stops waiting for them at {end} (the Machine's nodeVolumeDetachTimeout)" in text, (
        text
    )


async def test_cluster_api_drain_held_by_a_pod_that_never_finishes_terminating_is_said_late(
    make_cluster: Callable[..., KubernetesCluster], k8s: KubeEmulator
) -> None:
    """A pod on a reachable node whose delete a finalizer holds (nothing removes it) stays
    "deletionTimestamp set, but still not removed from the Node" in Cluster API's drain, which
    waits for it for ever: as a pod may take its grace period to go, told only 10 minutes into the
    drain (not one)."""
    worker = k8s.get("pods", "llama-pretrain-worker-2", "training")
    assert worker is not None
    worker["metadata"]["finalizers"] = ["example.com/upload-checkpoint"]
    machine = k8s.get("machines", MACHINE, "gpu-east")
    assert machine is not None
    del machine["spec"]["nodeDrainTimeout"]
    cluster, handle = await _replaced_by_cluster_api(make_cluster)

    await _until_deleting_says(
        k8s,
        "the pod still terminating",
        lambda said: "Pod training/llama-pretrain-worker-2: deletionTimestamp set" in said.get("message", ""),
    )
    _capi_drain_began(k8s, seconds_ago=90)
    assert await cluster.termination_held(NODE, handle=handle) == OldNodeLook()
    _capi_drain_began(k8s, seconds_ago=11 * 60)
    text = (await cluster.termination_held(NODE, handle=handle)).held or ""
    assert (
        "Pod training/llama-pretrain-worker-2: deletionTimestamp set, but still not removed from the Node"
    ) in text, text


@pytest.mark.parametrize("hold", ["budget", "terminating", "volumes", "hook"])
async def test_cluster_api_before_v1_9_deletion_held_is_said_from_its_v1beta1_conditions(
    make_cluster: Callable[..., KubernetesCluster], k8s: KubeEmulator, hold: str
) -> None:
    """Cluster API v1.8 (``release-1.8`` ``reconcileDelete``) writes no ``Deleting`` condition and
    no ``status.deletion``, only v1beta1 conditions, and its drain's message names no pod
    ("Draining the node before deletion", a refused eviction only logged): its holds are told all
    the same, from those conditions, with the same bounds. A pod its budget keeps on the node is
    named a minute into the drain (``DrainingSucceeded``'s time), a pod stuck terminating only 10
    minutes into it, volumes (``VolumeDetachSucceeded``) past 6 minutes, a hook
    (``PreDrainDeleteHookSucceeded``, no message: the Machine's annotation named) 10 minutes after
    the delete. No successor comes meanwhile."""
    cluster_api_release(k8s, (1, 8))
    machine = k8s.get("machines", MACHINE, "gpu-east")
    assert machine is not None
    del machine["spec"]["nodeDrainTimeout"]
    hook = "pre-drain.delete.hook.machine.cluster.x-k8s.io/backup"
    worker = k8s.get("pods", "llama-pretrain-worker-2", "training")
    assert worker is not None
    if hold == "budget":
        k8s.add("poddisruptionbudgets", training_pdb(min_available=1))
    elif hold == "terminating":
        worker["metadata"]["finalizers"] = ["example.com/upload-checkpoint"]
    elif hold == "volumes":
        volume_attached(k8s, NODE)
    else:
        machine["metadata"].setdefault("annotations", {})[hook] = "backup-operator"
    condition, reason = {
        "volumes": ("VolumeDetachSucceeded", "WaitingForVolumeDetach"),
        "hook": ("PreDrainDeleteHookSucceeded", "WaitingExternalHook"),
    }.get(hold, ("DrainingSucceeded", "Draining"))
    cluster, handle = await _replaced_by_cluster_api(make_cluster)

    await _until_deleting_says(
        k8s,
        f"{condition} {reason}",
        lambda said: (
            (said["status"], said["reason"]) == ("False", reason)
            and (hold != "terminating" or bool(worker["metadata"].get("deletionTimestamp")))
        ),
        v1beta1=condition,
    )
    assert await cluster.termination_held(NODE, handle=handle) == OldNodeLook()
    said = f"v1beta1 condition {condition} False {reason}"
    if hold == "hook":
        machine["metadata"]["deletionTimestamp"] = now_iso(-11 * 60)
        text = (await cluster.termination_held(NODE, handle=handle)).held or ""
        assert f"it waits for its delete hooks, as its {said} says (hooks: {hook})" in text, text
        assert "no timeout applies to a hook, so Cluster API waits for ever" in text, text
    elif hold == "volumes":
        began = _capi_drain_began(
            k8s, seconds_ago=7 * 60, start="waitForNodeVolumeDetachStartTime", condition=condition
        )
        text = (await cluster.termination_held(NODE, handle=handle)).held or ""
        assert (
            f"it waits for the node's volumes to detach ({said} since {began.strftime('%Y-%m-%dT%H:%M:%SZ')}), "
            "longer than the 6 minutes"
        ) in text, text
        assert "the Machine has no nodeVolumeDetachTimeout" in text and "waits for ever" in text, text
    else:
        _capi_drain_began(k8s, seconds_ago=90)
        text = (await cluster.termination_held(NODE, handle=handle)).held or ""
        if hold == "budget":
            assert "Pod training/llama-pretrain-worker-2: not evicted a minute into the drain" in text, text
        else:
            assert text == "", text  # it may still finish terminating
            _capi_drain_began(k8s, seconds_ago=11 * 60)
            text = (await cluster.termination_held(NODE, handle=handle)).held or ""
            assert "Pod training/llama-pretrain-worker-2: deleting, still on the node" in text, text
        assert f"its drain of the node cannot finish ({said}, drain started at " in text, text
        assert "the Machine has no nodeDrainTimeout" in text and "drains for ever" in text, text
    assert f"old node {NODE} (Machine gpu-east/{MACHINE} deleting" in text, text
    assert await cluster.successor(NODE, handle=handle) is None


async def _replaced_by_cluster_api(
    make_cluster: Callable[..., KubernetesCluster],
) -> tuple[KubernetesCluster, str]:
    """The failed node cordoned and its Machine deleted by a ``cluster-api`` replacement: the
    adapter and the replacement's handle."""
    cluster = make_cluster(replace={"strategy": "cluster-api"})
    await cluster.cordon(NODE, incident_id=INCIDENT, reason="XID 79")
    return cluster, await cluster.replace(NODE, strategy="configured", incident_id=INCIDENT)


async def _until_deleting_says(
    k8s: KubeEmulator, what: str, holds: Callable[[dict[str, Any]], bool], *, v1beta1: str | None = None
) -> None:
    """Until the old Machine's v1beta2 ``Deleting`` condition, as Cluster API sets it, ``holds``;
    before v1.9, which writes no such condition, its v1beta1 condition ``v1beta1``."""

    async def said() -> bool:
        found = k8s.get("machines", MACHINE, "gpu-east")
        status = found["status"] if found else {}
        conditions = status.get("conditions", []) if v1beta1 else status["v1beta2"]["conditions"]
        deleting = next((c for c in conditions if c["type"] == (v1beta1 or "Deleting")), None)
        return deleting is not None and holds(deleting)

    await eventually(said, timeout=5.0, what=what, interval=0.05)


def _capi_drain_began(
    k8s: KubeEmulator,
    *,
    seconds_ago: float,
    start: str = "nodeDrainStartTime",
    condition: str = "DrainingSucceeded",
) -> datetime:
    """Cluster API's drain (or the wait named by ``start`` and ``condition``) of the deleted
    Machine's node begun ``seconds_ago``: ``status.deletion.<start>`` (v1.9+), or before v1.9,
    which has no ``status.deletion``, the v1beta1 ``condition``'s ``lastTransitionTime``."""
    found = k8s.get("machines", MACHINE, "gpu-east")
    assert found is not None
    deletion = found["status"].get("deletion")
    if deletion is not None:
        assert deletion[start]
        deletion[start] = began = now_iso(-seconds_ago)
    else:
        said = next(c for c in found["status"]["conditions"] if c["type"] == condition)
        said["lastTransitionTime"] = began = now_iso(-seconds_ago)
    return datetime.strptime(began, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC)


def _drain_began(k8s: KubeEmulator, *, seconds_ago: float, claim: str = "gpu-h100-x7k2q") -> None:
    """The NodeClaim deleted, so Karpenter's drain begun, ``seconds_ago``."""
    found = k8s.get("nodeclaims", claim)
    assert found is not None and found["metadata"].get("deletionTimestamp")
    found["metadata"]["deletionTimestamp"] = now_iso(-seconds_ago)


async def test_karpenter_termination_held_by_do_not_disrupt_as_its_version_reads_it(
    make_cluster: Callable[..., KubernetesCluster], k8s: KubeEmulator
) -> None:
    """``karpenter.sh/do-not-disrupt`` holds a pod as Karpenter reads it (``IsDoNotDisruptActive``):
    "true", or from v1.12 a Go duration from the pod's start ("2h" started now: until two hours
    on; "5m" started ten minutes ago: evicted, never named); a pod tolerating the
    ``karpenter.sh/disrupted`` taint is not drained at all, so never named; and a refusal as
    Karpenter v1.0-v1.4 words its ``FailedDraining`` names the pod at once."""
    started = now_iso()
    held = do_not_disrupt_pod(k8s, "notebook-0", "2h", started=started)
    lapsed = do_not_disrupt_pod(k8s, "notebook-1", "5m", started=now_iso(-600))
    tolerating = do_not_disrupt_pod(k8s, "notebook-2", "true")
    pod = k8s.get("pods", "notebook-2", "training")
    assert pod is not None
    pod["spec"]["tolerations"] = [{"operator": "Exists"}]
    k8s.add("poddisruptionbudgets", training_pdb(min_available=1))
    cluster = make_cluster(replace={"strategy": "karpenter"})
    await cluster.cordon(NODE, incident_id=INCIDENT, reason="XID 79")
    handle = await cluster.replace(NODE, strategy="configured", incident_id=INCIDENT)
    node = k8s.get("nodes", NODE)
    assert node is not None
    k8s.add(
        "events",
        {
            "metadata": {"name": f"{NODE}.v1-0", "namespace": "default"},
            "involvedObject": {"kind": "Node", "name": NODE, "uid": node["metadata"]["uid"]},
            "reason": "FailedDraining",
            "type": "Warning",
            "message": "Failed to drain node, evicting pod training/llama-pretrain-worker-2 violates a PDB",
            "source": {"component": "karpenter"},
            "count": 1,
            "firstTimestamp": now_iso(1),
            "lastTimestamp": now_iso(1),
        },
    )

    async def said() -> str | None:
        text = (await cluster.termination_held(NODE, handle=handle)).held
        return text if text is not None and "llama-pretrain-worker-2" in text else None

    text = await eventually(said, timeout=5.0, what="the hold said", interval=0.05)
    until = (datetime.strptime(started, "%Y-%m-%dT%H:%M:%SZ") + timedelta(hours=2)).strftime(
        "%Y-%m-%dT%H:%M:%SZ"
    )
    assert (
        f"pod {held} (annotated karpenter.sh/do-not-disrupt: 2h, which Karpenter v1.12+ honours until {until}"
        in text
    )
    assert (
        "pod training/llama-pretrain-worker-2 (its PodDisruptionBudget allows no eviction, as Karpenter's"
        in text
    )
    assert lapsed not in text and tolerating not in text, text


async def test_karpenter_termination_waiting_for_volumes_past_the_detach_bound_is_said(
    make_cluster: Callable[..., KubernetesCluster], k8s: KubeEmulator
) -> None:
    """Drained, Karpenter waits for the node's VolumeAttachments to go (its NodeClaim's
    ``VolumesDetached`` Unknown, ``AwaitingVolumeDetachment``): said once that has lasted longer
    than the six minutes after which the attach-detach controller detaches from an unhealthy node,
    not before."""
    volume_attached(k8s, NODE)
    cluster = make_cluster(replace={"strategy": "karpenter"})
    await cluster.cordon(NODE, incident_id=INCIDENT, reason="XID 79")
    handle = await cluster.replace(NODE, strategy="configured", incident_id=INCIDENT)

    async def awaiting() -> dict[str, Any] | None:
        claim = k8s.get("nodeclaims", "gpu-h100-x7k2q") or {}
        conditions = (claim.get("status") or {}).get("conditions") or []
        return next((c for c in conditions if c["reason"] == "AwaitingVolumeDetachment"), None)

    condition = await eventually(awaiting, timeout=5.0, what="the wait for volumes", interval=0.05)
    assert await cluster.termination_held(NODE, handle=handle) == OldNodeLook()
    condition["lastTransitionTime"] = now_iso(-7 * 60)
    text = (await cluster.termination_held(NODE, handle=handle)).held or ""
    assert "waits for the node's volumes to detach" in text, text
    assert f"AwaitingVolumeDetachment since {condition['lastTransitionTime']}" in text, text
    assert "Karpenter stops waiting for them at" in text, text  # the fixture NodeClaim has a grace period


async def _no_demand(cluster: KubernetesCluster, handle: str, within: float = 5.0) -> PermanentError:
    """What ``successor`` fails with once it sees the replacement can come no more."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within
    while loop.time() < deadline:
        try:
            found = await cluster.successor(NODE, handle=handle)
        except PermanentError as exc:
            return exc
        assert found is None, found
        await asyncio.sleep(0.05)
    raise AssertionError(f"successor of {NODE} still awaited after {within}s")


async def test_karpenter_fails_at_once_when_the_scheduler_puts_the_demand_on_an_existing_node(
    make_cluster: Callable[..., KubernetesCluster], k8s: KubeEmulator
) -> None:
    """A node of the NodePool with the GPUs free (every node looks so where slurmd pods request no
    GPUs): kube-scheduler binds the placeholder there at once, nothing is pending, and Karpenter
    launches nothing. The first look after says so, naming the node, and removes the placeholder,
    which held those GPUs on a node it was not made for, instead of waiting out the step's budget."""
    free = copy.deepcopy(k8s.get("nodes", NODE))
    assert free is not None
    free["metadata"]["name"] = "gpu-node-03"
    free["metadata"]["labels"].update(
        {"kubernetes.io/hostname": "gpu-node-03", "karpenter.sh/nodepool": "gpu-h100"}
    )
    k8s.add("nodes", free)
    cluster = make_cluster(replace={"strategy": "karpenter"})
    handle = await cluster.replace(NODE, strategy="configured", incident_id=INCIDENT)
    # While a NodeClaim of the pool made since is launching (the placeholder may have found an
    # older node freed meanwhile), that one is awaited as any successor is.
    launching = load_fixture("nodeclaim-karpenter.json")
    launching["metadata"].update(name="gpu-h100-launching", creationTimestamp=now_iso(1))
    launching["status"] = {}
    k8s.add("nodeclaims", launching)
    for _ in range(100):
        bound = k8s.get("pods", PLACEHOLDER, "pitcrew-jobs")
        if bound is not None and bound["spec"].get("nodeName"):
            break
        await asyncio.sleep(0.02)
    assert await cluster.successor(NODE, handle=handle) is None
    assert k8s.get("pods", PLACEHOLDER, "pitcrew-jobs") is not None
    del k8s.objects[("nodeclaims", None, "gpu-h100-launching")]
    failed = await _no_demand(cluster, handle)
    assert failed.reason == Reason.UNSUPPORTED
    assert "existing node gpu-node-03" in str(failed) and "8 GPUs free in NodePool gpu-h100" in str(failed)
    assert k8s.get("pods", PLACEHOLDER, "pitcrew-jobs") is None
    assert k8s.ready_delay is not None
    await asyncio.sleep(k8s.replace_delay + k8s.ready_delay + 0.2)
    assert not [k for k in k8s.objects if k[0] == "nodeclaims"]  # nothing was launched


async def test_karpenter_fails_when_the_placeholder_is_gone_before_any_successor(
    make_cluster: Callable[..., KubernetesCluster], k8s: KubeEmulator, k8s_client: client.ApiClient
) -> None:
    """Deleted by someone (or with a node it was bound to) before Karpenter launched a node for it:
    nothing is pending, so nothing will come."""
    cluster = make_cluster(replace={"strategy": "karpenter"})
    # Karpenter's provisioner has not run when the delete lands: it batches pending pods for at
    # least BATCH_IDLE_DURATION (1 s by default); the emulator's 0.05 s raced the delete under load.
    k8s.replace_delay = 30
    handle = await cluster.replace(NODE, strategy="configured", incident_id=INCIDENT)
    await client.CoreV1Api(k8s_client).delete_namespaced_pod(PLACEHOLDER, "pitcrew-jobs")
    failed = await _no_demand(cluster, handle)
    assert failed.reason == Reason.UNSUPPORTED and "is gone and no node made for it stands" in str(failed)


async def test_karpenter_says_why_it_launches_nothing_and_the_scheduler_is_not_repeated(
    make_cluster: Callable[..., KubernetesCluster], k8s: KubeEmulator
) -> None:
    """Karpenter finds nothing to launch for the placeholder (the cloud out of the GPU type, a
    NodePool limit): it says so on the pod, and ``held_up`` gives its words, so the wait (and its
    escalation when it runs out) says why no node comes. kube-scheduler's FailedScheduling on the
    same pod, what makes it demand, is not said; nor is anything said before the replacement began
    or for another strategy."""
    k8s.karpenter_cannot_launch = 'all available instance types exceed limits for nodepool: "gpu-h100"'
    cluster = make_cluster(replace={"strategy": "karpenter"})
    handle = await cluster.replace(NODE, strategy="configured", incident_id=INCIDENT)
    assert await cluster.successor(NODE, handle=handle) is None
    for _ in range(100):  # Karpenter's provisioner runs a moment after the pod is pending
        said = await cluster.held_up(NODE, handle=handle)
        if said is not None:
            break
        await asyncio.sleep(0.05)
    assert said == (
        'Karpenter: Failed to schedule pod, all available instance types exceed limits for nodepool: "gpu-h100"'
    )
    events = [e for (kind, _, _), e in k8s.objects.items() if kind == "events"]
    components = {e["source"]["component"] for e in events if e["involvedObject"]["name"] == PLACEHOLDER}
    assert components == {"default-scheduler", "karpenter"}  # the scheduler's word is there too

    async def old_claim_gone() -> bool:  # once Karpenter's termination drained the old node
        return not [k for k in k8s.objects if k[0] == "nodeclaims"]

    await eventually(old_claim_gone, timeout=5.0, what="no NodeClaim: none launched", interval=0.05)
    earlier = handle.replace(handle.split()[2], "since=2099-01-01T00:00:00Z")
    assert await cluster.held_up(NODE, handle=earlier) is None  # said before this replacement began
    assert await cluster.held_up(NODE, handle=handle.replace("karpenter", "cluster-api", 1)) is None


async def test_karpenter_consolidates_an_empty_successor_without_the_guard(
    k8s: KubeEmulator, k8s_client: client.ApiClient
) -> None:
    """The stand-in's consolidation, which the guard above defeats: a placeholder-launched node
    left with only DaemonSet pods is deleted with its NodeClaim. No NodeSet here: a DaemonSet-mode
    NodeSet would make its slurmd pod on the new node, which then is not empty."""
    core = client.CoreV1Api(k8s_client)
    k8s.objects.pop(("pods", "slurm", "slurm-worker-gpu-h100-7xk2p"))
    await client.CustomObjectsApi(k8s_client).delete_cluster_custom_object(
        "karpenter.sh", "v1", "nodeclaims", "gpu-h100-x7k2q"
    )
    await asyncio.sleep(k8s.replace_delay + 0.1)
    demand = {
        "metadata": {"name": "demand", "namespace": "pitcrew-jobs"},
        "spec": {
            "nodeSelector": {"karpenter.sh/nodepool": "gpu-h100"},
            "terminationGracePeriodSeconds": 0,
            "containers": [{"name": "p", "image": "registry.k8s.io/pause:3.10"}],
        },
    }
    await core.create_namespaced_pod("pitcrew-jobs", demand)
    for _ in range(50):
        bound = k8s.get("pods", "demand", "pitcrew-jobs")
        if bound and bound["spec"].get("nodeName"):
            break
        await asyncio.sleep(0.05)
    new = bound["spec"]["nodeName"]  # type: ignore[index]
    await core.delete_namespaced_pod("demand", "pitcrew-jobs")
    await asyncio.sleep(k8s.karpenter_consolidate_after * 3)
    assert k8s.consolidated == [new] and k8s.get("nodes", new) is None
    assert not [k for k in k8s.objects if k[0] == "nodeclaims"]


async def test_a_daemonset_nodesets_replacement_serves_a_slurm_node_named_after_it(
    make_cluster: Callable[..., KubernetesCluster], k8s: KubeEmulator
) -> None:
    """Slinky's DaemonSet scaling mode (the fixture's NodeSet): a slurmd pod's hostname, the Slurm
    node it registers, is its node's ``hostname-override`` (``gpu-002``) or the node's name. The node
    Cluster API makes in gpu-node-02's place has no override (its MachineTemplate has no per-node
    value), so the NodeSet's pod there, and the Slurm node pitcrew maps it to, take the new name."""
    cluster = make_cluster(replace={"strategy": "cluster-api"})
    k8s.ready_delay = 0.3
    site = Settings.model_validate(
        {"slurm": {"node_mapping": "slinky"}, "integrations": {"cluster": "kubernetes"}}
    )
    names = slurm_names_for(site, cluster)
    assert list(await names(NODE)) == ["gpu-002"]
    handle = await cluster.replace(NODE, strategy="configured", incident_id=INCIDENT)
    new = await _successor(cluster, handle)
    assert "nodeset.slinky.slurm.net/hostname-override" not in new.annotations

    async def mapped() -> tuple[str, ...] | None:
        return tuple(await names(new.name)) or None

    assert await eventually(mapped, timeout=5.0, what="a slurmd pod on the successor", interval=0.05) == (
        new.name,
    )
    [pod] = [
        p
        for (kind, _, _), p in k8s.objects.items()
        if kind == "pods" and p["spec"].get("nodeName") == new.name
    ]
    assert (
        pod["metadata"]["name"].startswith("slurm-worker-gpu-h100-") and pod["spec"]["hostname"] == new.name
    )
