"""Socket Mode: bolt's aiohttp handler as a background worker that knows whether it is connected.

slack_sdk's aiohttp ``SocketModeClient.connect()`` never raises: a revoked app token, a bot token
pasted as the app token, or an app token without ``connections:write`` only make it log and retry
every ping interval, while buttons and ``/pitcrew`` are dead. So this worker opens the first
connection's URL itself (``apps.connections.open`` with the app token) and hands it to the client;
when Slack refuses, it says why (``invalid_auth``, ``not_allowed_token_type``, ``missing_scope`` with
the scope ``needed``), keeps asking once a minute (the method is Tier 1) and never starts the
client's retry loop. Nor does it let that loop have the first dial: handed a URL, the client dials
that same URL again every ping interval when the dial fails and never asks for another (``connect``
opens a new one only without a URL), while Slack's URL is single-use, so one failed dial (Slack's
edge answering 503, a connection dropped) would hang Socket Mode until a restart. The first
connection is therefore given ``give_up`` too, then closed, and a new URL is opened. Once connected,
it watches ``is_connected()`` (which turns false on a closed socket and on pings unanswered for four
intervals — a half-open link); a client that has not recovered within ``give_up`` is closed and
replaced, starting again from the token check.

The state is shown as ``pitcrew_slack_socket_connected`` (1/0) and in ``/readyz``'s detail
(``describe``). Readiness itself stays with the engine: Alertmanager's webhooks and remediation
do not need Slack, and taking the pod out of its Service would stop them too; the alert
``PitcrewSlackSocketDisconnected`` (rules/) tells a person instead. Slack being down never holds
up pitcrew's start: all of this runs in the background.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Any

from prometheus_client import CollectorRegistry, Gauge
from slack_bolt.adapter.socket_mode.aiohttp import AsyncSocketModeHandler
from slack_bolt.app.async_app import AsyncApp
from slack_sdk.errors import SlackApiError

from bot import logger
from bot.engine.tasks import cancel_and_wait

log = logger(__name__)

#: Seconds between two ``apps.connections.open`` checks while Slack refuses (Tier 1: 1+ a minute).
RECHECK = 60.0


class SocketMode:
    """``start``/``stop`` for ``cleanup_ctx``; ``connected`` and ``describe`` for health and metrics."""

    def __init__(
        self,
        app: AsyncApp,
        app_token: str,
        registry: CollectorRegistry | None = None,
        *,
        ping_interval: float = 5.0,
        watch_every: float = 2.0,
        give_up: float = 30.0,
        recheck: float = RECHECK,
    ) -> None:
        self._app = app
        self._app_token = app_token
        self._ping_interval = ping_interval
        self._watch_every = watch_every
        self._give_up = give_up
        self._recheck = recheck
        self._handler: AsyncSocketModeHandler | None = None
        self._task: asyncio.Task[None] | None = None
        self.connected = False
        self.reason = "not started"
        self.since = time.time()
        self._gauge = (
            Gauge(
                "pitcrew_slack_socket_connected",
                "1 while the Slack Socket Mode connection is up (buttons and /pitcrew reach pitcrew).",
                registry=registry,
            )
            if registry is not None
            else None
        )
        self._show(False, "not started")

    def describe(self) -> dict[str, Any]:
        """For ``/readyz``: connected or not, why not, and since when (Unix seconds)."""
        return {"connected": self.connected, "reason": self.reason, "since": round(self.since, 3)}

    async def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="pitcrew-slack-socket-mode")

    async def stop(self) -> None:
        await cancel_and_wait(self._task)
        self._task = None
        await self._close()

    # ------------------------------------------------------------------ the loop
    async def _run(self) -> None:
        backoff = 1.0
        while True:
            url, wait = await self._open()
            if url is None:
                # Refused: ask again a minute later. Unreachable or overloaded: sooner, growing.
                await asyncio.sleep(wait if wait is not None else backoff)
                backoff = min(backoff * 2, self._recheck)
                continue
            # Built here, on the running loop: its aiohttp session cannot be made outside one.
            handler = AsyncSocketModeHandler(self._app, self._app_token, ping_interval=self._ping_interval)
            handler.client.wss_uri = url  # connect() uses it instead of opening another
            self._handler = handler
            self._show(False, "connecting")
            try:
                # connect() redials this one URL until it succeeds; a failed dial spent it.
                await asyncio.wait_for(handler.connect_async(), self._give_up)  # type: ignore[no-untyped-call]
            except TimeoutError:
                await self._close()
                self._show(
                    False,
                    f"Slack's Socket Mode URL did not connect within {self._give_up:g}s; opening a new one",
                    warn=True,
                )
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, self._recheck)
                continue
            backoff = 1.0
            await self._watch(handler)
            await self._close()
            self._show(False, "replacing a connection that did not recover")

    async def _open(self) -> tuple[str | None, float | None]:
        """``apps.connections.open`` with the app token: its URL, or ``None`` with the reason shown
        and how long to wait before asking again (``None``: back off)."""
        try:
            answer = await self._app.client.apps_connections_open(app_token=self._app_token)
        except SlackApiError as exc:
            response = exc.response
            data = response.data if isinstance(response.data, dict) else {}
            error = str(data.get("error") or f"HTTP {response.status_code}")
            needed = str(data.get("needed") or "")
            if response.status_code == 429:
                self._show(False, "apps.connections.open rate limited by Slack (Tier 1)", warn=True)
                return None, float(response.headers.get("Retry-After") or self._recheck)
            if response.status_code >= 500:
                self._show(False, f"Slack answered HTTP {response.status_code}", warn=True)
                return None, None
            reason = f"Slack refused the app token: {error}" + (f" (needs scope {needed})" if needed else "")
            self._show(False, reason, warn=True)
            return None, self._recheck
        except Exception as exc:  # unreachable, timed out: the same, without Slack's word
            self._show(False, f"Slack unreachable: {type(exc).__name__}", warn=True)
            return None, None
        return str(answer["url"]), None

    async def _watch(self, handler: AsyncSocketModeHandler) -> None:
        """Until the client has been down for ``give_up`` seconds without recovering."""
        down_since: float | None = None
        while True:
            if await handler.client.is_connected():
                down_since = None
                self._show(True, "connected")
            else:
                now = time.monotonic()
                down_since = down_since if down_since is not None else now
                self._show(False, "reconnecting")
                if now - down_since >= self._give_up:
                    log.warning(
                        "Slack Socket Mode did not recover; replacing the connection",
                        extra={"reason": "slack_socket_stale", "down_for": round(now - down_since, 1)},
                    )
                    return
            await asyncio.sleep(self._watch_every)

    async def _close(self) -> None:
        if self._handler is not None:
            handler, self._handler = self._handler, None
            with contextlib.suppress(Exception):
                await handler.close_async()  # type: ignore[no-untyped-call]

    def _show(self, connected: bool, reason: str, *, warn: bool = False) -> None:
        if (connected, reason) != (self.connected, self.reason):
            if warn:
                log.warning("Slack Socket Mode not connected: %s", reason, extra={"reason": "slack_socket"})
            elif connected:
                log.info("Slack Socket Mode connected")
            self.connected, self.reason, self.since = connected, reason, time.time()
        if self._gauge is not None:
            self._gauge.set(1 if connected else 0)
