"""The ``grafana`` fixture: a fresh Grafana HTTP API stand-in per test, stopped afterwards."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from tests.grafana.server import GrafanaStandin
from tests.slack.server import SlackStandin


@pytest.fixture
async def grafana() -> AsyncIterator[GrafanaStandin]:
    standin = await GrafanaStandin().start()
    try:
        yield standin
    finally:
        await standin.stop()


@pytest.fixture
async def slack() -> AsyncIterator[SlackStandin]:
    """The Slack stand-in too: the in-process service (``tests.slack.pitcrew_app``) notifies it."""
    standin = await SlackStandin().start()
    try:
        yield standin
    finally:
        await standin.stop()
