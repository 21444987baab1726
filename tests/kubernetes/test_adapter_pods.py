"""pitcrew's drain primitives and Slinky pod listing through the real client against the emulator.

Cases: the node's pods by field selector, without the never-drained namespaces, DaemonSet, mirror
and terminating pods recognisable; eviction through policy/v1 (201), a vanished pod counts as
evicted; a PDB refusal is ``TransientError(reason="pdb")`` naming the pod and the budget's message;
a pod under two budgets, which the API server refuses with HTTP 201 and a Failure Status of code 500, is
a ``PermanentError(reason="pdb")`` naming both; any other Failure Status on a 2xx is the error of its
code and message, as a failed request of that code would be; a force delete is refused unless ``force_delete_not_ready`` allows it, and then removes the pod at
once; slurmd pods of a Slinky NodeSet come with their node and Slurm hostname.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from bot.domain.nodemap import DEFAULT_SLINKY_SELECTOR
from bot.engine.errors import PermanentError, Reason, TransientError
from bot.engine.ports import PodRef
from bot.integrations.kubernetes import KubernetesCluster
from proving_ground.kubernetes.emulator import KubeEmulator
from proving_ground.kubernetes.world import slinky_pdb, training_pdb

NODE = "gpu-node-02"
WORKER = PodRef("training", "llama-pretrain-worker-2", owner_kind="PyTorchJob")


async def test_pods_on_the_node_skip_never_drained_namespaces(
    make_cluster: Callable[..., KubernetesCluster], k8s: KubeEmulator
) -> None:
    pods = await make_cluster().pods_on_node(NODE)
    assert [(p.ref, p.owner_kind, p.mirror, p.terminating) for p in pods] == [
        ("slurm/slurm-worker-gpu-h100-7xk2p", "NodeSet", False, False),
        ("training/ckpt-sync-29932360-8qz5v", "Job", False, True),
        ("training/llama-pretrain-worker-2", "PyTorchJob", False, False),
    ]
    [listing] = [e for e in k8s.log if e.resource == "pods" and e.verb == "list"]
    assert listing.namespace is None  # one list across namespaces, by field selector
    everything = await make_cluster(never_drain_namespaces=[]).pods_on_node(NODE)
    kinds = {p.ref: (p.owner_kind, p.mirror) for p in everything}
    assert kinds["gpu-operator/nvidia-dcgm-exporter-7wq4n"] == ("DaemonSet", False)
    assert kinds["kube-system/gpu-health-agent-gpu-node-02"] == ("Node", True)


async def test_eviction_goes_through_the_eviction_api(cluster: KubernetesCluster, k8s: KubeEmulator) -> None:
    await cluster.evict(WORKER)
    [evict] = [e for e in k8s.log if e.subresource == "eviction"]
    assert (evict.verb, evict.status, evict.name) == ("create", 201, WORKER.name)
    pod = k8s.get("pods", WORKER.name, "training")
    assert pod is None or pod["metadata"].get("deletionTimestamp")
    k8s.finish_terminating()
    await cluster.evict(WORKER)  # gone already: what the eviction wanted


async def test_a_budget_refusal_names_the_pod_and_the_budget(
    cluster: KubernetesCluster, k8s: KubeEmulator
) -> None:
    k8s.add("poddisruptionbudgets", training_pdb(min_available=1))
    with pytest.raises(TransientError) as err:
        await cluster.evict(WORKER)
    assert err.value.reason == "pdb"
    assert "training/llama-pretrain-worker-2" in str(err.value)
    assert "The disruption budget llama-pretrain needs 1 healthy pods and has 1 currently" in str(err.value)
    slurmd = PodRef("slurm", "slurm-worker-gpu-h100-7xk2p", owner_kind="NodeSet")
    k8s.add("poddisruptionbudgets", slinky_pdb())
    with pytest.raises(TransientError, match="slurm-workers-pdb-slurm"):
        await cluster.evict(slurmd)
    assert k8s.get("pods", WORKER.name, "training")["metadata"].get("deletionTimestamp") is None  # type: ignore[index]


async def test_force_delete_only_where_policy_allows(
    make_cluster: Callable[..., KubernetesCluster], k8s: KubeEmulator
) -> None:
    with pytest.raises(PermanentError) as err:
        await make_cluster().delete_pod(WORKER, force=True)
    assert err.value.reason == Reason.NOT_ALLOWED
    assert k8s.get("pods", WORKER.name, "training") is not None
    assert not [e for e in k8s.log if e.verb == "delete"]
    await make_cluster(force_delete_not_ready=True).delete_pod(WORKER, force=True)
    assert k8s.get("pods", WORKER.name, "training") is None


async def test_slurmd_pods_of_the_nodeset(cluster: KubernetesCluster) -> None:
    [pod] = await cluster.slurmd_pods("slurm", DEFAULT_SLINKY_SELECTOR)
    assert (pod.name, pod.node_name, pod.slurm_node, pod.namespace) == (
        "slurm-worker-gpu-h100-7xk2p",
        NODE,
        "gpu-002",
        "slurm",
    )


async def test_a_pod_under_two_budgets_is_refused_naming_both(
    cluster: KubernetesCluster, k8s: KubeEmulator
) -> None:
    k8s.add("poddisruptionbudgets", training_pdb(max_unavailable=1))
    wide = {"matchExpressions": [{"key": "training.kubeflow.org/job-name", "operator": "Exists"}]}
    k8s.add(
        "poddisruptionbudgets",
        {
            "metadata": {"name": "training-wide", "namespace": "training"},
            "spec": {"maxUnavailable": 1, "selector": wide},
        },
    )
    with pytest.raises(
        PermanentError, match=r"more than one PodDisruptionBudget \(llama-pretrain, training-wide\)"
    ) as err:
        await cluster.evict(WORKER)
    assert err.value.reason == "pdb"
    assert [e.status for e in k8s.log if e.subresource == "eviction"] == [201]  # a Failure Status
    assert k8s.get("pods", WORKER.name, "training")["metadata"].get("deletionTimestamp") is None  # type: ignore[index]


@pytest.mark.parametrize(
    ("code", "kind", "reason"),
    [(500, TransientError, Reason.UNAVAILABLE), (403, PermanentError, Reason.FORBIDDEN)],
)
async def test_another_failure_status_on_a_201_is_the_error_of_its_code(
    cluster: KubernetesCluster, k8s: KubeEmulator, code: int, kind: type[Exception], reason: str
) -> None:
    """A refusal in a 2xx answer is not taken for an eviction, whatever it says: it is the error a
    failed request of the Status' code would be (``client.refusal``)."""
    failure = {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": "the eviction subresource said no",
        "code": code,
    }
    k8s.inject(201, verb="create", subresource="eviction", body=failure)
    with pytest.raises(
        kind, match=rf"evict pod training/llama-pretrain-worker-2: {code} the eviction"
    ) as err:
        await cluster.evict(WORKER)
    assert getattr(err.value, "reason", None) == reason
