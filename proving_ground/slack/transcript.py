"""The stand-in's channel as a person reads it: plain text from the stored messages and their blocks.

Each top-level message with its thread indented under it, in its current version (``edited`` says
how often chat.update replaced it), buttons as ``[Label]``, links as ``label <url>``, mentions as
``@name``, the emoji codes as Slack draws them, and the ephemeral answers only their user saw. Pure:
reads a ``WebApi`` record, writes nothing.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from datetime import UTC, datetime
from typing import Any

from proving_ground.slack.mrkdwn import unescape
from proving_ground.slack.webapi import Message, WebApi

_LINK = re.compile(r"<([^|<>@]+)\|([^<>]+)>")
_MENTION = re.compile(r"<@(U[A-Z0-9]+)>")
EMOJI = {
    ":white_check_mark:": "✅",
    ":ballot_box_with_check:": "☑️",
    ":x:": "❌",
    ":warning:": "⚠️",
    ":rotating_light:": "🚨",
    ":no_entry:": "⛔",
    ":lock:": "🔒",
    ":fast_forward:": "⏩",
    ":leftwards_arrow_with_hook:": "↩️",
}


class Reader:
    """Reads messages of one workspace (``users``: who a mention names)."""

    def __init__(self, users: Mapping[str, str]) -> None:
        self.users = users

    def mrkdwn(self, text: str) -> str:
        text = _LINK.sub(lambda m: f"{m.group(2)} <{m.group(1)}>", text)
        text = _MENTION.sub(lambda m: f"@{self.users.get(m.group(1), m.group(1))}", text)
        for code, glyph in EMOJI.items():
            text = text.replace(code, glyph)
        return unescape(text)  # the entities last: escaped text reads as the text it is

    def text(self, obj: Any) -> str:
        return self.mrkdwn(str(obj.get("text", ""))) if isinstance(obj, dict) else ""

    def field(self, obj: Any) -> str:
        """``*Node*\\ngpu-001`` reads as ``Node: gpu-001``."""
        title, _, value = self.text(obj).partition("\n")
        return f"{title.strip('*')}: {value}" if value else title

    def block(self, block: dict[str, Any]) -> list[str]:
        """One block as the lines a person sees."""
        kind = block.get("type")
        if kind == "header":
            return [self.text(block.get("text"))]
        if kind == "section":
            lines = self.text(block.get("text")).splitlines() if "text" in block else []
            if block.get("fields"):
                lines.append(" | ".join(self.field(f) for f in block["fields"]))
            return lines
        if kind == "context":
            return [" · ".join(self.text(e) for e in block.get("elements", []))]
        if kind == "actions":
            return [" ".join(f"[{self.text(e.get('text'))}]" for e in block.get("elements", []))]
        if kind == "divider":
            return ["—"]
        return [f"({kind} block)"]

    def message(self, message: Message) -> list[str]:
        """A first line with the message's time, then its body (its blocks, else its text)."""
        at = datetime.fromtimestamp(message.posted_at, UTC).strftime("%H:%M:%S")
        body = [line for b in message.blocks for line in self.block(b)] or message.text.splitlines()
        edited = f" (edited {len(message.updates)}x)" if message.updates else ""
        also = " (also sent to the channel)" if message.reply_broadcast else ""
        first = body[0] if body else ""
        return [f"[{at}] pitcrew{edited}{also}: {first}", *(f"    {line}" for line in body[1:])]


def thread_lines(api: WebApi, parent: Message) -> Iterator[str]:
    """A parent message, then each reply of its thread indented under it."""
    reader = Reader(api.world.users)
    yield from reader.message(parent)
    for reply in api.thread(parent.channel, parent.ts)[1:]:
        for line in reader.message(reply):
            yield f"    ↳ {line}" if line.startswith("[") else f"      {line}"


def channel_lines(api: WebApi, channel: str) -> Iterator[str]:
    """The whole channel, oldest first: each thread under its parent, then the ephemeral answers."""
    name = api.world.channels[channel].name if channel in api.world.channels else channel
    yield f"#{name} ({channel})"
    for message in api.channel_view(channel):
        if message.thread_ts is not None:
            continue  # a broadcast reply is shown in its thread
        yield ""
        yield from thread_lines(api, message)
    for answer in api.ephemeral:
        if answer["channel"] == channel:
            user = api.world.users.get(answer["user"], answer["user"])
            yield ""
            yield f"(only {user} sees this) {Reader(api.world.users).mrkdwn(str(answer['text']))}"
