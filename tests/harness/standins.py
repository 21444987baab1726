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
    """Strict: a test fails if anything pitcrew posted holds markup Slack would act on that pitcrew did
    not mean (a channel-wide mention, a link or mention from outside text); ``api.allow`` relaxes it.
    It also fails if pitcrew called a method the stand-in does not serve (``api.unserved``)."""
    standin = await SlackStandin().start()
    try:
        yield standin
    finally:
        await standin.stop()
    standin.api.check_served()
    if "unescaped_markup" not in standin.api.lenient:
        assert not standin.api.flags, "\n".join(str(f) for f in standin.api.flags)


@pytest.fixture
async def grafana() -> AsyncIterator[GrafanaStandin]:
    standin = await GrafanaStandin().start()
    try:
        yield standin
    finally:
        await standin.stop()
        standin.release()
