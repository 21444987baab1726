"""The stand-in's channel as a person reads it: plain text from the stored messages and their blocks.

Each top-level message (and each reply broadcast to the channel) with its thread indented under it,
its current version (``edited`` says how often chat.update replaced it), buttons as ``[Label]``,
links as ``label <url>``, and the ephemeral answers only their user saw. Pure: reads a ``WebApi``
record, writes nothing.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

from bot.demo.slack.webapi import Message, WebApi

_LINK = re.compile(r"<([^|<>]+)\|([^<>]+)>")


def _mrkdwn(text: str) -> str:
    return _LINK.sub(lambda m: f"{m.group(2)} <{m.group(1)}>", text)


def _text(obj: Any) -> str:
    return _mrkdwn(str(obj.get("text", ""))) if isinstance(obj, dict) else ""


def _field(obj: Any) -> str:
    """``*Node*\\ngpu-001`` reads as ``Node: gpu-001``."""
    title, _, value = _text(obj).partition("\n")
    return f"{title.strip('*')}: {value}" if value else title


def block_lines(block: dict[str, Any]) -> list[str]:
    """One block as the lines a person sees."""
    kind = block.get("type")
    if kind == "header":
        return [_text(block.get("text")).upper()]
    if kind == "section":
        lines = _text(block.get("text")).splitlines() if "text" in block else []
        if block.get("fields"):
            lines.append(" | ".join(_field(f) for f in block["fields"]))
        return lines
    if kind == "context":
        return [" · ".join(_text(e) for e in block.get("elements", []))]
    if kind == "actions":
        return [" ".join(f"[{_text(e.get('text'))}]" for e in block.get("elements", []))]
    if kind == "divider":
        return ["—"]
    return [f"({kind} block)"]


def message_lines(message: Message) -> list[str]:
    """A message: a first line with its time, then its body (its blocks, else its text)."""
    at = datetime.fromtimestamp(message.posted_at, UTC).strftime("%H:%M:%S")
    body = [line for block in message.blocks for line in block_lines(block)] or message.text.splitlines()
    edited = f" (edited {len(message.updates)}x)" if message.updates else ""
    also = " (also sent to the channel)" if message.reply_broadcast else ""
    first = body[0] if body else ""
    return [f"[{at}] pitcrew{edited}{also}: {first}", *(f"    {line}" for line in body[1:])]


def thread_lines(api: WebApi, parent: Message) -> Iterator[str]:
    """A parent message, then each reply of its thread indented under it."""
    yield from message_lines(parent)
    for reply in api.thread(parent.channel, parent.ts)[1:]:
        for line in message_lines(reply):
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
            yield f"(only {user} sees this) {answer['text']}"
