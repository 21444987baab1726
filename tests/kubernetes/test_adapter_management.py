"""Cluster API Machines in the management cluster, through the real client against two emulators.

The usual layout: the workload cluster (its Nodes, pods) has no Cluster API CRDs, and answers
``404 page not found`` for Machines; the Machines and their MachineSet controller live in a second
API server, the management cluster, which acts on the workload cluster's Nodes. Cases: without
``kubernetes.cluster_api`` a replacement fails naming the Machine and where it was looked for, and
``check-config --live`` says so although every verb is allowed; with ``kubernetes.cluster_api``
the Machine is read and deleted in the management cluster, the successor is the new Machine's
``status.nodeRef`` in the workload cluster, and the probe passes; a Machine namespace that holds no
such Machine is named by the probe; an unreadable management kubeconfig leaves the workload
cluster usable and every Machine request names it.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import kmock
import pytest
import yaml

from bot.config import KubernetesSettings
from bot.engine.errors import PermanentError, Reason
from bot.engine.ports import OldNodeLook
from bot.integrations.kubernetes import KubernetesCluster
from proving_ground.kubernetes.emulator import EMULATED_TOKEN, KubeEmulator
from proving_ground.kubernetes.world import write_kubeconfig

NODE = "gpu-node-02"
MACHINE = "gpu-east/gpu-east-gpu-h100-x7b2n-q4v9k"


@pytest.fixture
async def management(k8s: KubeEmulator) -> AsyncIterator[KubeEmulator]:
    """The management cluster: the Machines and their Cluster move there; the workload cluster has no
    CAPI CRDs."""
    async with KubeEmulator(workload=k8s) as mgmt, kmock.Server(mgmt):
        for key in [k for k in k8s.objects if k[0] in ("machines", "clusters")]:
            mgmt.objects[key] = k8s.objects.pop(key)
        mgmt.absent = {"nodes", "pods"}  # not its business here: any Node request is a bug
        k8s.absent = {"machines", "clusters"}
        yield mgmt


async def _ready_successor(cluster: KubernetesCluster, handle: str) -> str:
    for _ in range(100):
        new = await cluster.successor(NODE, handle=handle)
        if new is not None and new.ready:
            return new.name
        await asyncio.sleep(0.05)
    raise AssertionError("no Ready successor")


async def test_machines_looked_for_in_the_workload_cluster_are_not_found_and_the_probe_says_so(
    make_cluster: Callable[..., KubernetesCluster], k8s: KubeEmulator, management: KubeEmulator
) -> None:
    cluster = make_cluster(replace={"strategy": "cluster-api"})
    probe = await cluster.probe()
    assert not probe.ok and "Cluster API Machine cannot be found" in probe.detail
    assert probe.missing == (
        f"Machine {MACHINE} of node {NODE} not found in the workload cluster (Machines usually live in "
        "the management cluster: set kubernetes.cluster_api.kubeconfig or context)",
    )
    with pytest.raises(PermanentError, match=f"Machine {MACHINE} of node {NODE} not found") as err:
        await cluster.replace(NODE, strategy="configured", incident_id="pc-1")
    assert err.value.reason == Reason.NOT_FOUND
    assert not [e for e in k8s.log if e.verb == "delete"] and not management.log


async def test_machines_are_read_and_deleted_in_the_management_cluster(
    make_cluster: Callable[..., KubernetesCluster],
    k8s: KubeEmulator,
    management: KubeEmulator,
    tmp_path: Path,
) -> None:
    kubeconfig = write_kubeconfig(tmp_path / "management", management.host)
    cluster = make_cluster(replace={"strategy": "cluster-api"}, cluster_api={"kubeconfig": kubeconfig})
    probe = await cluster.probe()
    assert probe.ok, probe
    reviews = [e for e in management.log if e.resource == "selfsubjectaccessreviews"]
    assert len(reviews) == 4  # get, list, delete machines, get clusters: asked where the Machines are
    handle = await cluster.replace(NODE, strategy="configured", incident_id="pc-1")
    assert handle.startswith(f"cluster-api machine/{MACHINE} ") and "owner=machineset/gpu-east/" in handle
    assert [(e.verb, e.resource, e.status) for e in management.log if e.verb == "delete"] == [
        ("delete", "machines", 200)
    ]
    assert not [e for e in k8s.log if e.resource == "machines"]
    new = await _ready_successor(cluster, handle)
    machines = [m for (kind, _, _), m in management.objects.items() if kind == "machines"]
    assert [m["status"]["nodeRef"]["name"] for m in machines] == [new]
    assert k8s.get("nodes", NODE) is None and k8s.get("nodes", new) is not None
    # The look at the old node reads its Machine where it lives, once: gone.
    reads = sum(1 for e in management.log if e.verb == "get" and e.resource == "machines")
    assert await cluster.termination_held(NODE, handle=handle) == OldNodeLook(gone=True)
    assert sum(1 for e in management.log if e.verb == "get" and e.resource == "machines") == reads + 1
    assert not [e for e in k8s.log if e.resource == "machines"]


async def test_a_machine_namespace_without_the_nodes_machine_is_named_by_the_probe(
    make_cluster: Callable[..., KubernetesCluster], management: KubeEmulator, tmp_path: Path
) -> None:
    kubeconfig = write_kubeconfig(tmp_path / "management", management.host)
    cluster = make_cluster(
        replace={"strategy": "cluster-api"}, cluster_api={"kubeconfig": kubeconfig, "namespace": "capi-other"}
    )
    probe = await cluster.probe()
    assert not probe.ok
    assert probe.missing == (
        f"Machine capi-other/{MACHINE.split('/')[1]} of node {NODE} not found in the management cluster "
        "(kubernetes.cluster_api)",
    )


async def test_an_unreadable_management_kubeconfig_leaves_the_workload_cluster_usable(
    make_cluster: Callable[..., KubernetesCluster], management: KubeEmulator, tmp_path: Path
) -> None:
    cluster = make_cluster(
        replace={"strategy": "cluster-api"}, cluster_api={"kubeconfig": tmp_path / "missing"}
    )
    assert (await cluster.node(NODE)) is not None
    with pytest.raises(PermanentError, match="no client for the management cluster") as err:
        await cluster.replace(NODE, strategy="configured", incident_id="pc-1")
    assert err.value.reason == Reason.MISCONFIGURED
    assert not (await cluster.probe()).ok


async def test_the_management_cluster_as_a_context_of_the_same_kubeconfig(
    k8s: KubeEmulator, management: KubeEmulator, tmp_path: Path
) -> None:
    """``kubernetes.cluster_api.context`` alone: the workload kubeconfig's other context."""
    path = tmp_path / "kubeconfig"
    user = {"name": "pitcrew", "user": {"token": EMULATED_TOKEN}}
    path.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [
                    {"name": "workload", "cluster": {"server": k8s.host}},
                    {"name": "management", "cluster": {"server": management.host}},
                ],
                "users": [user],
                "contexts": [
                    {"name": "gpu-east", "context": {"cluster": "workload", "user": "pitcrew"}},
                    {"name": "mgmt", "context": {"cluster": "management", "user": "pitcrew"}},
                ],
                "current-context": "gpu-east",
            }
        )
    )
    settings = {
        "kubeconfig": path,
        "replace": {"strategy": "cluster-api"},
        "cluster_api": {"context": "mgmt"},
    }
    cluster = KubernetesCluster(KubernetesSettings.model_validate(settings))
    try:
        assert (await cluster.probe()).ok
        assert [e.resource for e in management.log if e.verb == "get"] == ["machines"]
    finally:
        await cluster.aclose()
