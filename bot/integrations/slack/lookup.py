"""Finding what pitcrew already posted: a message whose metadata names its outbox item.

A delivery begun before a crash may have reached Slack; before posting again the destination looks
for the message by the metadata every post carries (``event_type`` ``pitcrew_notice``). In a thread,
``conversations.replies`` answers oldest first, a page at a time (``limit`` 200, ``has_more``,
``response_metadata.next_cursor``; docs.slack.dev/apis/web-api/pagination): the post a crash
interrupted is the newest reply, so every page is read. In the channel, ``conversations.history``
answers newest first: the first 200 hold a post seconds old (Slack's clock is not ours). A thread
whose parent was deleted (``thread_not_found``) holds nothing.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from slack_sdk.web.async_client import AsyncWebClient

from bot.engine.errors import PermanentError
from bot.integrations.slack.errors import MessageGone, call

METADATA_TYPE = "pitcrew_notice"


async def find_posted(
    client: AsyncWebClient, channel: str, thread_ts: str | None, match: Callable[[Mapping[str, Any]], bool]
) -> str | None:
    """The ts of the message pitcrew posted whose metadata payload ``match``es, in the thread
    ``thread_ts`` (or the channel), or ``None``."""
    cursor: str | None = None
    while True:
        try:
            if thread_ts is not None:
                answer = await call(
                    client.conversations_replies(
                        channel=channel,
                        ts=thread_ts,
                        include_all_metadata=True,
                        limit=200,
                        cursor=cursor,
                    )
                )
            else:
                answer = await call(
                    client.conversations_history(channel=channel, include_all_metadata=True, limit=200)
                )
        except PermanentError as exc:
            if isinstance(exc, MessageGone):
                return None
            raise
        for message in answer.get("messages") or []:
            if _ours(message, match):
                return str(message["ts"])
        cursor = str((answer.get("response_metadata") or {}).get("next_cursor") or "") or None
        if thread_ts is None or not answer.get("has_more") or cursor is None:
            return None


async def posted_since(
    client: AsyncWebClient, channel: str, oldest: str, match: Callable[[Mapping[str, Any]], bool]
) -> list[str]:
    """The ts of every top-level message pitcrew posted in the channel after ``oldest`` whose
    metadata payload ``match``es (``conversations.history``, newest first, its first 200)."""
    answer = await call(
        client.conversations_history(channel=channel, oldest=oldest, include_all_metadata=True, limit=200)
    )
    return [
        str(message["ts"])
        for message in answer.get("messages") or []
        if message.get("thread_ts") in (None, message.get("ts")) and _ours(message, match)
    ]


def _ours(message: Mapping[str, Any], match: Callable[[Mapping[str, Any]], bool]) -> bool:
    """A message pitcrew posted (its metadata's ``event_type``) whose payload ``match``es."""
    metadata = message.get("metadata") or {}
    return bool(metadata.get("event_type") == METADATA_TYPE and match(metadata.get("event_payload") or {}))
