"""``check-config --live`` for Kubernetes: every verb pitcrew needs asked with SelfSubjectAccessReview.

Cases: all allowed is ok and names how many; a denied eviction (and, with the cluster-api strategy,
a denied Machine delete) is not ok and ``missing`` names exactly those verbs; an unreachable API
server is not ok; the probe writes nothing. The kubeconfig context named in the settings is the
one used, not the file's current context. With Job templates, a Jobs' namespace whose Pod Security
level would refuse their privileged pods is named (a dry-run create of the pod, nothing stored), and
so is a reset template whose pod asks the device plugin for GPUs (whole, time-sliced or MIG slices,
in a container or an init container), while the same pod given the device files passes and a
validation template may ask for GPUs (a diagnostic runs on them). A template the client cannot
send (an env value not a string) is named too.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from bot.config import KubernetesSettings
from bot.integrations.kubernetes import KubernetesCluster
from bot.integrations.kubernetes.probe import gpu_requests
from proving_ground.kubernetes.emulator import EMULATED_TOKEN, KubeEmulator
from proving_ground.kubernetes.world import write_kubeconfig
from proving_ground.proc import free_port


async def test_all_allowed(cluster: KubernetesCluster, k8s: KubeEmulator) -> None:
    probe = await cluster.probe()
    assert probe.ok and probe.system == "kubernetes" and probe.missing == ()
    assert "8 permissions allowed" in probe.detail
    assert {e.verb for e in k8s.log} == {"create"} and {e.resource for e in k8s.log} == {
        "selfsubjectaccessreviews"
    }


async def test_denied_verbs_are_named(
    make_cluster: Callable[..., KubernetesCluster], k8s: KubeEmulator
) -> None:
    k8s.denied |= {("create", "", "pods", "eviction"), ("delete", "cluster.x-k8s.io", "machines", "")}
    probe = await make_cluster(replace={"strategy": "cluster-api"}).probe()
    assert not probe.ok
    assert probe.missing == ("create pods/eviction", "delete machines.cluster.x-k8s.io")


async def test_an_unreachable_api_server(tmp_path: Path) -> None:
    kubeconfig = write_kubeconfig(tmp_path / "kubeconfig", f"http://127.0.0.1:{free_port()}")
    cluster = KubernetesCluster(KubernetesSettings(kubeconfig=kubeconfig, request_timeout=1, retries=0))
    try:
        probe = await cluster.probe()
    finally:
        await cluster.aclose()
    assert not probe.ok and "API server not usable" in probe.detail


async def test_the_configured_kubeconfig_context_is_the_one_used(k8s: KubeEmulator, tmp_path: Path) -> None:
    path = tmp_path / "kubeconfig"
    path.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [
                    {"name": "elsewhere", "cluster": {"server": f"http://127.0.0.1:{free_port()}"}},
                    {"name": "emulated", "cluster": {"server": k8s.host}},
                ],
                "users": [{"name": "pitcrew", "user": {"token": EMULATED_TOKEN}}],
                "contexts": [
                    {"name": "prod", "context": {"cluster": "elsewhere", "user": "pitcrew"}},
                    {"name": "gpu-east", "context": {"cluster": "emulated", "user": "pitcrew"}},
                ],
                "current-context": "prod",
            }
        )
    )
    cluster = KubernetesCluster(KubernetesSettings(kubeconfig=path, context="gpu-east", retries=0))
    try:
        assert (await cluster.probe()).ok
    finally:
        await cluster.aclose()
    assert k8s.log and all(e.user_agent.startswith("pitcrew/") for e in k8s.log)


async def test_a_job_namespace_that_would_refuse_privileged_pods_is_named(
    make_cluster: Callable[..., KubernetesCluster], k8s: KubeEmulator, tmp_path: Path
) -> None:
    template = tmp_path / "reset.yaml"
    pod = {
        "hostPID": True,
        "containers": [{"name": "reset", "image": "x", "securityContext": {"privileged": True}}],
    }
    template.write_text(yaml.safe_dump({"spec": {"template": {"spec": pod}}}))
    cluster = make_cluster(jobs={"reset_gpu_template": template})
    assert (await cluster.probe()).ok  # pitcrew-jobs is "privileged" (deploy/kubernetes/namespace.yaml)
    k8s.set_pod_security("pitcrew-jobs", "baseline")
    probe = await cluster.probe()
    assert not probe.ok and "namespace pitcrew-jobs would refuse" in probe.detail
    [refusal] = probe.missing
    assert refusal.startswith("reset_gpu: ") and 'violates PodSecurity "baseline:latest"' in refusal
    assert not [k for k in k8s.objects if k[0] in ("pods", "jobs") and k[1] == "pitcrew-jobs"]  # a dry run


def _template(path: Path, container: dict[str, Any], *, init: dict[str, Any] | None = None) -> Path:
    pod: dict[str, Any] = {"hostPID": True, "containers": [container]}
    if init is not None:
        pod["initContainers"] = [init]
    path.write_text(yaml.safe_dump({"spec": {"template": {"spec": pod}}}))
    return path


_RESET = {"name": "reset", "image": "x", "securityContext": {"privileged": True}}
_DEVICES = {**_RESET, "volumeMounts": [{"name": "dev", "mountPath": "/dev"}]}


@pytest.mark.parametrize(
    ("container", "init", "named"),
    [
        (
            {**_RESET, "resources": {"limits": {"nvidia.com/gpu": 1}}},
            None,
            ["container reset requests nvidia.com/gpu"],
        ),
        (
            {**_RESET, "resources": {"requests": {"nvidia.com/gpu.shared": 1, "cpu": "1"}}},
            None,
            ["container reset requests nvidia.com/gpu.shared"],
        ),
        (
            _DEVICES,
            {"name": "stop", "image": "x", "resources": {"limits": {"nvidia.com/mig-1g.10gb": 1}}},
            ["container stop requests nvidia.com/mig-1g.10gb"],
        ),
        ({**_DEVICES, "resources": {"limits": {"cpu": "1", "memory": "64Mi"}}}, None, []),
        (  # kubernetes.gpu_resource: the site's name for its GPUs
            {**_RESET, "resources": {"limits": {"example.com/accelerator": 1}}},
            None,
            ["container reset requests example.com/accelerator"],
        ),
        (_DEVICES, None, []),
    ],
)
def test_the_gpus_a_template_asks_the_device_plugin_for(
    tmp_path: Path, container: dict[str, Any], init: dict[str, Any] | None, named: list[str]
) -> None:
    path = _template(tmp_path / "reset.yaml", container, init=init)
    assert gpu_requests(yaml.safe_load(path.read_text()), "example.com/accelerator") == named


async def test_a_reset_template_asking_the_device_plugin_for_gpus_is_named(
    make_cluster: Callable[..., KubernetesCluster], k8s: KubeEmulator, tmp_path: Path
) -> None:
    asking = _template(tmp_path / "asking.yaml", {**_RESET, "resources": {"limits": {"nvidia.com/gpu": 8}}})
    probe = await make_cluster(jobs={"reset_gpu_template": asking}).probe()
    assert not probe.ok and probe.detail == "the reset_gpu Job template asks the device plugin for GPUs"
    [named] = probe.missing
    assert named.startswith("reset_gpu: container reset requests nvidia.com/gpu: ") and "hostPath" in named
    devices = _template(tmp_path / "devices.yaml", _DEVICES)
    assert (await make_cluster(jobs={"reset_gpu_template": devices}).probe()).ok
    # A validation Job (a DCGM diagnostic, say) runs on the GPUs once they are back: it may ask for them.
    validation = make_cluster(jobs={"reset_gpu_template": devices, "validation_template": asking})
    assert (await validation.probe()).ok


async def test_a_template_the_client_cannot_send_is_named(
    make_cluster: Callable[..., KubernetesCluster], tmp_path: Path
) -> None:
    path = _template(tmp_path / "reset.yaml", {**_DEVICES, "env": [{"name": "X", "value": 1}]})
    probe = await make_cluster(jobs={"reset_gpu_template": path}).probe()
    assert not probe.ok and "would refuse the Jobs' pods" in probe.detail
    [refusal] = probe.missing
    assert refusal.startswith("reset_gpu: not a pod the client can send: ")
