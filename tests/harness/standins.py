"""The ``slack`` and ``grafana`` fixtures: a fresh stand-in per test on the test's loop, stopped after.

Tests in another thread's loop (a pitcrew subprocess talking to them) use the threaded forms,
``proving_ground.slack.threaded.threaded_standin`` and ``tests.grafana.threaded.threaded_grafana``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from proving_ground.slack.server import SlackStandin
from tests.grafana.server import GrafanaStandin


@pytest.fixture
async def slack() -> AsyncIterator[SlackStandin]:
    standin = await SlackStandin().start()
    try:
        yield standin
    finally:
        await standin.stop()


@pytest.fixture
async def grafana() -> AsyncIterator[GrafanaStandin]:
    standin = await GrafanaStandin().start()
    try:
        yield standin
    finally:
        await standin.stop()
