"""``deploy/kubernetes/rbac.yaml`` allows every request pitcrew sends, and holds no rule it does not need.

The requests are the ones pitcrew's adapter (User-Agent ``pitcrew/…``) sent to any emulator in this
session — every Kubernetes test that ran before this one — plus a tour of every adapter operation
run here, so the "every rule needed" half does not depend on which tests ran. Requests the tests
send with the bare client to set up or inspect the emulator are not pitcrew's and do not count.
The comparison (``tests.kubernetes.rbac.compare``) also refuses wildcards and dangling bindings.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml

from bot.engine.errors import PermanentError
from bot.engine.ports import PodRef
from bot.integrations.kubernetes import KubernetesCluster
from tests.kubernetes import rbac
from tests.kubernetes.emulator import KubeEmulator
from tests.kubernetes.faults import LoggedRequest

NODE = "gpu-node-02"


def _pitcrews(log: list[LoggedRequest]) -> list[LoggedRequest]:
    return [e for e in log if e.user_agent.startswith("pitcrew/")]


async def _tour(make: Callable[..., KubernetesCluster], k8s: KubeEmulator, tmp_path: Path) -> None:
    """Every operation of the adapter once, each replace strategy on the node then in place."""
    template = tmp_path / "job.yaml"
    template.write_text(
        yaml.safe_dump({"spec": {"template": {"spec": {"containers": [{"name": "x", "image": "x"}]}}}})
    )
    cluster = make(
        replace={"strategy": "cluster-api"},
        jobs={"reset_gpu_template": template},
        force_delete_not_ready=True,
    )
    assert (await cluster.probe()).ok
    await cluster.count_nodes()
    await cluster.cordon(NODE, incident_id="pc-1", reason="r")
    await cluster.uncordon(NODE, incident_id="pc-1")
    pods = await cluster.pods_on_node(NODE)
    await cluster.evict(PodRef("training", "llama-pretrain-worker-2"))
    await cluster.delete_pod(pods[0], force=True)
    await cluster.slurmd_pods("slurm", {"app.kubernetes.io/name": "slurmd"})
    k8s.job_exit_codes["pitcrew-reset-gpu-pc-1"] = 1
    with pytest.raises(PermanentError):  # a failed Job: its pod's exit code is read
        await cluster.reset_gpu(NODE, ["0"], incident_id="pc-1")
    await make(replace={"strategy": "karpenter"}).replace(NODE, strategy="configured", incident_id="pc-1")
    await k8s_settled(k8s)
    [replacement] = [n for (kind, _, n) in k8s.objects if kind == "nodes"]
    # The replacement still carries the CAPI annotations naming the Machine: replace it that way too.
    await cluster.replace(replacement, strategy="configured", incident_id="pc-2")
    await make(replace={"strategy": "delete-node"}).replace(
        replacement, strategy="configured", incident_id="pc-3"
    )


async def k8s_settled(k8s: KubeEmulator) -> None:
    await asyncio.sleep(k8s.replace_delay + k8s.ready_delay + 0.1)


async def test_rbac_yaml_allows_all_pitcrew_sends_and_nothing_more(
    make_cluster: Callable[..., KubernetesCluster],
    k8s: KubeEmulator,
    k8s_requests: list[LoggedRequest],
    tmp_path: Path,
) -> None:
    await _tour(make_cluster, k8s, tmp_path)
    tour = _pitcrews(k8s.log)
    result = rbac.compare([*tour, *_pitcrews(k8s_requests)], rbac.load())
    assert result.denied == ()
    assert result.unused == ()
    print(
        f"\n[rbac] {len(tour)} tour requests + {len(_pitcrews(k8s_requests))} from earlier tests, all allowed"
    )


def test_the_comparison_catches_a_missing_and_an_extra_rule() -> None:
    docs = rbac.load()
    [role] = [d for d in docs if d["kind"] == "ClusterRole" and d["metadata"]["name"] == "pitcrew"]
    role["rules"] = [r for r in role["rules"] if r["resources"] != ["pods/eviction"]]
    role["rules"].append({"apiGroups": [""], "resources": ["secrets"], "verbs": ["get"]})
    evict = LoggedRequest(
        "POST", "/api/v1/namespaces/t/pods/p/eviction", "create", "", "pods", "eviction", "t", "p", None
    )
    result = rbac.compare([evict], docs)
    assert result.denied == ("create core/pods/eviction in t",)
    assert rbac.Grant("pitcrew", None, "", "secrets", "get") in result.unused
    role["rules"].append({"apiGroups": ["*"], "resources": ["nodes"], "verbs": ["get"]})
    with pytest.raises(AssertionError, match="grants apiGroups"):
        rbac.compare([], docs)
