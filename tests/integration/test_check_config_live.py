"""``pitcrew check-config --live`` against real far sides: the Slurm cluster harness (slurmctld,
slurmd, munge, slurmrestd), a real Prometheus and the Kubernetes API emulator (real HTTP, reached
through a kubeconfig as an operator's laptop would).

- scontrol backend + Prometheus: every line ``ok``, the journal's line says there is nothing to
  reach, the store's that it has no tables yet (and it is not created), exit 0;
- REST backend: slurmrestd answers with our token;
- Prometheus down: exit 1, its line ``FAIL`` and the missing Prometheus named on stderr, while
  Slurm's line is still ``ok`` (one failure never hides the others);
- a token slurmrestd refuses: exit 1 naming the token it needs;
- ``--live`` changes nothing: the Slurm nodes' states are the same before and after;
- ``integrations.cluster: kubernetes``: Slurm, Kubernetes and Prometheus all ``ok``, exit 0, and
  pitcrew asked the API server for each verb and read each fleet node's Machine; the emulator denying
  one verb: exit 1, the Kubernetes line ``FAIL`` and the verb named on stderr, the others ``ok``;
- an exec-plugin kubeconfig whose plugin fails (an expired login): exit 1, the plugin and its error named;
- the cluster-api overlay's configuration against the RBAC the base grants without the
  replace-cluster-api component (the emulator answers each review from the rendered manifest):
  the Machine verbs are named, nothing else.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from bot.config import KubernetesSettings
from bot.integrations.kubernetes.probe import needed
from proving_ground.assets import REPO
from proving_ground.kubernetes.world import KubeWorld, gpu_fleet, settings_for, write_kubeconfig
from proving_ground.proc import free_port
from proving_ground.prometheus import Prometheus
from proving_ground.slurm import SlurmCluster
from tests.harness.check_config import check_live, line_of
from tests.harness.proc import require_binary
from tests.kubernetes import rbac
from tests.packaging.manifests import rendered

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def prometheus(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Prometheus]:
    binary = require_binary("prometheus", "prometheus")
    workdir = tmp_path_factory.mktemp("prometheus")
    config = {"global": {"scrape_interval": "1s"}, "scrape_configs": []}
    server = Prometheus(binary, workdir, config)
    server.start()
    try:
        yield server
    finally:
        server.stop()


def test_all_far_sides_green_with_scontrol(
    tmp_path: Path, slurm: SlurmCluster, prometheus: Prometheus
) -> None:
    before = slurm.node_states()
    result = check_live(
        tmp_path, {**slurm.pitcrew_settings("scontrol"), "resumption": {"prometheus_url": prometheus.url}}
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert line_of(result.stdout, "slurm").split()[0] == "ok"
    assert "scontrol: slurmctld answers; partitions:" in line_of(result.stdout, "slurm")
    assert line_of(result.stdout, "prometheus").split()[0] == "ok"
    assert f"{prometheus.url}: answers queries" in line_of(result.stdout, "prometheus")
    journal = line_of(result.stdout, "journal")
    assert journal.split()[0] == "-" and "(cluster)" in journal
    store = line_of(result.stdout, "sqlite")  # inspected, not opened: nothing created
    assert store.split()[0] == "ok" and "(store)" in store and "no tables yet" in store, store
    assert not (tmp_path / "pitcrew.db").exists()
    assert result.stderr == ""
    assert slurm.node_states() == before


def test_slurm_green_through_slurmrestd(tmp_path: Path, slurm: SlurmCluster) -> None:
    result = check_live(tmp_path, slurm.pitcrew_settings("rest"))
    assert result.returncode == 0, result.stdout + result.stderr
    line = line_of(result.stdout, "slurm")
    assert line.split()[0] == "ok" and f"slurmrestd {slurm.rest_url}" in line


def test_prometheus_down_is_named_and_slurm_still_reported(tmp_path: Path, slurm: SlurmCluster) -> None:
    nowhere = f"http://127.0.0.1:{free_port()}"
    result = check_live(
        tmp_path, {**slurm.pitcrew_settings("scontrol"), "resumption": {"prometheus_url": nowhere}}
    )
    assert result.returncode == 1
    assert line_of(result.stdout, "prometheus").split()[0] == "FAIL"
    assert line_of(result.stdout, "slurm").split()[0] == "ok"
    assert f"pitcrew: check-config --live: missing prometheus: Prometheus at {nowhere}" in result.stderr
    assert "slurm" not in result.stderr


def test_a_token_slurmrestd_refuses_is_named(tmp_path: Path, slurm: SlurmCluster) -> None:
    token = tmp_path / "wrong-token"
    token.write_text("SLURM_JWT=not-a-token-slurm-issued\n")
    result = check_live(tmp_path, slurm.pitcrew_settings("rest", rest_token_file=token))
    assert result.returncode == 1
    assert line_of(result.stdout, "slurm").split()[0] == "FAIL"
    assert "missing slurm:" in result.stderr and "token" in result.stderr


def kubernetes_settings(
    world: KubeWorld, slurm: SlurmCluster, prometheus: Prometheus, workdir: Path, **kubernetes: Any
) -> dict[str, Any]:
    """Slurm through scontrol, Prometheus, and the cluster port on the emulator."""
    world.call(lambda e: gpu_fleet(e, list(slurm.nodes)))
    slurm_keys, kube_keys = slurm.pitcrew_settings("scontrol"), settings_for(world, workdir, **kubernetes)
    return {
        **slurm_keys,
        **kube_keys,
        "integrations": {**slurm_keys["integrations"], **kube_keys["integrations"]},  # type: ignore[dict-item]
        "resumption": {"prometheus_url": prometheus.url},
    }


def test_kubernetes_slurm_and_prometheus_green(
    tmp_path: Path, slurm: SlurmCluster, prometheus: Prometheus, kube_world: KubeWorld
) -> None:
    settings = kubernetes_settings(
        kube_world, slurm, prometheus, tmp_path / "kube", replace={"strategy": "cluster-api"}
    )
    result = check_live(tmp_path, settings)
    assert result.returncode == 0, result.stdout + result.stderr
    for system in ("slurm", "kubernetes", "prometheus"):
        assert line_of(result.stdout, system).split()[0] == "ok", result.stdout
    kube = line_of(result.stdout, "kubernetes")
    fleet = min(len(slurm.nodes), 5)  # the probe reads at most five fleet nodes' Machines
    assert "(cluster)" in kube and "API reachable; 12 permissions allowed" in kube
    assert f"the Machines of {fleet} fleet node(s) found" in kube
    assert result.stderr == ""
    sent = [(e.verb, e.resource) for e in kube_world.log() if e.user_agent.startswith("pitcrew/")]
    # Each verb asked, then each fleet node's Machine actually read: allowed is not found.
    assert (
        sent
        == [("create", "selfsubjectaccessreviews")] * 12 + [("list", "nodes")] + [("get", "machines")] * fleet
    )


def test_exec_credentials_that_cannot_be_refreshed_are_named(
    tmp_path: Path, slurm: SlurmCluster, prometheus: Prometheus, kube_world: KubeWorld
) -> None:
    """The kubeconfig's user is an exec plugin (as on EKS or GKE) whose login expired: its tokens
    cannot be renewed, so every call after the current one expires would be refused."""
    settings = kubernetes_settings(kube_world, slurm, prometheus, tmp_path / "kube")
    broken = tmp_path / "kube" / "broken"
    broken.write_text("the SSO session has expired; run aws sso login")
    plugin = [
        sys.executable,
        str(REPO / "proving_ground/kubernetes/exec_credential.py"),
        kube_world.host,
        "900",
    ]
    write_kubeconfig(
        Path(settings["kubernetes"]["kubeconfig"]), kube_world.host, exec_plugin=[*plugin, str(broken)]
    )
    result = check_live(tmp_path, settings)
    assert result.returncode == 1
    kube = line_of(result.stdout, "kubernetes")
    assert kube.split()[0] == "FAIL" and "exec credentials cannot be refreshed" in kube, kube
    assert "SSO session has expired" in result.stderr and "exec_credential.py" in result.stderr
    assert line_of(result.stdout, "slurm").split()[0] == "ok"


def test_a_verb_the_emulator_denies_is_named(
    tmp_path: Path, slurm: SlurmCluster, prometheus: Prometheus, kube_world: KubeWorld
) -> None:
    kube_world.call(lambda e: e.denied.add(("create", "", "pods", "eviction")))
    result = check_live(tmp_path, kubernetes_settings(kube_world, slurm, prometheus, tmp_path / "kube"))
    assert result.returncode == 1
    assert line_of(result.stdout, "kubernetes").split()[0] == "FAIL"
    assert "missing: create pods/eviction" in line_of(result.stdout, "kubernetes")
    assert line_of(result.stdout, "slurm").split()[0] == "ok"
    assert line_of(result.stdout, "prometheus").split()[0] == "ok"
    assert "pitcrew: check-config --live: missing kubernetes: create pods/eviction" in result.stderr
    assert "slurm" not in result.stderr and "prometheus" not in result.stderr


def test_the_overlay_config_without_its_replace_component_names_the_machine_verbs(
    tmp_path: Path, slurm: SlurmCluster, prometheus: Prometheus, kube_world: KubeWorld
) -> None:
    """An operator who kept `strategy: cluster-api` but dropped the component: the API server
    (here the emulator, answering each review from the rendered base's RBAC) refuses exactly
    the Machine verbs, and check-config --live says so before pitcrew may act."""
    overlay = yaml.safe_load(rendered("auto").config_text())["kubernetes"]
    strategy = overlay["replace"]["strategy"]
    assert strategy == "cluster-api"
    grants = rbac.grants(rendered("base").objects)
    refused = {
        (p.verb, p.group, p.resource, p.subresource)
        for p in needed(KubernetesSettings.model_validate({"replace": {"strategy": strategy}}))
        if not any(
            g.allows(rbac.Asked(p.verb, p.group, p.resource, p.subresource or None, p.namespace or None))
            for g in grants
        )
    }
    kube_world.call(lambda e: e.denied.update(refused))
    result = check_live(
        tmp_path,
        kubernetes_settings(kube_world, slurm, prometheus, tmp_path / "kube", replace={"strategy": strategy}),
    )
    assert result.returncode == 1
    assert (
        "missing kubernetes: get machines.cluster.x-k8s.io, list machines.cluster.x-k8s.io, "
        "delete machines.cluster.x-k8s.io, get clusters.cluster.x-k8s.io" in result.stderr
    )
    assert line_of(result.stdout, "slurm").split()[0] == "ok"
