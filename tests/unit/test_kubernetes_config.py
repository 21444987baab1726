"""``integrations.cluster: kubernetes``: the settings section, the port it builds, and its acceptance.

Cases: a real Slurm with a Kubernetes cluster in auto mode passes ``pitcrew check-config`` (no
journalled port acts) and ``build_ports`` gives the Kubernetes adapter with the ``kubernetes:``
settings as written; the refusal of a journalled cluster names ``integrations.cluster: kubernetes``
as a way out; the ``command`` strategy without a command, an unknown strategy and a non-positive
rate are refused at load with the key named.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from bot.cli import main
from bot.config import ConfigError, load_config
from bot.integrations.kubernetes import KubernetesCluster
from bot.runtime import build_ports
from bot.safety import port_problems

KUBE = {
    "mode": "auto",
    "integrations": {"scheduler": "slurm", "cluster": "kubernetes"},
    "kubernetes": {
        "kubeconfig": "/etc/pitcrew/kubeconfig",
        "context": "gpu-east",
        "qps": 5,
        "burst": 10,
        "replace": {"strategy": "cluster-api"},
        "jobs": {"namespace": "ops"},
    },
}


@pytest.fixture(autouse=True)
def isolated(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PITCREW_STORE__PATH", str(tmp_path / "state" / "pitcrew.db"))
    monkeypatch.delenv("PITCREW_MODE", raising=False)


def _write(tmp_path: Path, settings: dict[str, Any]) -> Path:
    path = tmp_path / "pitcrew.yaml"
    path.write_text(yaml.safe_dump(settings))
    return path


def test_kubernetes_cluster_is_accepted_and_built(tmp_path: Path) -> None:
    path = _write(tmp_path, KUBE)
    assert main(["check-config", "--config", str(path)]) == 0
    config = load_config(path)
    assert port_problems(config) == []
    cluster = build_ports(config).cluster
    assert isinstance(cluster, KubernetesCluster)
    settings = cluster.settings
    assert (settings.kubeconfig, settings.context, settings.qps, settings.burst) == (
        Path("/etc/pitcrew/kubeconfig"),
        "gpu-east",
        5,
        10,
    )
    assert settings.replace.strategy == "cluster-api" and settings.jobs.namespace == "ops"
    assert (cluster.bucket.rate, cluster.bucket.burst) == (5, 10)


def test_the_refusal_of_a_journalled_cluster_offers_kubernetes(tmp_path: Path) -> None:
    config = load_config(_write(tmp_path, {"mode": "auto", "integrations": {"scheduler": "slurm"}}))
    [line] = port_problems(config)
    assert "integrations.cluster: kubernetes" in line


@pytest.mark.parametrize(
    ("kubernetes", "named"),
    [
        ({"replace": {"strategy": "command"}}, "strategy command needs command"),
        ({"replace": {"strategy": "terraform"}}, "kubernetes.replace.strategy"),
        ({"qps": 0}, "kubernetes.qps"),
    ],
)
def test_bad_kubernetes_settings_are_refused_at_load(
    tmp_path: Path, kubernetes: dict[str, Any], named: str
) -> None:
    with pytest.raises(ConfigError, match=named.replace(".", r"\.")):
        load_config(_write(tmp_path, {**KUBE, "kubernetes": kubernetes}))
