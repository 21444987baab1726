"""Pods, eviction against PodDisruptionBudgets, injected faults and the request log, over ``kubernetes.aio``.

Cases: node conditions a test flips; pods by field and label selector, ordered by namespace/name, an
unsupported field a 400; DaemonSet, mirror and terminating pods as in the fixture; graceful delete keeps
the pod listed as terminating until the kubelet stand-in removes it, force delete removes it at once;
eviction is 201 with no PDB (the client parses that Status as a ``V1Eviction``, so the log shows the code) and 404 for a missing pod; the Slinky PDB answers 429 (fixture body, no
Retry-After) until the pod loses ``pod-protect``; a stale PDB answers 429 with ``Retry-After: 10``; a
pod under two budgets is answered 201 with a Failure Status of code 500 and stays; a
pod that is not Ready is evicted past a budget with no disruption left when the budget has its desired
healthy pods or says ``AlwaysAllow`` (as the API server does), even while the budget is stale (that
429 comes after the unready pod's pass), and a gone kubelet's pods are not Ready;
an injected 500 is retried by the client, an injected 500 on a PATCH surfaces the fixture body, an
injected 429 carries Retry-After, an injected delay times a request out (``kubernetes.aio`` does not
retry timeouts);
the request log names verb, resource, subresource, namespace and content type.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any, cast

import pytest
from kubernetes.aio import client
from kubernetes.aio.client.exceptions import ApiException

from proving_ground.kubernetes.emulator import KubeEmulator, load_fixture
from proving_ground.kubernetes.world import slinky_pdb

NODE = "gpu-node-02"
MERGE = "application/merge-patch+json"
SLURMD = "slurm-worker-gpu-h100-7xk2p"
WORKER = "llama-pretrain-worker-2"


def _status(exc: ApiException) -> dict[str, Any]:
    return cast(dict[str, Any], json.loads(exc.body))


def _eviction(name: str, namespace: str, grace: int | None = None) -> client.V1Eviction:
    options = client.V1DeleteOptions(grace_period_seconds=grace) if grace is not None else None
    return client.V1Eviction(
        api_version="policy/v1",
        kind="Eviction",
        metadata=client.V1ObjectMeta(name=name, namespace=namespace),
        delete_options=options,
    )


async def test_a_flipped_node_condition_is_seen_with_a_new_resource_version(
    k8s: KubeEmulator, k8s_client: client.ApiClient
) -> None:
    core = client.CoreV1Api(k8s_client)
    before = await core.read_node(NODE)
    k8s.set_node_condition(NODE, "Ready", "False")
    after = await core.read_node(NODE)
    assert [c.status for c in after.status.conditions if c.type == "Ready"] == ["False"]
    assert after.metadata.resource_version != before.metadata.resource_version


async def test_pods_by_field_and_label_selector(k8s_client: client.ApiClient) -> None:
    core = client.CoreV1Api(k8s_client)
    pods = await core.list_pod_for_all_namespaces(field_selector=f"spec.nodeName={NODE}")
    assert [(p.metadata.namespace, p.metadata.name) for p in pods.items] == [
        (p["metadata"]["namespace"], p["metadata"]["name"])
        for p in load_fixture("pods-on-node-list.json")["items"]
    ]
    assert all(p.kind is None and p.api_version is None for p in pods.items)
    none = await core.list_pod_for_all_namespaces(field_selector="spec.nodeName=gpu-node-03")
    not_running = await core.list_pod_for_all_namespaces(
        field_selector=f"spec.nodeName={NODE},status.phase!=Running"
    )
    assert none.items == [] and not_running.items == []
    training = await core.list_namespaced_pod(
        "training", label_selector="training.kubeflow.org/replica-type=worker"
    )
    assert [p.metadata.name for p in training.items] == [WORKER]
    with pytest.raises(ApiException) as err:
        await core.list_pod_for_all_namespaces(field_selector="spec.nodeNam=x")
    assert err.value.status == 400
    assert _status(err.value)["message"] == "field label not supported: spec.nodeNam"


async def test_daemonset_mirror_and_terminating_pods_look_as_in_the_fixture(
    k8s_client: client.ApiClient,
) -> None:
    pods = {
        p.metadata.name: p for p in (await client.CoreV1Api(k8s_client).list_pod_for_all_namespaces()).items
    }
    assert pods["nvidia-dcgm-exporter-7wq4n"].metadata.owner_references[0].kind == "DaemonSet"
    mirror = pods[f"gpu-health-agent-{NODE}"].metadata
    assert "kubernetes.io/config.mirror" in mirror.annotations and mirror.owner_references[0].kind == "Node"
    assert pods["ckpt-sync-29932360-8qz5v"].metadata.deletion_timestamp is not None
    assert pods[WORKER].metadata.deletion_timestamp is None


async def test_graceful_delete_terminates_then_force_delete_removes(
    k8s: KubeEmulator, k8s_client: client.ApiClient
) -> None:
    core = client.CoreV1Api(k8s_client)
    k8s.pod_termination_delay = None
    gone = await core.delete_namespaced_pod(WORKER, "training", grace_period_seconds=30)
    assert gone.metadata.deletion_timestamp is not None and gone.metadata.deletion_grace_period_seconds == 30
    assert (await core.read_namespaced_pod(WORKER, "training")).metadata.deletion_timestamp is not None
    await core.delete_namespaced_pod(WORKER, "training", grace_period_seconds=0)
    with pytest.raises(ApiException) as err:
        await core.read_namespaced_pod(WORKER, "training")
    assert _status(err.value) == load_fixture("status-404-notfound.json")


async def test_eviction_without_a_budget_is_201_and_the_kubelet_removes_the_pod(
    k8s: KubeEmulator, k8s_client: client.ApiClient
) -> None:
    core = client.CoreV1Api(k8s_client)
    k8s.pod_termination_delay = 0.3
    await core.create_namespaced_pod_eviction(WORKER, "training", _eviction(WORKER, "training", 30))
    assert k8s.log[-1].status == 201
    assert (await core.read_namespaced_pod(WORKER, "training")).metadata.deletion_grace_period_seconds == 30
    await asyncio.sleep(0.5)
    with pytest.raises(ApiException) as err:
        await core.create_namespaced_pod_eviction(WORKER, "training", _eviction(WORKER, "training"))
    assert err.value.status == 404


async def test_slinky_budget_refuses_until_the_pod_is_unprotected(
    k8s: KubeEmulator, k8s_client: client.ApiClient
) -> None:
    core = client.CoreV1Api(k8s_client)
    k8s.add("poddisruptionbudgets", slinky_pdb())
    with pytest.raises(ApiException) as err:
        await core.create_namespaced_pod_eviction(SLURMD, "slurm", _eviction(SLURMD, "slurm"))
    assert err.value.status == 429
    assert "Retry-After" not in err.value.headers
    expected = load_fixture("status-429-eviction-pdb.json")
    expected["details"]["causes"][0]["message"] = (
        "The disruption budget slurm-workers-pdb-slurm needs 1 healthy pods and has 1 currently"
    )
    assert _status(err.value) == expected
    unprotect = {"metadata": {"labels": {"nodeset.slinky.slurm.net/pod-protect": None}}}
    await core.patch_namespaced_pod(SLURMD, "slurm", unprotect, _content_type=MERGE)
    await core.create_namespaced_pod_eviction(SLURMD, "slurm", _eviction(SLURMD, "slurm"))
    assert k8s.log[-1].status == 201


async def test_a_stale_budget_answers_429_with_retry_after(
    k8s: KubeEmulator, k8s_client: client.ApiClient
) -> None:
    k8s.add("poddisruptionbudgets", slinky_pdb(generation=2, observed=1))
    with pytest.raises(ApiException) as err:
        await client.CoreV1Api(k8s_client).create_namespaced_pod_eviction(
            SLURMD, "slurm", _eviction(SLURMD, "slurm")
        )
    assert err.value.status == 429 and err.value.headers["Retry-After"] == "10"
    assert _status(err.value) == load_fixture("status-429-eviction-pdb-retryafter.json")


async def test_a_pod_under_two_budgets_is_answered_201_with_a_failure_status(
    k8s: KubeEmulator, k8s_client: client.ApiClient
) -> None:
    """pkg/registry/core/pod/storage/eviction.go returns a Failure Status (code 500) with no error, and
    handlers/create.go writes it as 201: the client raises nothing, only the body says no."""
    for name in ("serve", "serve-wide"):
        budget = _budget(1)
        budget["metadata"]["name"] = name
        k8s.add("poddisruptionbudgets", budget)
    [pod] = _replicas(k8s, 1, 0)
    answer = await client.CoreV1Api(k8s_client).create_namespaced_pod_eviction_with_http_info(
        pod, "training", _eviction(pod, "training")
    )
    assert answer.status_code == 201
    assert json.loads(answer.raw_data) == {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": "This pod has more than one PodDisruptionBudget, which the eviction subresource does not support.",
        "code": 500,
    }
    assert k8s.get("pods", pod, "training")["metadata"].get("deletionTimestamp") is None  # type: ignore[index]


def _replicas(k8s: KubeEmulator, ready: int, unready: int) -> list[str]:
    """``ready`` + ``unready`` copies of the worker pod, labelled ``app: serve``; their names."""
    worker = k8s.get("pods", WORKER, "training")
    assert worker is not None
    names = []
    for n in range(ready + unready):
        pod = json.loads(json.dumps(worker))
        pod["metadata"] = {"name": f"serve-{n}", "namespace": "training", "labels": {"app": "serve"}}
        conditions = pod.setdefault("status", {}).setdefault("conditions", [])
        conditions[:] = [c for c in conditions if c.get("type") != "Ready"]
        conditions.append({"type": "Ready", "status": "True" if n < ready else "False"})
        pod["status"]["phase"] = "Running"
        k8s.add("pods", pod)
        names.append(f"serve-{n}")
    return names


def _budget(min_available: int, policy: str | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {"minAvailable": min_available, "selector": {"matchLabels": {"app": "serve"}}}
    if policy is not None:
        spec["unhealthyPodEvictionPolicy"] = policy
    return {"metadata": {"name": "serve", "namespace": "training", "generation": 1}, "spec": spec}


@pytest.mark.parametrize(
    ("ready", "unready", "min_available", "policy", "status"),
    [
        (2, 1, 2, None, 201),  # healthy enough: the unready pod goes, no disruption taken
        (1, 1, 2, None, 429),  # short of healthy: IfHealthyBudget (the default) keeps it
        (1, 1, 2, "IfHealthyBudget", 429),
        (1, 1, 2, "AlwaysAllow", 201),  # the budget never holds an unready pod
    ],
)
async def test_an_unready_pod_is_evicted_as_the_api_server_decides(
    k8s: KubeEmulator, k8s_client: client.ApiClient, ready: int, unready: int, min_available: int,
    policy: str | None, status: int,
) -> None:  # fmt: skip
    """pkg/registry/core/pod/storage/eviction.go: a pod that is not Ready is evicted when the budget
    says ``AlwaysAllow`` or has its desired healthy pods, whatever ``disruptionsAllowed`` is (0 here:
    no Ready pod may go)."""
    names = _replicas(k8s, ready, unready)
    k8s.add("poddisruptionbudgets", _budget(min_available, policy))
    core = client.CoreV1Api(k8s_client)
    with pytest.raises(ApiException) as refused:
        await core.create_namespaced_pod_eviction(names[0], "training", _eviction(names[0], "training"))
    assert refused.value.status == 429  # a Ready pod: the budget allows no disruption
    unready_pod = names[-1]
    if status == 201:
        await core.create_namespaced_pod_eviction(unready_pod, "training", _eviction(unready_pod, "training"))
        assert k8s.log[-1].status == 201
    else:
        with pytest.raises(ApiException) as err:
            await core.create_namespaced_pod_eviction(
                unready_pod, "training", _eviction(unready_pod, "training")
            )
        assert err.value.status == 429


@pytest.mark.parametrize("policy", [None, "AlwaysAllow"])
async def test_an_unready_pod_under_a_stale_budget_is_evicted(
    k8s: KubeEmulator, k8s_client: client.ApiClient, policy: str | None
) -> None:
    """pkg/registry/core/pod/storage/eviction.go lets an unready pod go (``AlwaysAllow``, or the budget
    has its desired healthy pods) before ``checkAndDecrement``, whose first test is the stale status
    (``observedGeneration < generation`` → 429 with Retry-After): a stale budget holds only Ready pods."""
    names = _replicas(k8s, 2, 1)
    budget = _budget(2, policy)
    budget["metadata"]["generation"] = 2
    budget["status"] = {"observedGeneration": 1}
    k8s.add("poddisruptionbudgets", budget)
    core = client.CoreV1Api(k8s_client)
    with pytest.raises(ApiException) as stale:
        await core.create_namespaced_pod_eviction(names[0], "training", _eviction(names[0], "training"))
    assert stale.value.status == 429 and stale.value.headers["Retry-After"] == "10"
    await core.create_namespaced_pod_eviction(names[-1], "training", _eviction(names[-1], "training"))
    assert k8s.log[-1].status == 201


async def test_a_gone_kubelet_marks_its_pods_not_ready_and_their_budget_lets_them_go(
    k8s: KubeEmulator, k8s_client: client.ApiClient
) -> None:
    """The node lifecycle controller marks a dead node's pods not Ready: one whose budget allows no
    disruption, but lets unhealthy pods go (``AlwaysAllow``), is evicted then, and stays
    terminating (no kubelet confirms)."""
    names = _replicas(k8s, 3, 0)
    for other in names[1:]:  # the other replicas run elsewhere
        pod = k8s.get("pods", other, "training")
        assert pod is not None
        pod["spec"]["nodeName"] = "gpu-node-09"
    k8s.pod_termination_delay = 0.05
    k8s.add("poddisruptionbudgets", _budget(3, "AlwaysAllow"))
    core = client.CoreV1Api(k8s_client)
    with pytest.raises(ApiException) as refused:
        await core.create_namespaced_pod_eviction(names[0], "training", _eviction(names[0], "training"))
    assert refused.value.status == 429  # Ready, and the budget allows no disruption
    dead = k8s.get("pods", names[0], "training")
    assert dead is not None
    k8s.kubelet_gone(dead["spec"]["nodeName"])
    assert [c["status"] for c in dead["status"]["conditions"] if c["type"] == "Ready"] == ["False"]
    await core.create_namespaced_pod_eviction(names[0], "training", _eviction(names[0], "training"))
    assert k8s.log[-1].status == 201
    await asyncio.sleep(0.2)
    left = k8s.get("pods", names[0], "training")  # no kubelet confirms: terminating for good
    assert left is not None and left["metadata"].get("deletionTimestamp")


async def test_an_injected_500_on_a_read_is_retried_by_the_client(
    k8s: KubeEmulator, k8s_client: client.ApiClient
) -> None:
    k8s.inject(500, verb="get", resource="nodes")
    node = await client.CoreV1Api(k8s_client).read_node(NODE)
    assert node.metadata.name == NODE
    assert [(r.verb, r.status) for r in k8s.log] == [("get", 500), ("get", 200)]


async def test_injected_500_and_429_on_writes_and_lists_surface(
    k8s: KubeEmulator, k8s_client: client.ApiClient
) -> None:
    core = client.CoreV1Api(k8s_client)
    k8s.inject(500, verb="patch", resource="nodes")
    with pytest.raises(ApiException) as err:
        await core.patch_node(NODE, {"spec": {"unschedulable": True}}, _content_type=MERGE)
    assert err.value.status == 500 and _status(err.value) == load_fixture("status-500.json")
    k8s.inject(429, verb="list", resource="pods", retry_after=2)
    with pytest.raises(ApiException) as err:
        await core.list_pod_for_all_namespaces()
    assert err.value.status == 429 and err.value.headers["Retry-After"] == "2"
    assert (await core.read_node(NODE)).spec.unschedulable is None  # the failed patch wrote nothing


async def test_an_injected_delay_times_the_client_out(
    k8s: KubeEmulator, k8s_client: client.ApiClient
) -> None:
    k8s.inject(delay=1.0, verb="get", resource="nodes")
    with pytest.raises(asyncio.TimeoutError):
        await client.CoreV1Api(k8s_client).read_node(NODE, _request_timeout=0.2)
    # The delay was the first request's alone: the next is answered within less than it (0.9 s, not
    # 0.2 s, whose margin a loaded machine can eat).
    node = await client.CoreV1Api(k8s_client).read_node(NODE, _request_timeout=0.9)
    assert node.metadata.name == NODE
    assert [r.verb for r in k8s.log] == ["get", "get"]


async def test_the_request_log_names_what_rbac_needs(k8s: KubeEmulator, k8s_client: client.ApiClient) -> None:
    core = client.CoreV1Api(k8s_client)
    await core.patch_node(NODE, {"spec": {"unschedulable": True}}, _content_type=MERGE)
    await core.list_pod_for_all_namespaces(field_selector=f"spec.nodeName={NODE}")
    await core.create_namespaced_pod_eviction(WORKER, "training", _eviction(WORKER, "training"))
    seen = [
        (r.method, r.verb, r.api_group, r.resource, r.subresource, r.namespace, r.content_type)
        for r in k8s.log
    ]
    assert seen == [
        ("PATCH", "patch", "", "nodes", None, None, MERGE),
        ("GET", "list", "", "pods", None, None, "application/json"),
        ("POST", "create", "", "pods", "eviction", "training", "application/json"),
    ]
