"""The Socket Mode side of the stand-in: ``apps.connections.open`` and the websocket behind its URL.

Protocol from ``fixtures/slack/README.md`` rule 4: open a single-use URL with the app-level token,
connect, receive ``hello``, then envelopes; the client acks ``{"envelope_id"}`` (with ``payload`` only
where ``accepts_response_payload``) on the same socket; ``disconnect`` makes it open a new URL. Frames
are not signed. A test injects envelopes and waits for their acks; pitcrew logic never lives here.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import uuid
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from aiohttp import WSMsgType, web

from proving_ground.slack.webapi import ApiError
from proving_ground.slack.world import World

if TYPE_CHECKING:
    from proving_ground.slack.webapi import WebApi

ENVELOPE_TYPES = frozenset({"interactive", "slash_commands", "events_api"})
DISCONNECT_REASONS = frozenset({"warning", "refresh_requested", "too_many_websockets", "link_disabled"})


class SocketModeEndpoint:
    def __init__(self, world: World, ws_base: Callable[[], str]) -> None:
        self.world = world
        self._ws_base = ws_base
        self.tickets: dict[str, bool] = {}  # ticket -> already used
        self.connections: list[web.WebSocketResponse] = []
        self.acks: dict[str, dict[str, Any]] = {}
        self.refused: int = 0
        self._waiters: dict[str, asyncio.Future[dict[str, Any]]] = {}
        self._connected = asyncio.Event()
        self._left = asyncio.Event()  # set whenever a connection closes
        #: False: the far end stops answering websocket pings on every connection (a half-open link:
        #: the TCP connection stays up, nothing comes back). The client must notice by itself.
        self.answer_pings = True
        self.pings_unanswered = 0
        #: Dials still to fail (``fail_dials``) with this HTTP status, and how many did.
        self._failing: list[int] = []
        self.dials_failed = 0

    # -- Web API method ------------------------------------------------------------------------------

    async def open(self, api: WebApi, token: str, args: dict[str, Any]) -> dict[str, Any]:
        """``apps.connections.open``: app-level tokens with ``connections:write`` only; each URL carries a
        fresh single-use ticket (docs.slack.dev/reference/methods/apps.connections.open: token type
        app-level, scope ``connections:write``, errors ``invalid_auth``, ``not_allowed_token_type``,
        ``missing_scope``)."""
        if not token:
            raise ApiError("not_authed")
        if token in self.world.bot_tokens:
            raise ApiError("not_allowed_token_type")
        if token not in self.world.app_tokens:
            raise ApiError("invalid_auth")  # revoked, or never issued
        if "connections:write" not in self.world.app_token_scopes:
            provided = ",".join(sorted(self.world.app_token_scopes))
            raise ApiError("missing_scope", needed="connections:write", provided=provided)
        ticket = str(uuid.uuid4())
        self.tickets[ticket] = False
        return {"ok": True, "url": f"{self._ws_base()}/link/?ticket={ticket}&app_id={self.world.app_id}"}

    # -- the websocket ------------------------------------------------------------------------------

    def hello(self) -> dict[str, Any]:
        return {
            "type": "hello",
            "num_connections": len(self.connections),
            "debug_info": {
                "host": "applink-standin",
                "build_number": 10,
                "approximate_connection_time": 18060,
            },
            "connection_info": {"app_id": self.world.app_id},
        }

    async def handle(self, request: web.Request) -> web.StreamResponse:
        ticket = request.query.get("ticket", "")
        if self.tickets.get(ticket, True):  # unknown or already used: the URL is single-use
            self.refused += 1
            raise web.HTTPUnauthorized(text="invalid ticket")
        self.tickets[ticket] = True  # spent by this dial, whatever becomes of it
        if self._failing:
            self.dials_failed += 1
            status = self._failing.pop(0)
            return web.Response(status=status, text="upstream connect error", content_type="text/plain")
        ws = web.WebSocketResponse(autoping=False)
        await ws.prepare(request)
        self.connections.append(ws)
        await ws.send_json(self.hello())
        self._connected.set()
        try:
            async for msg in ws:
                if msg.type == WSMsgType.TEXT:
                    self._ack(json.loads(msg.data))
                elif msg.type == WSMsgType.PING:
                    if self.answer_pings:
                        await ws.pong(msg.data)
                    else:
                        self.pings_unanswered += 1
        finally:
            self.connections.remove(ws)
            self._left.set()
            if not self.connections:
                self._connected.clear()
        return ws

    def _ack(self, frame: dict[str, Any]) -> None:
        envelope_id = frame.get("envelope_id")
        if not isinstance(envelope_id, str):
            return
        self.acks[envelope_id] = frame
        waiter = self._waiters.get(envelope_id)
        if waiter is not None and not waiter.done():
            waiter.set_result(frame)

    # -- what a test drives -------------------------------------------------------------------------

    def fail_dials(self, count: int = 1, status: int = 503) -> None:
        """The next ``count`` websocket dials fail before the upgrade with HTTP ``status`` (Slack's
        edge overloaded or restarting, as any far side's can). Each spends its URL's ticket: the
        client must open a new URL, a dial of the same one is refused like any reused ticket."""
        assert 500 <= status < 600, status
        self._failing += [status] * count

    async def connected(self, timeout: float = 5.0) -> None:
        await asyncio.wait_for(self._connected.wait(), timeout)

    async def send(
        self,
        kind: str,
        payload: dict[str, Any],
        *,
        accepts_response_payload: bool | None = None,
        retry_attempt: int | None = None,
    ) -> str:
        """Deliver an envelope to one open connection (Slack sends each to only one); its envelope_id."""
        assert kind in ENVELOPE_TYPES, kind
        await self.connected()
        envelope_id = str(uuid.uuid4())
        envelope: dict[str, Any] = {"envelope_id": envelope_id, "payload": payload, "type": kind}
        if accepts_response_payload is None:
            accepts_response_payload = kind == "slash_commands"
        envelope["accepts_response_payload"] = accepts_response_payload
        if retry_attempt is not None:
            envelope.update({"retry_attempt": retry_attempt, "retry_reason": "timeout"})
        self._waiters[envelope_id] = asyncio.get_running_loop().create_future()
        await self.connections[-1].send_json(envelope)
        return envelope_id

    async def ack(self, envelope_id: str, timeout: float = 3.0) -> dict[str, Any]:
        """The client's ack frame; Slack's deadline is 3 s."""
        return await asyncio.wait_for(asyncio.shield(self._waiters[envelope_id]), timeout)

    async def disconnect(self, reason: str = "refresh_requested", grace: float = 2.0) -> None:
        """Send ``disconnect`` to every connection and close those the client has not left within grace."""
        assert reason in DISCONNECT_REASONS, reason
        old = list(self.connections)
        for ws in old:
            await ws.send_json(
                {"type": "disconnect", "reason": reason, "debug_info": {"host": "applink-standin"}}
            )
        loop = asyncio.get_running_loop()
        deadline = loop.time() + grace
        while any(ws in self.connections for ws in old) and loop.time() < deadline:
            self._left.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._left.wait(), max(0.0, deadline - loop.time()))
        for ws in old:
            await ws.close()

    async def close_all(self) -> None:
        for ws in list(self.connections):
            await ws.close()
