"""Fixtures: one emulator per test on a free 127.0.0.1 port, and a real ``kubernetes.aio`` client for it."""

from __future__ import annotations

from collections.abc import AsyncIterator

import kmock
import pytest
from kubernetes.aio import client

from tests.kubernetes.emulator import KubeEmulator


@pytest.fixture
async def k8s() -> AsyncIterator[KubeEmulator]:
    async with KubeEmulator() as emulator, kmock.Server(emulator):
        emulator.seed_fixture_world()
        yield emulator


@pytest.fixture
async def k8s_client(k8s: KubeEmulator) -> AsyncIterator[client.ApiClient]:
    config = client.Configuration(host=k8s.host)
    config.retries = 3
    async with client.ApiClient(config) as api:
        yield api
