"""pitcrew's RBAC allows every request pitcrew sends, and holds no rule it does not need — as
written (``deploy/kubernetes/rbac.yaml`` with every replace component) and as rendered by kustomize
for each overlay, for the base alone and for the base with each replace component.

The requests are the ones pitcrew's adapter (User-Agent ``pitcrew/…``) sent to any emulator in this
session — every Kubernetes test that ran before this one — plus a tour of every adapter operation
run here, so the "every rule needed" half does not depend on which tests ran. Requests the tests
send with the bare client to set up or inspect the emulator are not pitcrew's and do not count.
A rendering is held against the tour with its own replace strategy (the one its configuration
names, or its component's) and the session's requests minus those only another strategy sends.
The comparison (``tests.kubernetes.rbac.compare``) also refuses wildcards and dangling bindings.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import yaml

from bot.integrations.kubernetes import KubernetesCluster
from proving_ground.kubernetes.emulator import KubeEmulator
from proving_ground.kubernetes.faults import LoggedRequest
from tests.kubernetes import rbac
from tests.packaging.manifests import rendered


async def test_rbac_yaml_and_components_allow_all_pitcrew_sends_and_nothing_more(
    make_cluster: Callable[..., KubernetesCluster],
    k8s: KubeEmulator,
    k8s_requests: list[LoggedRequest],
    tmp_path: Path,
) -> None:
    await rbac.tour(make_cluster, k8s, tmp_path)
    tour = rbac.pitcrew_requests(k8s.log)
    result = rbac.compare([*tour, *rbac.pitcrew_requests(k8s_requests)], rbac.load_all_strategies())
    assert result.denied == ()
    assert result.unused == ()
    print(
        f"\n[rbac] {len(tour)} tour requests + {len(rbac.pitcrew_requests(k8s_requests))} from earlier tests, all allowed"
    )


def _strategy(name: str) -> str:
    if name.startswith("base+"):
        return name.removeprefix("base+")
    config = yaml.safe_load(rendered(name).config_text())
    return str(config["kubernetes"]["replace"]["strategy"])


@pytest.mark.parametrize(
    "name", ["observe", "auto", "base", *(f"base+{strategy}" for strategy in rbac.STRATEGIES)]
)
async def test_each_rendering_allows_its_strategys_requests_and_nothing_more(
    name: str,
    make_cluster: Callable[..., KubernetesCluster],
    k8s: KubeEmulator,
    k8s_requests: list[LoggedRequest],
    tmp_path: Path,
) -> None:
    strategy = _strategy(name)
    documents = rendered(name).objects
    await rbac.tour(make_cluster, k8s, tmp_path, tuple(s for s in rbac.STRATEGIES if s == strategy))
    tour = rbac.pitcrew_requests(k8s.log)
    earlier = rbac.for_strategy(rbac.pitcrew_requests(k8s_requests), strategy)
    result = rbac.compare([*tour, *earlier], documents)
    assert result.denied == ()
    assert result.unused == ()
    # The tour alone needs every rule too: the rendering is right whichever tests ran before.
    assert rbac.compare(tour, documents).unused == ()


def test_a_rendering_missing_its_component_denies_the_strategys_verbs() -> None:
    """The per-strategy comparison can fail: the base alone cannot replace through Cluster API,
    and the karpenter component's grants go unused by a cluster-api adapter."""
    delete_machine = LoggedRequest(
        "DELETE",
        "/apis/cluster.x-k8s.io/v1beta1/machines/m",
        "delete",
        "cluster.x-k8s.io",
        "machines",
        None,
        None,
        "m",
        None,
    )
    assert rbac.compare([delete_machine], rendered("base").objects).denied == (
        "delete cluster.x-k8s.io/machines",
    )
    unused = rbac.compare(
        rbac.for_strategy([delete_machine], "cluster-api"), rendered("base+karpenter").objects
    ).unused
    assert {(g.resource, g.verb) for g in unused} >= {("nodeclaims", "list"), ("nodeclaims", "delete")}
    assert rbac.for_strategy([delete_machine], "karpenter") == []


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
