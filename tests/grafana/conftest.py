"""The ``grafana`` fixture: a fresh Grafana HTTP API stand-in per test, stopped afterwards."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from tests.grafana.server import GrafanaStandin


@pytest.fixture
async def grafana() -> AsyncIterator[GrafanaStandin]:
    standin = await GrafanaStandin().start()
    try:
        yield standin
    finally:
        await standin.stop()
