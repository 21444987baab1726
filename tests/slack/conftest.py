"""A bot client bound to the ``slack`` stand-in (``tests.harness.standins``), and test order."""

from __future__ import annotations

import pytest
from slack_sdk.web.async_client import AsyncWebClient

from proving_ground.slack.server import SlackStandin
from proving_ground.slack.world import TESTER_TOKEN


@pytest.fixture
async def bot(slack: SlackStandin) -> AsyncWebClient:
    return AsyncWebClient(token=TESTER_TOKEN, base_url=slack.base_url)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The manifest check runs last: it compares against every Slack call recorded before it."""
    last = [i for i in items if i.nodeid.startswith("tests/slack/test_manifest.py")]
    items[:] = [i for i in items if i not in last] + last
