"""Deleting a CAPI Machine or a Karpenter NodeClaim makes the emulator's controller replace the Node.

Cases: the DELETE answers 200 with the object (``deletionTimestamp``, ``deletionGracePeriodSeconds: 0``,
generation + 1, as in the fixture); then the old Node goes, a new handle points at a new Node, and
that Node registers NotReady and turns Ready after ``ready_delay``. A Machine deleted while its Cluster
or itself is paused stays deleting, its Node with it, until unpaused. A deleted Node object is replaced
by nothing; a terminated instance is, by its cloud group. A StatefulSet-mode NodeSet makes a gone
slurmd pod again, pending, and Karpenter launches a node for it; a DaemonSet-mode one it does not.
Karpenter's termination of a deleted NodeClaim's Node waits on a pod a budget protects or annotated
``do-not-disrupt``: for ever without ``terminationGracePeriod``, until it ends with one. Cluster API's
Machine controller drains a deleted Machine's Node itself and waits on a pod a budget protects, or a
delete hook, the Machine and Node staying and no new Machine coming meanwhile.
"""

from __future__ import annotations

import asyncio
import copy
import os
import sys
from collections.abc import Callable
from typing import Any

import pytest
from kubernetes.aio import client

from proving_ground.kubernetes import resources
from proving_ground.kubernetes.emulator import KubeEmulator, load_fixture, now_iso
from proving_ground.kubernetes.slinky import MemorySlurm
from proving_ground.kubernetes.world import (
    cluster_api_release,
    do_not_disrupt_pod,
    nodeclaim_grace_period,
    pods_karpenter_may_not_evict,
    statefulset_slurmd,
    training_pdb,
    volume_attached,
)
from proving_ground.proc import eventually

NODE = "gpu-node-02"


async def _ready_nodes(core: client.CoreV1Api) -> dict[str, str]:
    nodes = (await core.list_node()).items
    return {n.metadata.name: next(c.status for c in n.status.conditions if c.type == "Ready") for n in nodes}


async def _until(
    core: client.CoreV1Api, done: Callable[[dict[str, str]], bool], within: float = 10.0
) -> dict[str, str]:
    """The nodes' Ready statuses once ``done`` holds for them (polled every 20 ms)."""

    async def nodes() -> dict[str, str] | None:
        found = await _ready_nodes(core)
        return found if done(found) else None

    return await eventually(nodes, timeout=within, what="the nodes expected", interval=0.02)


async def _bound(k8s: KubeEmulator, pod: str, within: float = 10.0) -> dict[str, Any]:
    """The pod in ``pitcrew-jobs`` once it is bound to a node (polled every 20 ms)."""

    async def bound() -> dict[str, Any] | None:
        found = k8s.get("pods", pod, "pitcrew-jobs")
        return found if found and found["spec"].get("nodeName") else None

    return await eventually(bound, timeout=within, what=f"pod {pod} bound", interval=0.02)


@pytest.mark.parametrize(
    ("group", "version", "plural", "namespace", "name"),
    [
        ("cluster.x-k8s.io", "v1beta1", "machines", "gpu-east", "gpu-east-gpu-h100-x7b2n-q4v9k"),
        ("karpenter.sh", "v1", "nodeclaims", None, "gpu-h100-x7k2q"),
    ],
)
async def test_deleting_the_handle_brings_a_new_node_that_turns_ready(
    k8s: KubeEmulator,
    k8s_client: client.ApiClient,
    group: str,
    version: str,
    plural: str,
    namespace: str | None,
    name: str,
) -> None:
    custom, core = client.CustomObjectsApi(k8s_client), client.CoreV1Api(k8s_client)
    # Long enough that polling sees the new Node before it turns Ready even on a loaded machine: a
    # fixed sleep shorter than the delay once woke after it (the Node already Ready).
    k8s.ready_delay = 2.0
    # Leniency by name: Karpenter replaces a NodeClaim only when it disrupts the node itself (or for a
    # pending pod); a manual delete starts nothing (test_adapter_replace shows both).
    k8s.karpenter_replaces_deleted_claims = plural == "nodeclaims"
    if namespace:
        before = await custom.get_namespaced_custom_object(group, version, namespace, plural, name)
        deleted = await custom.delete_namespaced_custom_object(group, version, namespace, plural, name)
    else:
        before = await custom.get_cluster_custom_object(group, version, plural, name)
        deleted = await custom.delete_cluster_custom_object(group, version, plural, name)
    assert deleted["metadata"]["deletionTimestamp"] and deleted["metadata"]["deletionGracePeriodSeconds"] == 0
    assert deleted["metadata"]["generation"] == before["metadata"]["generation"] + 1
    registered = await _until(core, lambda nodes: any(n != NODE for n in nodes))
    assert NODE not in registered and list(registered.values()) == ["False"]
    (new_node,) = registered
    if namespace:
        handles = (await custom.list_namespaced_custom_object(group, version, namespace, plural))["items"]
        assert [h["status"]["nodeRef"]["name"] for h in handles] == [new_node]
    else:
        handles = (await custom.list_cluster_custom_object(group, version, plural))["items"]
        assert [h["status"]["nodeName"] for h in handles] == [new_node]
    assert name not in [h["metadata"]["name"] for h in handles]
    assert await _until(core, lambda nodes: nodes.get(new_node) == "True") == {new_node: "True"}


async def test_deleting_a_node_object_replaces_nothing_and_terminating_its_instance_does(
    k8s: KubeEmulator, k8s_client: client.ApiClient
) -> None:
    """A Node object deleted stops no instance and no group replaces it; the provider's terminate
    (``cloud.py``, pitcrew's ``delete-node`` provider action) does: a new instance registers."""
    core = client.CoreV1Api(k8s_client)
    await core.delete_node(NODE)
    await asyncio.sleep(0.3)
    assert await _ready_nodes(core) == {}
    k8s.add("nodes", load_fixture("node-gpu.json"))
    cli = [sys.executable, "-m", "proving_ground.kubernetes.cloud", k8s.host]
    done = await asyncio.create_subprocess_exec(*cli, env={**os.environ, "PITCREW_NODE": NODE})
    assert await done.wait() == 0 and k8s.terminated == [NODE]
    (new_node,) = (await _until(core, lambda nodes: NODE not in nodes and "True" in nodes.values())).items()
    assert new_node[0].startswith(f"{NODE}-") and new_node[1] == "True"


MACHINE = "gpu-east-gpu-h100-x7b2n-q4v9k"
PAUSED = "cluster.x-k8s.io/paused"


@pytest.mark.parametrize("version", ["v1beta2", "v1beta1"])
@pytest.mark.parametrize("by", ["cluster", "annotation"])
async def test_a_machine_deleted_while_paused_is_replaced_only_once_unpaused(
    k8s: KubeEmulator, k8s_client: client.ApiClient, by: str, version: str
) -> None:
    """cluster-api util/paused/paused.go: the Machine controller returns before its deletion while
    the Cluster's ``spec.paused`` is true or the Machine carries ``cluster.x-k8s.io/paused`` (any
    value), and the MachineSet counts a deleting Machine: the Machine stays, deleting, its Node
    stays, and nothing replaces it. Unpaused (the field or the annotation gone), it goes on."""
    custom, core = client.CustomObjectsApi(k8s_client), client.CoreV1Api(k8s_client)
    group, merge = "cluster.x-k8s.io", "application/merge-patch+json"
    if by == "cluster":
        pause: dict[str, Any] = {"spec": {"paused": True}}
        target = ("clusters", "gpu-east")
    else:
        pause = {"metadata": {"annotations": {PAUSED: ""}}}
        target = ("machines", MACHINE)
    await custom.patch_namespaced_custom_object(
        group, version, "gpu-east", *target, pause, _content_type=merge
    )
    cluster = await custom.get_namespaced_custom_object(group, version, "gpu-east", "clusters", "gpu-east")
    assert cluster["apiVersion"] == f"{group}/{version}"
    assert cluster["spec"].get("paused") is (True if by == "cluster" else None)
    deleted = await custom.delete_namespaced_custom_object(group, version, "gpu-east", "machines", MACHINE)
    assert deleted["metadata"]["deletionTimestamp"]
    await asyncio.sleep(k8s.replace_delay + 0.3)
    machines = (await custom.list_namespaced_custom_object(group, version, "gpu-east", "machines"))["items"]
    assert [(m["metadata"]["name"], bool(m["metadata"].get("deletionTimestamp"))) for m in machines] == [
        (MACHINE, True)
    ]
    assert list(await _ready_nodes(core)) == [NODE]
    unpause: dict[str, Any] = (
        {"spec": {"paused": None}} if by == "cluster" else {"metadata": {"annotations": {PAUSED: None}}}
    )
    await custom.patch_namespaced_custom_object(
        group, version, "gpu-east", *target, unpause, _content_type=merge
    )
    registered = await _until(core, lambda nodes: NODE not in nodes and "True" in nodes.values())
    assert [n.startswith(f"{NODE}-") for n in registered] == [True]


def _pod(requests: dict[str, str] | None = None, **spec: Any) -> dict[str, Any]:
    resources = {"requests": requests} if requests else {}
    return {"spec": {"containers": [{"name": "c", "resources": resources}], **spec}}


def _node(**changes: Any) -> dict[str, Any]:
    node: dict[str, Any] = load_fixture("node-gpu.json")  # 8 GPUs, taint nvidia.com/gpu NoSchedule, Ready
    node["spec"].update(changes.pop("spec", {}))
    node["metadata"]["labels"]["karpenter.sh/nodepool"] = "gpu-h100"
    if changes.pop("not_ready", False):
        for condition in node["status"]["conditions"]:
            if condition["type"] == "Ready":
                condition["status"] = "False"
    return node


TOLERATE_GPU = [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
GPUS_8 = {"nvidia.com/gpu": "8"}
ON_POOL = {"karpenter.sh/nodepool": "gpu-h100"}
RUNNING_4 = {**_pod({"nvidia.com/gpu": "4"}), "status": {"phase": "Running"}}
DONE_8 = {**_pod(GPUS_8), "status": {"phase": "Succeeded"}}


@pytest.mark.parametrize(
    ("pod", "node", "there", "why"),
    [
        (_pod(GPUS_8, nodeSelector=ON_POOL, tolerations=TOLERATE_GPU), _node(), [], None),
        (_pod(GPUS_8, nodeSelector=ON_POOL), _node(), [], "untolerated taint {nvidia.com/gpu: present}"),
        (_pod(GPUS_8, tolerations=[{"operator": "Exists"}]), _node(), [], None),  # tolerates every taint
        (
            _pod(GPUS_8, nodeSelector={"karpenter.sh/nodepool": "other"}, tolerations=TOLERATE_GPU),
            _node(),
            [],
            "didn't match Pod's node affinity/selector",
        ),
        (
            _pod(GPUS_8, tolerations=TOLERATE_GPU),
            _node(spec={"unschedulable": True}),
            [],
            "untolerated taint {node.kubernetes.io/unschedulable: }",
        ),
        (_pod(GPUS_8, tolerations=TOLERATE_GPU), _node(not_ready=True), [], "node.kubernetes.io/not-ready"),
        (_pod(GPUS_8, tolerations=TOLERATE_GPU), _node(), [RUNNING_4], "Insufficient nvidia.com/gpu"),
        (_pod({"nvidia.com/gpu": "4"}, tolerations=TOLERATE_GPU), _node(), [RUNNING_4], None),
        (_pod(GPUS_8, tolerations=TOLERATE_GPU), _node(), [DONE_8], None),  # a finished pod holds nothing
        (_pod({"memory": "2Ti"}, tolerations=TOLERATE_GPU), _node(), [], "Insufficient memory"),
        (_pod({"cpu": "191500m"}, tolerations=TOLERATE_GPU), _node(), [], None),
        (
            _pod({"example.com/fpga": "1"}, tolerations=TOLERATE_GPU),
            _node(),
            [],
            "Insufficient example.com/fpga",
        ),
        (
            _pod(
                {"nvidia.com/gpu": "1"},
                tolerations=TOLERATE_GPU,
                initContainers=[{"name": "i", "resources": {"requests": {"nvidia.com/gpu": "5"}}}],
            ),
            _node(),
            [RUNNING_4],
            "Insufficient nvidia.com/gpu",  # an init container's larger request counts
        ),
    ],
)
def test_the_stand_in_scheduler_filters_as_kube_scheduler_does(
    pod: dict[str, Any], node: dict[str, Any], there: list[dict[str, Any]], why: str | None
) -> None:
    found = resources.unfit(pod, node, there)
    assert (found is None) if why is None else (found is not None and why in found), found


async def test_a_pending_pod_that_fits_an_existing_node_is_bound_there_and_no_node_is_launched(
    k8s: KubeEmulator, k8s_client: client.ApiClient
) -> None:
    """kube-scheduler binds a pod that fits an existing node at once; Karpenter launches nodes only
    for pods it could place nowhere. A node of the NodePool with its GPUs free takes the pod; with
    none, a NodeClaim is made for it (as after the NodeClaim's delete in test_adapter_replace)."""
    custom, core = client.CustomObjectsApi(k8s_client), client.CoreV1Api(k8s_client)
    await custom.delete_cluster_custom_object("karpenter.sh", "v1", "nodeclaims", "gpu-h100-x7k2q")
    await asyncio.sleep(k8s.replace_delay + 0.1)  # the NodePool is known to the stand-in now
    free = _node()
    free["metadata"].update(name="gpu-free", creationTimestamp="2026-01-01T00:00:00Z")
    k8s.add("nodes", free)
    demand: dict[str, Any] = {
        "metadata": {"name": "demand", "namespace": "pitcrew-jobs"},
        "spec": {
            "nodeSelector": ON_POOL,
            "tolerations": TOLERATE_GPU,
            "containers": [{"name": "p", "image": "x", "resources": {"requests": GPUS_8, "limits": GPUS_8}}],
        },
    }
    await core.create_namespaced_pod("pitcrew-jobs", demand)
    bound = await _bound(k8s, "demand")
    assert bound["spec"]["nodeName"] == "gpu-free"
    await asyncio.sleep(k8s.replace_delay + (k8s.ready_delay or 0) + 0.2)  # time Karpenter would take
    assert not [k for k in k8s.objects if k[0] == "nodeclaims"]
    # A second pod finds the free node's GPUs taken: Karpenter launches a node for it.
    more_demand = copy.deepcopy(demand)
    more_demand["metadata"]["name"] = "more"
    await core.create_namespaced_pod("pitcrew-jobs", more_demand)
    more = await _bound(k8s, "more")
    [claim] = [c for (kind, _, _), c in k8s.objects.items() if kind == "nodeclaims"]
    assert more["spec"]["nodeName"] == claim["status"]["nodeName"] != "gpu-free"


async def test_a_statefulset_nodesets_evicted_pod_comes_back_pending_and_karpenter_launches_for_it(
    k8s: KubeEmulator, k8s_client: client.ApiClient
) -> None:
    """slurm-operator's default scaling mode: the NodeSet makes a gone replica again under the same
    name (its Slurm node's), unbound and unprotected; with its node cordoned it is pending, and
    Karpenter, which knows the NodePool from its standing NodeClaim, launches a node for it before
    any NodeClaim is deleted. A DaemonSet-mode NodeSet pod (the fixture's) is not made again."""
    core = client.CoreV1Api(k8s_client)
    daemon_mode = copy.deepcopy(k8s.get("pods", "slurm-worker-gpu-h100-7xk2p", "slurm"))
    assert daemon_mode is not None
    name = statefulset_slurmd(k8s)
    k8s.objects[("nodes", None, NODE)]["spec"]["unschedulable"] = True
    old = k8s.get("pods", name, "slurm")
    assert old is not None and old["metadata"]["labels"]["nodeset.slinky.slurm.net/pod-protect"] == "true"
    await core.delete_namespaced_pod(name, "slurm")

    async def made_again() -> dict[str, Any] | None:
        pod = k8s.get("pods", name, "slurm")
        return pod if pod and pod["metadata"]["uid"] != old["metadata"]["uid"] else None

    again = await eventually(made_again, timeout=5.0, what="the NodeSet's pod made again", interval=0.02)
    assert "nodeset.slinky.slurm.net/pod-protect" not in again["metadata"]["labels"]

    async def bound() -> dict[str, Any] | None:
        pod = k8s.get("pods", name, "slurm")
        return pod if pod and pod["spec"].get("nodeName") else None

    landed = await eventually(bound, timeout=5.0, what="the NodeSet's pod bound", interval=0.02)
    claims = [c for (kind, _, _), c in k8s.objects.items() if kind == "nodeclaims"]
    assert sorted(c["status"]["nodeName"] for c in claims) == sorted([NODE, landed["spec"]["nodeName"]])
    assert landed["spec"]["nodeName"] != NODE  # launched for it: the old NodeClaim was never deleted
    # DaemonSet mode: made per node under a generated name, never again by this stand-in.
    daemon_mode["metadata"].pop("resourceVersion", None)
    k8s.add("pods", daemon_mode)
    await core.delete_namespaced_pod(daemon_mode["metadata"]["name"], "slurm", grace_period_seconds=0)
    await asyncio.sleep(0.2)
    assert k8s.get("pods", daemon_mode["metadata"]["name"], "slurm") is None


async def test_the_operator_syncs_a_replica_made_again_on_an_uncordoned_node_its_undrain_relabels_the_down(
    k8s: KubeEmulator, k8s_client: client.ApiClient
) -> None:
    """slurm-operator's syncCordon runs on every sync of the NodeSet, for each of its pods, not on an
    uncordon only: a replica made again and bound to a node that is not cordoned (the successor
    Karpenter launched for it) has its Slurm node undrained (``IsNodeReasonOurs``, not
    ``IsNodeDownForUnresponsive``; ``MakeNodeUndrain``). The preStop hook's DOWN (DRAIN a flag on it)
    stays DOWN, relabelled "Pod (<ns>/<pod>) was uncordoned"."""
    slurm = k8s.slinky_slurm
    assert isinstance(slurm, MemorySlurm)
    k8s.slinky_drain_delay = 0.05
    name = statefulset_slurmd(k8s)
    k8s.objects[("nodes", None, NODE)]["spec"]["unschedulable"] = True
    await slurm.drain(name, "slurm-operator: pitcrew: pc-00042 XID 79")  # the operator's, on the cordon
    await client.CoreV1Api(k8s_client).delete_namespaced_pod(name, "slurm")  # the hook's DOWN

    async def relabelled() -> bool:
        pod = k8s.get("pods", name, "slurm")
        return bool(pod and pod["spec"].get("nodeName")) and name not in slurm.drained

    await eventually(
        relabelled, timeout=5.0, what="the operator's undrain of the replica made again", interval=0.02
    )
    assert slurm.downed == {name}
    assert slurm.reasons[name] == f"slurm-operator: Pod (slurm/{name}) was uncordoned"


@pytest.mark.parametrize("grace", [None, "2s"], ids=["no-grace-period", "grace-period"])
async def test_karpenter_termination_waits_on_pods_it_may_not_evict_until_a_grace_period_ends(
    k8s: KubeEmulator, k8s_client: client.ApiClient, grace: str | None
) -> None:
    """Karpenter's termination of a deleted NodeClaim's Node taints it ``karpenter.sh/disrupted`` and
    drains it through the Eviction API: a pod whose budget allows no eviction and one annotated
    ``do-not-disrupt`` (not evicted at all) keep the Node, its NodeClaim and the instance there.
    Without ``spec.terminationGracePeriod`` for good; with one, until the NodeClaim's termination
    timestamp, when they are deleted regardless. Its recorder says one ``FailedDraining`` per node
    every two minutes: "N pods are waiting to be evicted", said as the drain hands them to its
    eviction queue, before any eviction is refused, so the refusal naming the pod is dropped."""
    nodeclaim_grace_period(k8s, grace)
    _, annotated = pods_karpenter_may_not_evict(k8s)
    await client.CustomObjectsApi(k8s_client).delete_cluster_custom_object(
        "karpenter.sh", "v1", "nodeclaims", "gpu-h100-x7k2q"
    )
    await asyncio.sleep(1.0)
    node, claim = k8s.get("nodes", NODE), k8s.get("nodeclaims", "gpu-h100-x7k2q")
    assert node is not None and claim is not None
    assert node["metadata"]["deletionTimestamp"] and claim["metadata"]["deletionTimestamp"]
    assert {"key": "karpenter.sh/disrupted", "effect": "NoSchedule"} in node["spec"]["taints"]
    said = {
        e["message"]
        for (kind, _, _), e in k8s.objects.items()
        if kind == "events" and e["involvedObject"]["name"] == NODE and e["reason"] == "FailedDraining"
    }
    # The first pass's, before any eviction: the fixture's evictable pods counted too.
    [only] = said
    assert only.startswith("Failed to drain node, ") and only.endswith(" pods are waiting to be evicted"), (
        said
    )
    assert k8s.get("pods", annotated.split("/")[1], "training") is not None
    if grace is None:
        await asyncio.sleep(2.5)
        assert k8s.get("nodes", NODE) is not None  # still there, for good
        assert not [e for e in k8s.log if e.subresource == "eviction" and e.name == "notebook-0"]
        return
    stamp = claim["metadata"]["annotations"]["karpenter.sh/nodeclaim-termination-timestamp"]
    assert stamp > claim["metadata"]["deletionTimestamp"]

    async def gone() -> bool:
        return k8s.get("nodes", NODE) is None and k8s.get("nodeclaims", "gpu-h100-x7k2q") is None

    await eventually(gone, timeout=6.0, what="the old node gone once its grace period ended", interval=0.1)
    assert k8s.get("pods", "notebook-0", "training") is None


async def test_karpenter_honours_do_not_disrupt_durations_from_pod_start(
    k8s: KubeEmulator, k8s_client: client.ApiClient
) -> None:
    """From v1.12 Karpenter's drain takes ``karpenter.sh/do-not-disrupt`` as "true" or a Go duration
    counted from the pod's ``status.startTime`` (``IsDoNotDisruptActive``): a pod started now under
    "1h" is left, one started ten minutes ago under "5m" is evicted, and a value that is neither
    counts as no annotation."""
    held = do_not_disrupt_pod(k8s, "notebook-0", "1h", started=now_iso())
    do_not_disrupt_pod(k8s, "notebook-1", "5m", started=now_iso(-600))
    do_not_disrupt_pod(k8s, "notebook-2", "yes")
    await client.CustomObjectsApi(k8s_client).delete_cluster_custom_object(
        "karpenter.sh", "v1", "nodeclaims", "gpu-h100-x7k2q"
    )

    def standing(name: str) -> bool:
        pod = k8s.get("pods", name, "training")
        return pod is not None and not pod["metadata"].get("deletionTimestamp")

    async def evicted() -> bool:
        return not standing("notebook-1") and not standing("notebook-2")

    await eventually(evicted, timeout=5.0, what="the lapsed and the invalid evicted", interval=0.05)
    await asyncio.sleep(0.5)
    assert k8s.get("nodes", NODE) is not None
    assert standing(held.split("/")[1])


async def test_karpenter_termination_waits_for_volumes_to_detach_said_on_the_nodeclaim(
    k8s: KubeEmulator, k8s_client: client.ApiClient
) -> None:
    """After the drain Karpenter waits for the node's VolumeAttachments of a PersistentVolume to go
    (``awaitVolumeDetachment``, no end but a termination time), saying so on the NodeClaim:
    ``VolumesDetached`` Unknown, ``AwaitingVolumeDetachment``. Once Kubernetes detaches them the
    Node and NodeClaim go."""
    volume_attached(k8s, NODE)
    await client.CustomObjectsApi(k8s_client).delete_cluster_custom_object(
        "karpenter.sh", "v1", "nodeclaims", "gpu-h100-x7k2q"
    )

    async def awaiting() -> dict[str, Any] | None:
        claim = k8s.get("nodeclaims", "gpu-h100-x7k2q")
        found = [
            c
            for c in ((claim or {}).get("status") or {}).get("conditions") or []
            if c["type"] == "VolumesDetached"
        ]
        return found[0] if found and found[0]["status"] == "Unknown" else None

    condition = await eventually(awaiting, timeout=5.0, what="the wait for volumes said", interval=0.05)
    assert condition["reason"] == "AwaitingVolumeDetachment"
    await asyncio.sleep(0.5)
    assert k8s.get("nodes", NODE) is not None
    k8s.objects.pop(("volumeattachments", None, "csi-0a1b"))

    async def gone() -> bool:
        return k8s.get("nodes", NODE) is None and k8s.get("nodeclaims", "gpu-h100-x7k2q") is None

    await eventually(gone, timeout=5.0, what="the old node gone once detached", interval=0.05)


MACHINE = "gpu-east-gpu-h100-x7b2n-q4v9k"


def _deleting(machine: dict[str, Any], version: str) -> dict[str, Any]:
    """The Machine's v1beta2 ``Deleting`` condition as ``version`` serves it."""
    status = machine["status"]
    conditions = status["conditions"] if version == "v1beta2" else status["v1beta2"]["conditions"]
    return next(c for c in conditions if c["type"] == "Deleting")


@pytest.mark.parametrize("version", ["v1beta2", "v1beta1"])
async def test_a_deleted_machine_stays_while_its_drain_cannot_evict_a_pod(
    k8s: KubeEmulator, k8s_client: client.ApiClient, version: str
) -> None:
    """Cluster API's Machine controller drains the deleted Machine's Node itself (``drainNode``,
    cluster-api v1.9+ ``internal/controllers/machine/drain``): it cordons it, skips DaemonSet and
    mirror pods, and evicts the rest through the Eviction API; a pod whose budget allows no
    eviction stays, and so do the Machine (its finalizer) and the Node, for ever without
    ``nodeDrainTimeout``, its ``Deleting`` condition (``DrainingNode``) and v1beta1
    ``DrainingSucceeded`` (``Draining``) saying so in ``EvictionResult.ConditionMessage``'s words.
    Its MachineSet counts the deleting Machine toward its replicas: no new one comes meanwhile.
    Once the budget lets the pod go, the Machine and Node go and the new Machine comes."""
    custom, core = client.CustomObjectsApi(k8s_client), client.CoreV1Api(k8s_client)
    k8s.add("poddisruptionbudgets", training_pdb(min_available=1))
    machine = k8s.get("machines", MACHINE, "gpu-east")
    assert machine is not None
    del machine["spec"]["nodeDrainTimeout"]
    await custom.delete_namespaced_custom_object("cluster.x-k8s.io", version, "gpu-east", "machines", MACHINE)

    async def refused() -> dict[str, Any] | None:
        found = await custom.get_namespaced_custom_object(
            "cluster.x-k8s.io", version, "gpu-east", "machines", MACHINE
        )
        said = _deleting(found, version)
        return found if said.get("message", "").count("\n") == 1 and "worker-2" in said["message"] else None

    found = await eventually(refused, timeout=5.0, what="the drain's refusal said", interval=0.02)
    began = found["status"]["deletion"]["nodeDrainStartTime"]
    message = (
        f"Drain not completed yet (started at {began}):\n"
        "* Pod training/llama-pretrain-worker-2: cannot evict pod as it would violate the pod's "
        "disruption budget. The disruption budget llama-pretrain needs 1 healthy pods and has 1 currently"
    )
    said = _deleting(found, version)
    assert (said["status"], said["reason"], said["message"]) == ("True", "DrainingNode", message)
    v1beta1 = found["status"]["deprecated"]["v1beta1"] if version == "v1beta2" else found["status"]
    draining = next(c for c in v1beta1["conditions"] if c["type"] == "DrainingSucceeded")
    assert (draining["status"], draining["reason"], draining["severity"], draining["message"]) == (
        "False",
        "Draining",
        "Info",
        message,
    )
    node = k8s.get("nodes", NODE)
    assert node is not None and node["spec"]["unschedulable"] is True
    left = {k[2] for k, p in k8s.objects.items() if k[0] == "pods" and p["spec"].get("nodeName") == NODE}
    assert left == {"nvidia-dcgm-exporter-7wq4n", "gpu-health-agent-gpu-node-02", "llama-pretrain-worker-2"}
    await asyncio.sleep(0.3)  # it looks again, and stays; no new Machine
    assert list(await _ready_nodes(core)) == [NODE]
    machines = [k for k in k8s.objects if k[0] == "machines"]
    assert machines == [("machines", "gpu-east", MACHINE)]
    k8s.objects.pop(("poddisruptionbudgets", "training", "llama-pretrain"))
    await _until(core, lambda nodes: NODE not in nodes and len(nodes) == 1)
    assert k8s.get("machines", MACHINE, "gpu-east") is None


async def test_a_deleted_machine_waits_for_its_pre_drain_hook(
    k8s: KubeEmulator, k8s_client: client.ApiClient
) -> None:
    """A ``pre-drain.delete.hook.machine.cluster.x-k8s.io/<name>`` annotation holds the deleted
    Machine before its drain (``reconcileDelete``), said in ``Deleting`` (``WaitingForPreDrainHook``);
    once its owner removes it, the drain and the delete go on."""
    custom, core = client.CustomObjectsApi(k8s_client), client.CoreV1Api(k8s_client)
    hook = "pre-drain.delete.hook.machine.cluster.x-k8s.io/backup"
    machine = k8s.get("machines", MACHINE, "gpu-east")
    assert machine is not None
    machine["metadata"].setdefault("annotations", {})[hook] = "backup-operator"
    await custom.delete_namespaced_custom_object(
        "cluster.x-k8s.io", "v1beta2", "gpu-east", "machines", MACHINE
    )

    async def waiting() -> dict[str, Any] | None:
        found = k8s.get("machines", MACHINE, "gpu-east")
        said = _deleting(found, "v1beta1") if found else {}
        return said if said.get("reason") == "WaitingForPreDrainHook" else None

    said = await eventually(waiting, timeout=5.0, what="the hook waited for", interval=0.02)
    assert said["message"] == f"Waiting for pre-drain hooks to succeed (hooks: {hook})"
    node = k8s.get("nodes", NODE)
    assert node is not None and not node["spec"].get("unschedulable")  # not drained yet
    machine = k8s.get("machines", MACHINE, "gpu-east")
    assert machine is not None
    del machine["metadata"]["annotations"][hook]
    await _until(core, lambda nodes: NODE not in nodes)
    assert k8s.get("machines", MACHINE, "gpu-east") is None


async def test_a_deleted_machine_waits_for_its_nodes_volumes_to_detach(
    k8s: KubeEmulator, k8s_client: client.ApiClient
) -> None:
    """Drained, the Machine controller waits while a VolumeAttachment to the Node is attached
    (``shouldWaitForNodeVolumes``, v1.9+), said in ``Deleting`` (``WaitingForVolumeDetach``) naming
    the volume's claim as ``attachedVolumeInformation.conditionMessage`` does; once it is detached
    the Machine and Node go."""
    custom, core = client.CustomObjectsApi(k8s_client), client.CoreV1Api(k8s_client)
    volume_attached(k8s, NODE)
    await custom.delete_namespaced_custom_object(
        "cluster.x-k8s.io", "v1beta2", "gpu-east", "machines", MACHINE
    )

    async def waiting() -> dict[str, Any] | None:
        found = await custom.get_namespaced_custom_object(
            "cluster.x-k8s.io", "v1beta2", "gpu-east", "machines", MACHINE
        )
        return found if _deleting(found, "v1beta2").get("reason") == "WaitingForVolumeDetach" else None

    found = await eventually(waiting, timeout=5.0, what="the volumes waited for", interval=0.02)
    began = found["status"]["deletion"]["waitForNodeVolumeDetachStartTime"]
    assert _deleting(found, "v1beta2")["message"] == (
        f"Waiting for Node volumes to be detached (started at {began})\n* PersistentVolumeClaims: training/llama-ckpt"
    )
    detach = next(
        c
        for c in found["status"]["deprecated"]["v1beta1"]["conditions"]
        if c["type"] == "VolumeDetachSucceeded"
    )
    assert (detach["status"], detach["reason"]) == ("False", "WaitingForVolumeDetach")
    k8s.objects.pop(("volumeattachments", None, "csi-0a1b"))
    await _until(core, lambda nodes: NODE not in nodes)
    assert k8s.get("machines", MACHINE, "gpu-east") is None


async def test_a_cluster_api_v1_8_machine_controller_says_its_waits_in_v1beta1_conditions_only(
    k8s: KubeEmulator, k8s_client: client.ApiClient
) -> None:
    """Cluster API v1.8 (``release-1.8`` machine_controller.go ``reconcileDelete``) writes no
    ``Deleting`` condition and no ``status.deletion``: a drain a budget refuses leaves
    ``DrainingSucceeded`` False ``Draining`` "Draining the node before deletion" (Info), its time
    the drain's start (``drainNode`` only logs the failure and requeues); the volume wait
    ``VolumeDetachSucceeded`` False ``WaitingForVolumeDetach`` while the Node's
    ``status.volumesAttached`` is not empty; a hook ``PreTerminateDeleteHookSucceeded`` False
    ``WaitingExternalHook``, no message. Each let go, the next wait, then the Machine and Node go."""
    custom, core = client.CustomObjectsApi(k8s_client), client.CoreV1Api(k8s_client)
    cluster_api_release(k8s, (1, 8))
    hook = "pre-terminate.delete.hook.machine.cluster.x-k8s.io/backup"
    machine = k8s.get("machines", MACHINE, "gpu-east")
    assert machine is not None
    del machine["spec"]["nodeDrainTimeout"]
    machine["metadata"].setdefault("annotations", {})[hook] = "backup-operator"
    k8s.add("poddisruptionbudgets", training_pdb(min_available=1))
    volume_attached(k8s, NODE)
    await custom.delete_namespaced_custom_object(
        "cluster.x-k8s.io", "v1beta1", "gpu-east", "machines", MACHINE
    )

    async def waiting(type_: str) -> dict[str, Any] | None:
        found = await custom.get_namespaced_custom_object(
            "cluster.x-k8s.io", "v1beta1", "gpu-east", "machines", MACHINE
        )
        said: dict[str, Any] | None = next(
            (c for c in found["status"]["conditions"] if c["type"] == type_), None
        )
        if said is None or said["status"] != "False":
            return None
        assert "v1beta2" not in found["status"] and "deletion" not in found["status"], found["status"]
        return said

    said = await eventually(
        lambda: waiting("DrainingSucceeded"), timeout=5.0, what="the drain", interval=0.02
    )
    assert (said["reason"], said["severity"], said["message"]) == (
        "Draining",
        "Info",
        "Draining the node before deletion",
    )
    await asyncio.sleep(0.3)  # it drains again, refused, and says nothing more
    assert await waiting("DrainingSucceeded") == said
    assert k8s.get("pods", "llama-pretrain-worker-2", "training") is not None
    k8s.objects.pop(("poddisruptionbudgets", "training", "llama-pretrain"))
    said = await eventually(
        lambda: waiting("VolumeDetachSucceeded"), timeout=5.0, what="the volumes", interval=0.02
    )
    assert (said["reason"], said["severity"], said["message"]) == (
        "WaitingForVolumeDetach",
        "Info",
        "Waiting for node volumes to be detached",
    )
    node = k8s.get("nodes", NODE)
    assert node is not None
    node["status"]["volumesAttached"] = []
    said = await eventually(
        lambda: waiting("PreTerminateDeleteHookSucceeded"), timeout=5.0, what="the hook", interval=0.02
    )
    assert (said["reason"], said["severity"], said.get("message")) == ("WaitingExternalHook", "Info", None)
    machine = k8s.get("machines", MACHINE, "gpu-east")
    assert machine is not None
    del machine["metadata"]["annotations"][hook]
    await _until(core, lambda nodes: NODE not in nodes)
    assert k8s.get("machines", MACHINE, "gpu-east") is None
