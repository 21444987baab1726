"""The emulator keeps the apiserver rules pitcrew relies on, proven through the real ``kubernetes.aio`` client.

Nodes: get/list by label; 404 Status; a stale resourceVersion is a 409 and every write bumps it; merge and
strategic merge both replace ``spec.taints`` whole (a foreign taint survives only when read and sent back),
while strategic merge merges conditions by type; JSON patch, a failed op a 400, and the client's rewrite
of a dict body to strategic merge; a bad taint effect is a 422; CRDs refuse strategic merge with 415.
"""

from __future__ import annotations

from typing import Any, cast

import pytest
from kubernetes.aio import client
from kubernetes.aio.client.exceptions import ApiException

from proving_ground.kubernetes.emulator import KubeEmulator, load_fixture

NODE = "gpu-node-02"
MERGE = "application/merge-patch+json"
STRATEGIC = "application/strategic-merge-patch+json"
JSONPATCH = "application/json-patch+json"
FOREIGN = {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}
OURS = {"key": "pitcrew.dev/gpu-fault", "value": "xid-79", "effect": "NoSchedule"}


def _status(exc: ApiException) -> dict[str, Any]:
    import json

    return cast(dict[str, Any], json.loads(exc.body))


async def test_node_get_and_list_by_label(k8s_client: client.ApiClient) -> None:
    core = client.CoreV1Api(k8s_client)
    node = await core.read_node(NODE)
    assert node.metadata.resource_version == "48213378"
    assert node.status.capacity["nvidia.com/gpu"] == "8"
    hits = await core.list_node(label_selector="nvidia.com/gpu.present=true")
    misses = await core.list_node(label_selector="nvidia.com/gpu.present!=true")
    assert [n.metadata.name for n in hits.items] == [NODE]
    assert misses.items == []


async def test_unknown_node_is_a_404_status(k8s_client: client.ApiClient) -> None:
    with pytest.raises(ApiException) as err:
        await client.CoreV1Api(k8s_client).read_node("gpu-node-99")
    assert err.value.status == 404
    assert _status(err.value) == {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": 'nodes "gpu-node-99" not found',
        "reason": "NotFound",
        "details": {"name": "gpu-node-99", "kind": "nodes"},
        "code": 404,
    }


async def test_stale_resource_version_is_a_409_and_writes_bump_it(k8s_client: client.ApiClient) -> None:
    core = client.CoreV1Api(k8s_client)
    rv = (await core.read_node(NODE)).metadata.resource_version
    body = {"metadata": {"resourceVersion": rv}, "spec": {"unschedulable": True}}
    patched = await core.patch_node(NODE, body, _content_type=MERGE)
    assert patched.spec.unschedulable is True
    assert int(patched.metadata.resource_version) > int(rv)
    with pytest.raises(ApiException) as err:
        await core.patch_node(NODE, body, _content_type=MERGE)  # the same RV again: now stale
    expected = load_fixture("status-409-conflict.json")
    assert err.value.status == 409
    assert _status(err.value) == expected
    unguarded = await core.patch_node(NODE, {"metadata": {"labels": {"x": "y"}}}, _content_type=MERGE)
    assert int(unguarded.metadata.resource_version) > int(patched.metadata.resource_version)


@pytest.mark.parametrize("content_type", [MERGE, STRATEGIC])
async def test_taints_are_replaced_whole_by_both_merge_kinds(
    k8s_client: client.ApiClient, content_type: str
) -> None:
    core = client.CoreV1Api(k8s_client)
    dropped = await core.patch_node(NODE, {"spec": {"taints": [OURS]}}, _content_type=content_type)
    assert [t.key for t in dropped.spec.taints] == ["pitcrew.dev/gpu-fault"]


async def test_read_modify_patch_keeps_a_foreign_taint(
    k8s: KubeEmulator, k8s_client: client.ApiClient
) -> None:
    core = client.CoreV1Api(k8s_client)
    node = await core.read_node(NODE)
    taints = k8s_client.sanitize_for_serialization(node.spec.taints)  # camelCase, Nones dropped
    body = {
        "metadata": {"resourceVersion": node.metadata.resource_version},
        "spec": {"taints": [*taints, OURS]},
    }
    patched = await core.patch_node(NODE, body, _content_type=STRATEGIC)
    assert [t.key for t in patched.spec.taints] == ["nvidia.com/gpu", "pitcrew.dev/gpu-fault"]
    stored = k8s.get("nodes", NODE)
    assert stored is not None
    assert stored["spec"]["taints"][0] == FOREIGN


async def test_strategic_merge_merges_conditions_by_type(k8s_client: client.ApiClient) -> None:
    core = client.CoreV1Api(k8s_client)
    body = {"status": {"conditions": [{"type": "Ready", "status": "False", "reason": "KubeletNotReady"}]}}
    merged = await core.patch_node(NODE, body, _content_type=STRATEGIC)
    assert [c.type for c in merged.status.conditions] == [
        "MemoryPressure",
        "DiskPressure",
        "PIDPressure",
        "Ready",
    ]
    assert merged.status.conditions[-1].status == "False"
    replaced = await core.patch_node(NODE, body, _content_type=MERGE)
    assert [c.type for c in replaced.status.conditions] == ["Ready"]


async def test_json_patch_and_the_clients_rewrite_of_a_dict_body(
    k8s: KubeEmulator, k8s_client: client.ApiClient
) -> None:
    core = client.CoreV1Api(k8s_client)
    ops = [
        {"op": "add", "path": "/spec/taints/-", "value": OURS},
        {"op": "add", "path": "/spec/unschedulable", "value": True},
    ]
    patched = await core.patch_node(NODE, ops, _content_type=JSONPATCH)
    assert [t.key for t in patched.spec.taints] == ["nvidia.com/gpu", "pitcrew.dev/gpu-fault"]
    with pytest.raises(ApiException) as err:
        await core.patch_node(
            NODE, [{"op": "replace", "path": "/spec/podCIDRx", "value": "x"}], _content_type=JSONPATCH
        )
    assert err.value.status == 400
    # kubernetes.aio sends a dict body declared as JSON Patch as a strategic merge instead.
    await core.patch_node(NODE, {"metadata": {"labels": {"a": "b"}}}, _content_type=JSONPATCH)
    assert [r.content_type for r in k8s.log if r.verb == "patch"] == [JSONPATCH, JSONPATCH, STRATEGIC]


async def test_bad_taint_effect_is_a_422(k8s_client: client.ApiClient) -> None:
    bad = {"spec": {"taints": [FOREIGN, {**OURS, "effect": "NoSchedulee"}]}}
    with pytest.raises(ApiException) as err:
        await client.CoreV1Api(k8s_client).patch_node(NODE, bad, _content_type=MERGE)
    assert err.value.status == 422
    assert (
        _status(err.value)["details"]["causes"]
        == load_fixture("status-422-invalid.json")["details"]["causes"]
    )


async def test_crds_refuse_strategic_merge_with_415(k8s_client: client.ApiClient) -> None:
    custom = client.CustomObjectsApi(k8s_client)
    with pytest.raises(ApiException) as err:
        await custom.patch_cluster_custom_object(
            "karpenter.sh", "v1", "nodeclaims", "gpu-h100-x7k2q", {"metadata": {}}, _content_type=STRATEGIC
        )
    assert err.value.status == 415
    assert _status(err.value) == load_fixture("status-415-unsupported-media-type.json")
