"""Fixtures: one emulator per test on a free 127.0.0.1 port, a real ``kubernetes.aio`` client for it,
pitcrew's adapter reaching it through a kubeconfig, and the session's request log for the RBAC check."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import kmock
import pytest
from kubernetes.aio import client

from bot.config import KubernetesSettings
from bot.integrations.kubernetes import KubernetesCluster
from proving_ground.kubernetes.emulator import EMULATED_TOKEN, KubeEmulator
from proving_ground.kubernetes.faults import LoggedRequest
from proving_ground.kubernetes.world import write_kubeconfig


@pytest.fixture(scope="session")
def k8s_requests() -> list[LoggedRequest]:
    """Every request any emulator of this session answered (read by ``test_rbac``)."""
    return []


@pytest.fixture
async def k8s(k8s_requests: list[LoggedRequest]) -> AsyncIterator[KubeEmulator]:
    async with KubeEmulator() as emulator, kmock.Server(emulator):
        emulator.seed_fixture_world()
        yield emulator
        k8s_requests.extend(emulator.log)


@pytest.fixture
async def k8s_client(k8s: KubeEmulator) -> AsyncIterator[client.ApiClient]:
    config = client.Configuration(host=k8s.host, api_key={"BearerToken": f"Bearer {EMULATED_TOKEN}"})
    config.retries = 3
    async with client.ApiClient(config) as api:
        yield api


@pytest.fixture
async def make_cluster(k8s: KubeEmulator, tmp_path: Path) -> AsyncIterator[Callable[..., KubernetesCluster]]:
    """pitcrew's adapter on the emulator, built from settings (``make_cluster(qps=5, replace={...})``)."""
    made: list[KubernetesCluster] = []
    kubeconfig = write_kubeconfig(tmp_path / "kubeconfig", k8s.host)

    def make(**settings: Any) -> KubernetesCluster:
        base: dict[str, Any] = {"kubeconfig": kubeconfig, "request_timeout": 2.0, "qps": 1000, "burst": 1000}
        cluster = KubernetesCluster(KubernetesSettings.model_validate({**base, **settings}))
        made.append(cluster)
        return cluster

    yield make
    for cluster in made:
        await cluster.aclose()


@pytest.fixture
def cluster(make_cluster: Callable[..., KubernetesCluster]) -> KubernetesCluster:
    return make_cluster()
