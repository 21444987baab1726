"""Deleting a CAPI Machine or a Karpenter NodeClaim makes the emulator's controller replace the Node.

Cases: the DELETE answers 200 with the object (``deletionTimestamp``, ``deletionGracePeriodSeconds: 0``,
generation + 1, as in the fixture); then the old Node goes, a new handle points at a new Node, and
that Node registers NotReady and turns Ready after ``ready_delay``. A deleted Node object is replaced
by nothing; a terminated instance is, by its cloud group.
"""

from __future__ import annotations

import asyncio
import os
import sys

import pytest
from kubernetes.aio import client

from proving_ground.kubernetes.emulator import KubeEmulator, load_fixture

NODE = "gpu-node-02"


async def _ready_nodes(core: client.CoreV1Api) -> dict[str, str]:
    nodes = (await core.list_node()).items
    return {n.metadata.name: next(c.status for c in n.status.conditions if c.type == "Ready") for n in nodes}


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
    k8s.ready_delay = 0.3
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
    await asyncio.sleep(0.15)
    registered = await _ready_nodes(core)
    assert NODE not in registered and list(registered.values()) == ["False"]
    (new_node,) = registered
    if namespace:
        handles = (await custom.list_namespaced_custom_object(group, version, namespace, plural))["items"]
        assert [h["status"]["nodeRef"]["name"] for h in handles] == [new_node]
    else:
        handles = (await custom.list_cluster_custom_object(group, version, plural))["items"]
        assert [h["status"]["nodeName"] for h in handles] == [new_node]
    assert name not in [h["metadata"]["name"] for h in handles]
    await asyncio.sleep(0.4)
    assert await _ready_nodes(core) == {new_node: "True"}


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
    await asyncio.sleep(0.4)
    (new_node,) = (await _ready_nodes(core)).items()
    assert new_node[0].startswith(f"{NODE}-") and new_node[1] == "True"
