"""The ``slack`` fixture: a fresh stand-in per test, stopped afterwards, and a bot client bound to it."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from slack_sdk.web.async_client import AsyncWebClient

from tests.slack.server import SlackStandin
from tests.slack.world import TESTER_TOKEN


@pytest.fixture
async def slack() -> AsyncIterator[SlackStandin]:
    standin = await SlackStandin().start()
    try:
        yield standin
    finally:
        await standin.stop()


@pytest.fixture
async def bot(slack: SlackStandin) -> AsyncWebClient:
    return AsyncWebClient(token=TESTER_TOKEN, base_url=slack.base_url)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The manifest check runs last: it compares against every Slack call recorded before it."""
    last = [i for i in items if i.nodeid.startswith("tests/slack/test_manifest.py")]
    items[:] = [i for i in items if i not in last] + last
