"""``deploy/kubernetes/rbac.yaml`` allows every request pitcrew sends, and holds no rule it does not need.

The requests are the ones pitcrew's adapter (User-Agent ``pitcrew/…``) sent to any emulator in this
session — every Kubernetes test that ran before this one — plus a tour of every adapter operation
run here, so the "every rule needed" half does not depend on which tests ran. Requests the tests
send with the bare client to set up or inspect the emulator are not pitcrew's and do not count.
The comparison (``tests.kubernetes.rbac.compare``) also refuses wildcards and dangling bindings.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from bot.integrations.kubernetes import KubernetesCluster
from tests.kubernetes import rbac
from tests.kubernetes.emulator import KubeEmulator
from tests.kubernetes.faults import LoggedRequest


async def test_rbac_yaml_allows_all_pitcrew_sends_and_nothing_more(
    make_cluster: Callable[..., KubernetesCluster],
    k8s: KubeEmulator,
    k8s_requests: list[LoggedRequest],
    tmp_path: Path,
) -> None:
    await rbac.tour(make_cluster, k8s, tmp_path)
    tour = rbac.pitcrew_requests(k8s.log)
    result = rbac.compare([*tour, *rbac.pitcrew_requests(k8s_requests)], rbac.load())
    assert result.denied == ()
    assert result.unused == ()
    print(
        f"\n[rbac] {len(tour)} tour requests + {len(rbac.pitcrew_requests(k8s_requests))} from earlier tests, all allowed"
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
