"""Crash recovery finds its post in a long thread: the lookup pages through ``conversations.replies``.

``conversations.replies`` answers oldest first, at most ``limit`` (200) messages a page, with
``has_more`` and a ``response_metadata.next_cursor`` (the stand-in returns real cursors). The post a
crash interrupted is the newest reply, so in a thread of more than 199 replies it is on a later
page. Cases: a thread of 250 replies whose last carries the item's metadata: a redelivery
(``attempts`` 2) finds it — two pages read with the cursor — and posts nothing. Failed before:
only the first page was read, the post was not found, and the reply was posted twice. In a short
thread nothing is found and the reply is posted once.
"""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

from slack_sdk.web.async_client import AsyncWebClient

from bot.integrations.slack import messages
from bot.integrations.slack.lookup import METADATA_TYPE
from bot.integrations.slack.outbound import SlackDestination, SlackLinks
from bot.store.base import OutboxItem
from bot.store.sqlite import SqliteStore
from proving_ground.slack.server import SlackStandin
from proving_ground.slack.world import BOT_TOKEN
from tests.slack.pitcrew_app import CHANNEL

AT = datetime(2026, 11, 29, tzinfo=UTC)


async def _thread(bot: AsyncWebClient, replies: int, last_id: int | None) -> str:
    parent = (await bot.chat_postMessage(channel=CHANNEL, text="parent"))["ts"]
    for n in range(replies):
        meta = {"outbox_id": 1000 + n, "incident_id": "pc-1"}
        if n == replies - 1 and last_id is not None:
            meta["outbox_id"] = last_id
        await bot.chat_postMessage(
            channel=CHANNEL,
            thread_ts=parent,
            text=f"reply {n}",
            metadata={"event_type": METADATA_TYPE, "event_payload": meta},
        )
    return str(parent)


async def test_a_redelivery_finds_its_post_on_a_later_page(
    slack: SlackStandin, bot: AsyncWebClient, tmp_path: Path
) -> None:
    parent = await _thread(bot, 250, last_id=7)
    client = AsyncWebClient(token=BOT_TOKEN, base_url=slack.base_url)
    destination = SlackDestination(client, SqliteStore(tmp_path / "p.db"), SlackLinks(CHANNEL), lambda: AT)
    item = OutboxItem(7, "slack", "pc-1", "step_finished", {"event": True}, AT, attempts=2)
    posted = len(slack.api.messages)
    ts = await destination._post(item, messages.reply("step", [], "pc-1"), thread_ts=parent)
    assert len(slack.api.messages) == posted, "posted twice"
    assert ts == slack.api.messages[-1].ts
    pages = slack.api.calls_to("conversations.replies")
    assert len(pages) == 2 and pages[1].args.get("cursor")


async def test_a_short_thread_without_the_post_gets_it_once(
    slack: SlackStandin, bot: AsyncWebClient, tmp_path: Path
) -> None:
    parent = await _thread(bot, 3, last_id=None)
    client = AsyncWebClient(token=BOT_TOKEN, base_url=slack.base_url)
    destination = SlackDestination(client, SqliteStore(tmp_path / "p.db"), SlackLinks(CHANNEL), lambda: AT)
    item = OutboxItem(7, "slack", "pc-1", "step_finished", {"event": True}, AT, attempts=2)
    posted = len(slack.api.messages)
    await destination._post(item, messages.reply("step", [], "pc-1"), thread_ts=parent)
    assert len(slack.api.messages) == posted + 1
    assert len(slack.api.calls_to("conversations.replies")) == 1
