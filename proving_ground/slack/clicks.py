"""A person's click on a message button, delivered as Slack delivers it: a signed ``block_actions``.

Slack's client shows the buttons of a stored message; a click makes Slack POST the app's request URL
with one form field ``payload`` (the shape of ``fixtures/slack/block-actions-approve.json``: who
clicked, the container, the channel, the message as stored, the action), signed with the app's
signing secret (``signing.interactive``). ``Interactivity`` does that for the stand-in: a person
names the button by its label and the value it carries (a click can only hit a button the message
shows), the stand-in builds the payload from its own record of the message, signs it and sends it,
then reports pitcrew's HTTP answer and the ephemeral reply the clicker got. ``POST /demo/click``
on the stand-in is how a person outside the process clicks (``scripts/demo --click``). Models Slack,
never pitcrew: it does not know what a button means.
"""

from __future__ import annotations

import asyncio
import copy
import secrets
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import aiohttp
from aiohttp import web

from proving_ground.slack import signing
from proving_ground.slack.webapi import Message

if TYPE_CHECKING:
    from proving_ground.slack.webapi import WebApi

#: How long the stand-in waits for the app's ephemeral answer to the clicker.
ANSWER_WAIT = 5.0
#: Slack's deadline for the app's HTTP answer to a click or a slash command: after 3 s the person sees
#: an error (bolt-python docs "Acknowledging requests"; api.slack.com/interactivity/slash-commands,
#: "must be returned within 3000ms"). Socket Mode acks have the same (``SocketModeEndpoint.ack``).
ACK_DEADLINE = 3.0
#: The status a request gets when the app did not answer within ``ACK_DEADLINE`` (none: Slack gave up).
TIMED_OUT = 0


class ClickError(Exception):
    """The click cannot happen as asked (no such button, unknown user, no request URL)."""


@dataclass(frozen=True, slots=True)
class ClickAnswer:
    """What the clicker saw: the app's HTTP status and its ephemeral reply (``""``: none in time)."""

    status: int
    answer: str
    message_ts: str

    def as_json(self) -> dict[str, Any]:
        return {"status": self.status, "answer": self.answer, "message_ts": self.message_ts}


def _button(message: Message, label: str, value: str) -> tuple[str, dict[str, Any]] | None:
    """The (block_id, element) of the button labelled ``label`` (any case) carrying ``value``."""
    for block in message.blocks:
        if block.get("type") != "actions":
            continue
        for element in block.get("elements", []):
            text = str((element.get("text") or {}).get("text", ""))
            if (
                element.get("type") == "button"
                and text.lower() == label.lower()
                and element.get("value") == value
            ):
                return str(block.get("block_id", "")), element
    return None


def find_button(api: WebApi, channel: str, label: str, value: str) -> tuple[Message, str, dict[str, Any]]:
    """The newest message in ``channel`` showing that button, with its block id and the button."""
    for message in reversed(api.messages):
        if message.channel != channel:
            continue
        found = _button(message, label, value)
        if found is not None:
            return message, found[0], found[1]
    raise ClickError(f"no message in {channel} shows a {label!r} button for {value}")


def block_actions(
    api: WebApi, message: Message, block_id: str, button: dict[str, Any], user: str
) -> dict[str, Any]:
    """The ``block_actions`` payload Slack sends when ``user`` clicks ``button`` on ``message``."""
    world = api.world
    name = world.users.get(user)
    if name is None:
        raise ClickError(f"no user {user} in the workspace (known: {', '.join(sorted(world.users))})")
    channel = world.channels[message.channel]
    now = time.time()
    stored = {
        "user": message.user,
        "type": "message",
        "ts": message.ts,
        "bot_id": world.bot_id,
        "app_id": world.app_id,
        "text": message.text,
        "team": world.team_id,
        "blocks": copy.deepcopy(message.blocks),
    }
    if message.thread_ts:
        stored["thread_ts"] = message.thread_ts
    return {
        "type": "block_actions",
        "user": {"id": user, "username": name, "name": name, "team_id": world.team_id},
        "api_app_id": world.app_id,
        "token": "Zx9PqR4sT7uV2wY5aB8cD1eF",  # the deprecated verification token: Slack still sends one
        "container": {
            "type": "message",
            "message_ts": message.ts,
            "channel_id": channel.id,
            "is_ephemeral": False,
        },
        "trigger_id": f"{int(now)}{secrets.randbelow(1000):03d}.{world.epoch}.{secrets.token_hex(16)}",
        "team": {"id": world.team_id, "domain": world.domain},
        "enterprise": None,
        "is_enterprise_install": False,
        "channel": {"id": channel.id, "name": channel.name},
        "message": stored,
        "state": {"values": {}},
        "response_url": api.response_url(user, channel.id, "actions")
        if api.response_url is not None
        else f"https://hooks.slack.com/actions/{world.team_id}/{int(now)}/{secrets.token_hex(12)}",
        "actions": [
            {
                "action_id": button.get("action_id"),
                "block_id": block_id,
                "text": button.get("text"),
                "value": button.get("value"),
                **({"style": button["style"]} if "style" in button else {}),
                "type": "button",
                "action_ts": f"{now:.6f}",
            }
        ],
    }


async def deliver(url: str, request: signing.SignedRequest) -> tuple[int, bytes]:
    """POST a signed request as Slack does: the status and body, or ``TIMED_OUT`` after 3 s."""
    timeout = aiohttp.ClientTimeout(total=ACK_DEADLINE)
    try:
        async with (
            aiohttp.ClientSession(timeout=timeout) as session,
            session.post(url, data=request.body, headers=request.headers) as response,
        ):
            return response.status, await response.read()
    except TimeoutError:
        return TIMED_OUT, b""


class Interactivity:
    """The app's interactivity settings (request URL, signing secret) and the clicks sent to it."""

    def __init__(self, api: WebApi, request_url: str, signing_secret: str) -> None:
        self.api = api
        self.request_url = request_url
        self._secret = signing_secret

    async def click(self, channel: str, label: str, value: str, user: str) -> ClickAnswer:
        """``user`` clicks the ``label`` button carrying ``value``: sign, send, wait for the reply."""
        message, block_id, button = find_button(self.api, channel, label, value)
        payload = block_actions(self.api, message, block_id, button, user)
        request = signing.interactive(self._secret, payload)
        seen = len(self.api.ephemeral)
        status, _ = await deliver(self.request_url, request)
        answer = ""
        deadline = time.monotonic() + ANSWER_WAIT
        while status == 200 and not answer and time.monotonic() < deadline:
            replies = [e for e in self.api.ephemeral[seen:] if e["user"] == user]
            answer = str(replies[0]["text"]) if replies else ""
            if not answer:
                await asyncio.sleep(0.05)
        return ClickAnswer(status, answer, message.ts)


async def handle_click(interactivity: Interactivity | None, request: web.Request) -> web.Response:
    """``POST /demo/click`` ``{"channel", "button", "value", "user"}``: a person's click, from outside."""
    if interactivity is None:
        return web.json_response({"error": "no interactivity request URL is configured"}, status=409)
    try:
        body = await request.json()
        fields = {k: str(body[k]) for k in ("channel", "button", "value", "user")}
    except (ValueError, KeyError, TypeError):
        return web.json_response({"error": "want JSON {channel, button, value, user}"}, status=400)
    try:
        answer = await interactivity.click(
            fields["channel"], fields["button"], fields["value"], fields["user"]
        )
    except ClickError as exc:
        return web.json_response({"error": str(exc)}, status=404)
    except aiohttp.ClientError as exc:
        return web.json_response({"error": f"the request URL did not answer: {exc}"}, status=502)
    return web.json_response(answer.as_json())
