"""``check-config --live`` for Slack: the adapter's ``probe()`` against the stand-in.

Cases: a good token in the channel is ok; the bot not in the channel names the channel; a token
without ``channels:read`` names that scope (Slack's ``missing_scope`` with ``needed``); a revoked
token is not ok; Slack unreachable is not ok and does not raise.
"""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

from slack_sdk.web.async_client import AsyncWebClient

from bot.integrations.slack.outbound import SlackDestination, SlackLinks
from bot.store.sqlite import SqliteStore
from tests.harness.proc import free_port
from tests.slack.server import SlackStandin
from tests.slack.world import BOT_TOKEN


def _destination(client: AsyncWebClient, store: SqliteStore, channel: str = "C0GPUOPS") -> SlackDestination:
    return SlackDestination(client, store, SlackLinks(channel), lambda: datetime.now(UTC))


async def test_probe_says_what_is_missing(slack: SlackStandin, bot: AsyncWebClient, tmp_path: Path) -> None:
    store = SqliteStore(tmp_path / "p.db")
    ok = await _destination(bot, store).probe()
    assert (ok.system, ok.ok, ok.missing) == ("slack", True, ())

    outside = await _destination(bot, store, "C0ELSEWHERE").probe()
    assert not outside.ok and outside.missing == ("channel C0ELSEWHERE",)

    slack.world.scopes.discard("channels:read")
    scope = await _destination(bot, store).probe()
    assert not scope.ok and scope.missing == ("channels:read",)
    assert "channels:read" in scope.detail

    revoked = await _destination(AsyncWebClient(token="xoxb-revoked", base_url=slack.base_url), store).probe()
    assert not revoked.ok and "invalid_auth" in revoked.detail

    down = AsyncWebClient(token=BOT_TOKEN, base_url=f"http://127.0.0.1:{free_port()}/api/")
    unreachable = await _destination(down, store).probe()
    assert not unreachable.ok and "unreachable" in unreachable.detail
