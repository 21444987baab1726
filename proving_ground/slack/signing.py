"""Requests as Slack sends them to pitcrew's ``/slack/events``: form-encoded, signed with v0 HMAC-SHA256.

Encoding follows ``fixtures/slack/block-actions-request.txt``: compact JSON escaping "/" as "\\/", every
byte but ``A-Z a-z 0-9 - _ .`` percent-encoded, space as "+". The signature covers these raw bytes, so a
test can alter the body, the timestamp or the secret after signing and expect a refusal.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import time
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote_plus


@dataclass(frozen=True)
class SignedRequest:
    body: bytes
    headers: dict[str, str]

    @property
    def text(self) -> str:
        return self.body.decode()


def _encode(value: str) -> str:
    return quote_plus(value, safe="").replace("~", "%7E")


def form_body(fields: dict[str, str]) -> bytes:
    return "&".join(f"{_encode(k)}={_encode(v)}" for k, v in fields.items()).encode()


def signature(secret: str, timestamp: int | str, body: bytes) -> str:
    base = b"v0:" + str(timestamp).encode() + b":" + body
    return "v0=" + hmac.new(secret.encode(), base, hashlib.sha256).hexdigest()


def sign(secret: str, body: bytes, timestamp: int | None = None) -> SignedRequest:
    ts = int(time.time()) if timestamp is None else timestamp
    headers = {
        "Content-Type": "application/x-www-form-urlencoded",
        "X-Slack-Request-Timestamp": str(ts),
        "X-Slack-Signature": signature(secret, ts, body),
        "User-Agent": "Slackbot 1.0 (+https://api.slack.com/robots)",
    }
    return SignedRequest(body, headers)


def interactive(secret: str, payload: dict[str, Any], timestamp: int | None = None) -> SignedRequest:
    """A ``block_actions`` (or any interactivity) request: one form field ``payload`` holding JSON."""
    raw = json.dumps(payload, separators=(",", ":"), ensure_ascii=False).replace("/", "\\/")
    return sign(secret, form_body({"payload": raw}), timestamp)


def slash_command(secret: str, fields: dict[str, str], timestamp: int | None = None) -> SignedRequest:
    """A slash command: plain form fields, all strings, in the order given."""
    return sign(secret, form_body(fields), timestamp)


def slash_fields(
    text: str,
    user_id: str = "U0ALICE",
    user_name: str = "alice",
    *,
    channel: tuple[str, str] = ("C0GPUOPS", "gpu-ops"),
    response_url: str = "https://hooks.slack.com/commands/T0PITCREW/8123456790034/hR5tY8uI1oP4aS7dF0gJ3kL6",
) -> dict[str, str]:
    """The fields of ``slash-command.txt`` for ``/pitcrew <text>`` typed by ``user_id`` in ``channel``
    (id, name; a DM is ``("D…", "directmessage")``), answerable later at ``response_url``."""
    return {
        "token": "Zx9PqR4sT7uV2wY5aB8cD1eF",
        "team_id": "T0PITCREW",
        "team_domain": "pitcrew",
        "channel_id": channel[0],
        "channel_name": channel[1],
        "user_id": user_id,
        "user_name": user_name,
        "command": "/pitcrew",
        "text": text,
        "api_app_id": "A0PITCREW",
        "is_enterprise_install": "false",
        "response_url": response_url,
        "trigger_id": "8123456791107.1234567890123.4b6d8f0a2c4e6a8b0d2f4a6c8e0b2d4f",
    }


def block_action(payload: dict[str, Any], user_id: str, user_name: str) -> dict[str, Any]:
    """A fixture click re-attributed to another user (what a second approver's click looks like)."""
    clicked: dict[str, Any] = json.loads(json.dumps(payload))
    clicked["user"].update({"id": user_id, "username": user_name, "name": user_name})
    return clicked
