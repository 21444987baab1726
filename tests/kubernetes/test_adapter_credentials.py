"""Exec-plugin credentials that expire (EKS, GKE), through the real client against the emulator.

The kubeconfig's user is an exec plugin (``proving_ground/kubernetes/exec_credential.py``) whose
tokens the emulator accepts for a short time, then answers 401 as the API server does. Cases: a call
after the token expired reloads the kubeconfig once, runs the plugin again and succeeds (one 401 in
the log, then the same request accepted); concurrent calls refused together run the plugin once; a
plugin that cannot give a new token leaves the 401 to stand as ``unauthorized`` after one reload,
and ``check-config --live`` names the plugin and its error; a static token refused is not retried.
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path
from typing import cast

import pytest

from bot.config import KubernetesSettings
from bot.engine.errors import PermanentError, Reason
from bot.integrations.kubernetes import KubernetesCluster
from proving_ground.kubernetes.emulator import KubeEmulator
from proving_ground.kubernetes.world import write_kubeconfig

NODE = "gpu-node-02"
#: The plugin's tokens live 15 minutes, as EKS's do; a test ends them with ``expire_tokens``.
TTL = 900


def _cluster(k8s: KubeEmulator, tmp_path: Path, *, exec_plugin: bool = True) -> KubernetesCluster:
    plugin = [sys.executable, "-m", "proving_ground.kubernetes.exec_credential", k8s.host, str(TTL)]
    plugin.append(str(tmp_path / "broken"))
    kubeconfig = write_kubeconfig(
        tmp_path / "kubeconfig", k8s.host, exec_plugin=plugin if exec_plugin else None
    )
    settings = {"kubeconfig": kubeconfig, "request_timeout": 5.0, "qps": 1000, "burst": 1000}
    return KubernetesCluster(KubernetesSettings.model_validate(settings))


def _runs(tmp_path: Path) -> int:
    return int((tmp_path / "exec-runs").read_text())


async def test_an_expired_exec_token_is_refreshed_once_and_the_call_succeeds(
    k8s: KubeEmulator, tmp_path: Path
) -> None:
    cluster = _cluster(k8s, tmp_path)
    try:
        assert (await cluster.node(NODE)) is not None
        assert _runs(tmp_path) == 1
        k8s.expire_tokens()
        await asyncio.gather(*(cluster.node(NODE) for _ in range(5)))  # all refused, one reload
        assert _runs(tmp_path) == 2
        gets = [e.status for e in k8s.log if e.verb == "get" and e.resource == "nodes"]
        assert gets[0] == 200 and sorted(cast(list[int], gets[1:])) == [200] * 5 + [401] * 5
        k8s.expire_tokens()
        await cluster.set_annotations(NODE, {"example.com/a": "b"})  # a write, refused then sent again
        patches = [e.status for e in k8s.log if e.verb == "patch" and e.resource == "nodes"]
        assert patches == [401, 200] and _runs(tmp_path) == 3
        assert k8s.get("nodes", NODE)["metadata"]["annotations"]["example.com/a"] == "b"  # type: ignore[index]
    finally:
        await cluster.aclose()


async def test_a_plugin_that_cannot_refresh_leaves_the_401_and_check_config_names_it(
    k8s: KubeEmulator, tmp_path: Path
) -> None:
    cluster = _cluster(k8s, tmp_path)
    try:
        assert (await cluster.node(NODE)) is not None
        (tmp_path / "broken").write_text("the SSO session has expired; run aws sso login")
        k8s.expire_tokens()
        with pytest.raises(PermanentError, match="401") as err:
            await cluster.node(NODE)
        assert err.value.reason == Reason.UNAUTHORIZED
        assert _runs(tmp_path) == 2  # one reload, not a loop
        assert [e.status for e in k8s.log if e.verb == "get"] == [200, 401]
        probe = await cluster.probe()
        assert not probe.ok
        assert "exec credentials cannot be refreshed" in probe.detail
        assert "exec_credential" in probe.detail and "SSO session has expired" in probe.detail
    finally:
        await cluster.aclose()


async def test_a_refused_static_token_is_not_sent_again(k8s: KubeEmulator, tmp_path: Path) -> None:
    cluster = _cluster(k8s, tmp_path, exec_plugin=False)
    try:
        k8s.tokens.clear()  # the kubeconfig's token is revoked
        with pytest.raises(PermanentError) as err:
            await cluster.node(NODE)
        assert err.value.reason == Reason.UNAUTHORIZED
        assert [e.status for e in k8s.log] == [401]
    finally:
        await cluster.aclose()
