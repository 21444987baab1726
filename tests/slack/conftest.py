"""The ``slack`` fixture: a fresh stand-in per test, stopped afterwards, and a bot client bound to it."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from slack_sdk.web.async_client import AsyncWebClient

from tests.slack.server import SlackStandin
from tests.slack.world import BOT_TOKEN


@pytest.fixture
async def slack() -> AsyncIterator[SlackStandin]:
    standin = await SlackStandin().start()
    try:
        yield standin
    finally:
        await standin.stop()


@pytest.fixture
async def bot(slack: SlackStandin) -> AsyncWebClient:
    return AsyncWebClient(token=BOT_TOKEN, base_url=slack.base_url)
