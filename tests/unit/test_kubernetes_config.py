"""``integrations.cluster: kubernetes``: the settings section, the port it builds, and its acceptance.

Cases: a real Slurm with a Kubernetes cluster in auto mode passes ``pitcrew check-config`` (no
journalled port acts) and ``build_ports`` gives the Kubernetes adapter with the ``kubernetes:``
settings as written; the refusal of a journalled cluster names ``integrations.cluster: kubernetes``
as a way out; the ``command`` strategy without a command, an unknown strategy and a non-positive
rate are refused at load with the key named. A Job template the API server would refuse, or that is
no Job at all, is refused at load (``check-config`` and ``serve`` exit 1), naming its key and file
and what is wrong: unreadable, not YAML, empty, a list, another kind or API version, no container,
a ``restartPolicy`` a Job never takes (``Always``), ``OnFailure`` beside a ``podFailurePolicy``,
a ``ttlSecondsAfterFinished`` of its own (pitcrew's: ``kubernetes.jobs.keep_finished``, at least
1h, so a Job is never deleted before its verdict is read);
``OnFailure`` alone, and an unset or null ``restartPolicy`` (pitcrew's ``Never``) are taken. With
no Kubernetes cluster (``integrations.cluster: none``) the templates are never used, nor read.
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

KUBE: dict[str, Any] = {
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
        ({"jobs": {"keep_finished": "59m"}}, "kubernetes.jobs.keep_finished must be at least 1h"),
    ],
)
def test_bad_kubernetes_settings_are_refused_at_load(
    tmp_path: Path, kubernetes: dict[str, Any], named: str
) -> None:
    with pytest.raises(ConfigError, match=named.replace(".", r"\.")):
        load_config(_write(tmp_path, {**KUBE, "kubernetes": kubernetes}))


_POD = {"containers": [{"name": "reset", "image": "nvcr.io/nvidia/cuda:12.4.1-base-ubuntu22.04"}]}


def _job(pod: dict[str, Any] | None = None, **job: Any) -> str:
    return yaml.safe_dump(
        {"apiVersion": "batch/v1", "kind": "Job", "spec": {"template": {"spec": pod or _POD}}, **job}
    )


@pytest.mark.parametrize(
    ("text", "says"),
    [
        (None, "cannot read"),
        ("spec: {template: [unclosed\n", "not valid YAML"),
        ("", "is empty"),
        ("# only a comment\n", "is empty"),
        ("- a\n- b\n", "not a mapping"),
        (_job(kind="Pod"), "kind Pod, not Job"),
        (_job(apiVersion="batch/v1beta1"), "apiVersion batch/v1beta1, not batch/v1"),
        (yaml.safe_dump({"kind": "Job", "spec": {"template": {}}}), "spec.template.spec.containers"),
        (_job({"containers": []}), "spec.template.spec.containers"),
        (_job({**_POD, "restartPolicy": "Always"}), "restartPolicy Always"),
        (
            _job({**_POD, "restartPolicy": "OnFailure"}) + "  podFailurePolicy: {rules: []}\n",
            "podFailurePolicy",
        ),
        (_job() + "  ttlSecondsAfterFinished: 0\n", "ttlSecondsAfterFinished, which is pitcrew's"),
    ],
)
def test_a_job_template_that_cannot_work_is_refused_at_load(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str | None, says: str
) -> None:
    template = tmp_path / "reset.yaml"
    if text is not None:
        template.write_text(text)
    path = _write(
        tmp_path,
        {**KUBE, "kubernetes": {**KUBE["kubernetes"], "jobs": {"reset_gpu_template": str(template)}}},
    )
    with pytest.raises(ConfigError) as refused:
        load_config(path)
    [line] = [line for line in str(refused.value).splitlines() if "kubernetes.jobs" in line]
    assert line.startswith(f"kubernetes.jobs.reset_gpu_template: {template}") and says in line, line
    assert main(["check-config", "--config", str(path)]) == 1
    assert "kubernetes.jobs.reset_gpu_template" in capsys.readouterr().err


@pytest.mark.parametrize("policy", ["OnFailure", "Never", None])
def test_a_job_template_a_job_takes_is_accepted(tmp_path: Path, policy: str | None) -> None:
    template = tmp_path / "reboot.yaml"
    template.write_text(_job({**_POD, "restartPolicy": policy}))
    jobs = {"reboot_template": str(template), "validation_template": str(template)}
    path = _write(tmp_path, {**KUBE, "kubernetes": {**KUBE["kubernetes"], "jobs": jobs}})
    assert main(["check-config", "--config", str(path)]) == 0


def test_job_templates_are_not_read_without_a_kubernetes_cluster(tmp_path: Path) -> None:
    jobs = {"reset_gpu_template": str(tmp_path / "absent.yaml")}
    settings = {"integrations": {"cluster": "none"}, "kubernetes": {"jobs": jobs}}
    assert main(["check-config", "--config", str(_write(tmp_path, settings))]) == 0
