"""``response_url``: where an app answers a slash command or a click later, in any conversation.

Slack puts a ``response_url`` in every slash command and interactive payload. A POST of a message
to it (JSON ``text``/``blocks``, ``response_type`` ``ephemeral`` by default or ``in_channel``) reaches
the user where they typed or clicked — a DM, a channel the bot is not in — which ``chat.postEphemeral``
cannot. It works up to 5 times within 30 minutes of the command (docs.slack.dev/interactivity/
handling-user-interaction, "Responding with response_url"; api.slack.com/interactivity/slash-commands,
"Delayed responses and multiple responses"). Models Slack, never pitcrew.
"""

from __future__ import annotations

import json
import secrets
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from aiohttp import web

if TYPE_CHECKING:
    from proving_ground.slack.webapi import WebApi

USES = 5
LIFETIME = 30 * 60.0


@dataclass
class ResponseUrl:
    user: str
    channel: str
    made: float = field(default_factory=time.monotonic)
    uses: int = 0


class Responses:
    def __init__(self, api: WebApi) -> None:
        self.api = api
        self.urls: dict[str, ResponseUrl] = {}
        #: Every message answered through a response_url: ``{"user", "channel", "text", "response_type",
        #: "replace_original"}``.
        self.answered: list[dict[str, Any]] = []

    def mint(self, base: str, kind: str, user: str, channel: str) -> str:
        """A fresh response_url for ``user`` in ``channel`` (``kind``: ``commands`` or ``actions``)."""
        key = f"{self.api.world.team_id}/{int(time.time())}/{secrets.token_hex(12)}"
        self.urls[f"{kind}/{key}"] = ResponseUrl(user, channel)
        return f"{base}/{kind}/{key}"

    async def handle(self, request: web.Request) -> web.Response:
        key = f"{request.match_info['kind']}/{request.match_info['key']}"
        found = self.urls.get(key)
        if found is None or time.monotonic() - found.made > LIFETIME:
            return web.Response(status=404, text="expired_url")
        if found.uses >= USES:
            return web.Response(status=404, text="used_url")
        try:
            body = json.loads(await request.read())
        except ValueError:
            return web.Response(status=400, text="invalid_payload")
        if not isinstance(body, dict) or not (body.get("text") or body.get("blocks")):
            return web.Response(status=400, text="no_text")
        found.uses += 1
        text, blocks = str(body.get("text") or ""), list(body.get("blocks") or [])
        self.api.audit("response_url", text, blocks)
        kind = str(body.get("response_type") or "ephemeral")
        # Kept as sent: an answer to a click that does not say ``replace_original: false`` risks
        # replacing the message clicked (Slack's legacy default), the incident's parent here.
        replace = body.get("replace_original")
        answer = {
            "user": found.user,
            "channel": found.channel,
            "text": text,
            "response_type": kind,
            "replace_original": replace,
        }
        self.answered.append(answer)
        if kind == "ephemeral":
            self.api.ephemeral.append(
                {"channel": found.channel, "user": found.user, "ts": self.api.next_ts(), "text": text,
                 "blocks": blocks, "via": "response_url"}
            )  # fmt: skip
        return web.json_response({"ok": True})
