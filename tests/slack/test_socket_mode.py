"""The Socket Mode endpoint, proved with slack_sdk's real aiohttp SocketModeClient and slack_bolt.

Cases:
- apps.connections.open wants the app-level token (a bot token is ``not_allowed_token_type``) and returns
  a ws:// URL on the stand-in; the URL is single-use;
- the client connects and gets ``hello`` (fixture shape); an injected interactive envelope (the fixture's
  block_actions payload) reaches its listener and is acked with exactly ``{"envelope_id"}``;
- a slash_commands envelope accepts a response payload and the ack carries it;
- ``disconnect`` / refresh_requested makes the client open a new URL, and envelopes flow on it;
- bolt's AsyncSocketModeHandler routes an envelope to an ``app.action`` listener and acks it.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from slack_bolt.adapter.socket_mode.async_handler import AsyncSocketModeHandler
from slack_bolt.async_app import AsyncApp
from slack_sdk.errors import SlackApiError
from slack_sdk.socket_mode.aiohttp import SocketModeClient
from slack_sdk.socket_mode.request import SocketModeRequest
from slack_sdk.socket_mode.response import SocketModeResponse
from slack_sdk.web.async_client import AsyncWebClient

from proving_ground.slack.server import SlackStandin
from proving_ground.slack.world import APP_TOKEN, SIGNING_SECRET, TESTER_TOKEN

FIXTURES = Path(__file__).parent / "fixtures"


def fixture(name: str) -> Any:
    return json.loads((FIXTURES / name).read_text())


class Seen:
    def __init__(self) -> None:
        self.frames: list[dict[str, Any]] = []
        self.requests: list[SocketModeRequest] = []

    async def on_message(self, client: SocketModeClient, message: dict[str, Any], raw: str | None) -> None:
        self.frames.append(message)

    async def on_request(self, client: SocketModeClient, req: SocketModeRequest) -> None:
        self.requests.append(req)
        payload = {"response_type": "ephemeral", "text": "ok"} if req.accepts_response_payload else None
        await client.send_socket_mode_response(
            SocketModeResponse(envelope_id=req.envelope_id, payload=payload)
        )


@pytest.fixture
async def socket_client(slack: SlackStandin) -> AsyncIterator[tuple[SocketModeClient, Seen]]:
    seen = Seen()
    client = SocketModeClient(
        app_token=APP_TOKEN, web_client=AsyncWebClient(base_url=slack.base_url), ping_interval=1
    )
    client.message_listeners.append(seen.on_message)  # type: ignore[arg-type]
    client.socket_mode_request_listeners.append(seen.on_request)  # type: ignore[arg-type]
    try:
        await client.connect()  # type: ignore[no-untyped-call]
        await slack.socket.connected()
        yield client, seen
    finally:
        await client.close()  # type: ignore[no-untyped-call]


async def test_connections_open_wants_the_app_token_and_urls_are_single_use(slack: SlackStandin) -> None:
    slack.api.allow("rate_tiers")  # two opens within a minute (Tier 1 is 1+ a minute)
    with pytest.raises(SlackApiError) as e:
        await AsyncWebClient(base_url=slack.base_url).apps_connections_open(app_token=TESTER_TOKEN)
    assert e.value.response.data == {"ok": False, "error": "not_allowed_token_type"}
    answer = await AsyncWebClient(base_url=slack.base_url).apps_connections_open(app_token=APP_TOKEN)
    assert answer["url"].startswith(f"ws://127.0.0.1:{slack.port}/link/?ticket=")
    async with aiohttp.ClientSession() as session:
        async with session.ws_connect(answer["url"]) as ws:
            hello = await ws.receive_json()
            assert set(hello) == set(fixture("socket-mode-hello.json")) and hello["type"] == "hello"
        with pytest.raises(aiohttp.WSServerHandshakeError) as refused:
            await session.ws_connect(answer["url"])
        assert refused.value.status == 401


async def test_interactive_envelope_is_delivered_and_acked(
    slack: SlackStandin, socket_client: tuple[SocketModeClient, Seen]
) -> None:
    _, seen = socket_client
    payload = fixture("socket-mode-envelope-interactive.json")["payload"]
    envelope_id = await slack.socket.send("interactive", payload)
    assert await slack.socket.ack(envelope_id) == {"envelope_id": envelope_id}
    [req] = seen.requests
    assert (req.type, req.payload, req.accepts_response_payload) == ("interactive", payload, False)
    assert seen.frames[0]["type"] == "hello"


async def test_slash_envelope_ack_carries_the_response(
    slack: SlackStandin, socket_client: tuple[SocketModeClient, Seen]
) -> None:
    payload = fixture("socket-mode-envelope-slash.json")["payload"]
    envelope_id = await slack.socket.send("slash_commands", payload)
    ack = await slack.socket.ack(envelope_id)
    assert ack == {"envelope_id": envelope_id, "payload": {"response_type": "ephemeral", "text": "ok"}}


async def test_disconnect_refresh_makes_the_client_open_a_new_url(
    slack: SlackStandin, socket_client: tuple[SocketModeClient, Seen]
) -> None:
    _, seen = socket_client
    slack.api.allow("rate_tiers")  # the reconnect opens a second URL within the minute (Tier 1)
    await slack.socket.disconnect("refresh_requested")
    for _ in range(100):
        if len(slack.api.calls_to("apps.connections.open")) == 2 and slack.socket.connections:
            break
        await asyncio.sleep(0.05)
    assert len(slack.api.calls_to("apps.connections.open")) == 2
    assert slack.socket.refused == 0  # the old single-use URL was not retried
    envelope_id = await slack.socket.send("interactive", {"type": "block_actions"})
    assert await slack.socket.ack(envelope_id) == {"envelope_id": envelope_id}
    # slack_sdk consumes "disconnect" itself (it never reaches listeners); a second hello proves the reconnect.
    assert [f["type"] for f in seen.frames if "type" in f and "envelope_id" not in f] == ["hello", "hello"]


async def test_bolt_socket_mode_handler_routes_and_acks(slack: SlackStandin) -> None:
    app = AsyncApp(
        signing_secret=SIGNING_SECRET, client=AsyncWebClient(token=TESTER_TOKEN, base_url=slack.base_url)
    )
    clicked: list[str] = []

    @app.action("pitcrew_approve")
    async def approve(ack, body) -> None:  # type: ignore[no-untyped-def]
        clicked.append(body["user"]["id"])
        await ack()

    handler = AsyncSocketModeHandler(app, APP_TOKEN, web_client=AsyncWebClient(base_url=slack.base_url))
    try:
        await handler.connect_async()  # type: ignore[no-untyped-call]
        await slack.socket.connected()
        payload = fixture("socket-mode-envelope-interactive.json")["payload"]
        envelope_id = await slack.socket.send("interactive", payload)
        assert await slack.socket.ack(envelope_id) == {"envelope_id": envelope_id}
        assert clicked == ["U0ALICE"]
    finally:
        await handler.close_async()  # type: ignore[no-untyped-call]
