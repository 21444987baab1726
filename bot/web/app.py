"""The aiohttp application: ``create_app(deps)`` wires routes to injected services.

Background workers (the store writer, the engine) are owned by ``cleanup_ctx`` so they
start with the app and stop after it: aiohttp's graceful shutdown waits only for request
handlers, not for tasks.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Protocol

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from bot import logger
from bot.config import Config
from bot.domain.alerts import AlertRejected, PayloadError
from bot.engine.backoff import Backoff
from bot.engine.intake import Intake
from bot.engine.metrics import Metrics
from bot.store.base import Store, StoreUnavailable
from bot.web import auth
from bot.web.commands import CommandSurface, add_command_routes
from bot.web.limits import ConnectionGate, effective_cap
from bot.web.reads import add_read_routes, denied_read
from bot.web.serve import STOP

log = logger(__name__)


class Background(Protocol):
    async def start(self) -> None: ...
    async def stop(self) -> None: ...


@dataclass
class Deps:
    config: Config
    store: Store
    intake: Intake
    metrics: Metrics
    clock: Callable[[], datetime]
    webhook_credentials: auth.Credentials
    admin_credentials: auth.Credentials
    background: Sequence[Background] = ()
    #: Bearer token for the read API (``bot.web.reads``); the admin token reads too.
    read_credentials: auth.Credentials = field(default_factory=auth.Credentials)
    commands: CommandSurface | None = None
    ready_checks: list[Callable[[], bool]] = field(default_factory=list)
    #: Who leads the store and this process's role in it (``bot.engine.leadership``), for /readyz:
    #: a standby is ready (it takes webhooks and commands), and says who acts.
    leadership: Callable[[], dict[str, Any]] | None = None
    #: Shown in ``/readyz`` under ``detail`` without deciding readiness (Slack's Socket Mode state).
    ready_detail: dict[str, Callable[[], dict[str, Any]]] = field(default_factory=dict)
    #: Shutting down after a delay (``server.shutdown_delay``): still serving, no longer ready.
    stopping: bool = False
    #: Why the service stopped by itself (a store found, once reached, that must not be opened).
    failure: BaseException | None = None
    #: The store is open (``_lifecycle``): until then every route but the probes and /metrics
    #: answers 503 (``_store_away``).
    opened: bool = False

    def stop_soon(self) -> None:
        self.stopping = True


DEPS = web.AppKey("deps", Deps)
#: The connection cap and stranger idle time ``bot.web.serve`` puts in front of the app.
GATE = web.AppKey("gate", ConnectionGate)


def create_app(deps: Deps) -> web.Application:
    server = deps.config.settings.server
    gate = ConnectionGate(effective_cap(server.max_connections), server.unauthenticated_idle.total_seconds())
    app = web.Application(
        client_max_size=server.max_body_bytes,
        # Bodies are read as sent: the webhook refuses a Content-Encoding (see ``_receive``).
        handler_args={"auto_decompress": False},
        middlewares=[gate.middleware(lambda request: _authenticated(request, deps)), _store_away],
    )
    app[DEPS] = deps
    app[GATE] = gate
    app.router.add_post("/api/v1/alerts", receive_alerts)
    add_read_routes(app, DEPS)
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/metrics", metrics)
    add_command_routes(app, DEPS)
    app.cleanup_ctx.append(_lifecycle)
    return app


#: Between attempts to open a store that could not be reached at start: doubling up to the maximum.
OPEN_BACKOFF = Backoff(initial=1.0, maximum=15.0)


async def _lifecycle(app: web.Application) -> AsyncIterator[None]:
    """The store opened, then the background workers started, before the app serves; stopped in
    reverse after it. A store that cannot be reached at start (Postgres away: ``StoreUnavailable``)
    does not stop the start: the app serves at once, not ready (``/readyz`` 503, webhooks 503 for
    Alertmanager to send again), and the store is opened, then the workers started, once it can
    be, trying again with backoff. Exiting instead, a pod started while Postgres was away (a
    rollout, its node lost) was restarted by the kubelet with a backoff of its own, up to five
    minutes, and stayed down that long after Postgres came back. Anything else the open raises
    (a store this pitcrew must not open, ``StoreRefused``) stops the start, or, found later, the
    service (``deps.failure``, raised once it has stopped)."""
    deps = app[DEPS]
    started: list[Background] = []
    opening: asyncio.Task[None] | None = None
    try:
        try:
            await deps.store.open()
        except StoreUnavailable as exc:
            log.warning(
                "store unavailable at start; serving, not ready, until it can be opened",
                extra={"reason": str(exc)},
            )
            opening = asyncio.create_task(_open_later(app, started), name="pitcrew-store-open")
        else:
            await _opened(deps, started)
        yield
    finally:
        if opening is not None:
            opening.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await opening
        for worker in reversed(started):
            await worker.stop()
        await deps.store.close()


async def _opened(deps: Deps, started: list[Background]) -> None:
    """The store is open: every route takes requests, and the background workers start."""
    deps.opened = True
    for worker in deps.background:
        await worker.start()
        started.append(worker)


async def _open_later(app: web.Application, started: list[Background]) -> None:
    """The store opened once it can be (``StoreUnavailable``: tried again, with backoff), then the
    workers started. Anything else raised stops the service, as it would have stopped the start."""
    deps = app[DEPS]
    failures = 1
    try:
        while True:
            await asyncio.sleep(OPEN_BACKOFF.delay(failures))
            try:
                await deps.store.open()
            except StoreUnavailable as exc:
                failures += 1
                log.warning("store still unavailable; trying again", extra={"reason": str(exc)})
                continue
            break
        log.info("store opened", extra={"attempts": failures + 1})
        await _opened(deps, started)
    except Exception as exc:  # a store this pitcrew must not open (StoreRefused), a worker that failed
        log.error("could not start; stopping", extra={"reason": str(exc)})
        deps.failure = exc
        stop = app.get(STOP)
        if stop is not None:
            stop.set()


async def receive_alerts(request: web.Request) -> web.Response:
    deps = request.app[DEPS]
    started = time.perf_counter()
    response = await _receive(request, deps)
    deps.metrics.webhook_requests.labels(str(response.status)).inc()
    deps.metrics.webhook_duration.observe(time.perf_counter() - started)
    return response


async def _receive(request: web.Request, deps: Deps) -> web.Response:
    denied = auth.check(request, deps.webhook_credentials)
    if denied is not None:
        return denied
    limit = deps.config.settings.server.max_body_bytes
    if request.content_length is not None and request.content_length > limit:
        return _error(413, f"body of {request.content_length} bytes exceeds server.max_body_bytes ({limit})")
    encoding = request.headers.get("Content-Encoding", "").strip().lower()
    if encoding not in {"", "identity"}:
        # Alertmanager sends plain JSON. The app does not decompress (``create_app``), so a body
        # is never a decompression bomb, and a header that lies about the body cannot fail later.
        return _error(400, f"Content-Encoding {encoding[:40]!r} is not accepted; send plain JSON")
    try:
        body = await request.read()
    except web.HTTPRequestEntityTooLarge:
        return _error(413, f"body exceeds server.max_body_bytes ({limit})")
    try:
        outcome = await deps.intake.accept(body, deps.clock())
    except AlertRejected as exc:
        return _error(400, f"delivery refused, nothing of it stored: {exc}")
    except PayloadError as exc:
        return _error(400, f"not an Alertmanager v4 webhook: {exc}")
    except StoreUnavailable as exc:
        # The store logged the cause when it began; one line per refused delivery, no traceback.
        log.warning("store unavailable; asking Alertmanager to redeliver", extra={"reason": str(exc)})
        return _unavailable()
    return web.json_response(
        {
            "status": "ok",
            "new": outcome.new_alerts,
            "repeated": outcome.repeated_alerts,
            "resolved": outcome.resolved,
            "unroutable": outcome.unroutable,
            "opened": outcome.opened,
            "attached": sorted(set(outcome.attached)),
        }
    )


def _authenticated(request: web.Request, deps: Deps) -> bool:
    """The request carries a valid credential of some role: its connection is no stranger's."""
    roles = (deps.webhook_credentials, deps.admin_credentials, deps.read_credentials)
    return any(auth.check(request, role) is None for role in roles if role.required)


def _unavailable() -> web.Response:
    """The answer while the store is away: try again, soon."""
    return web.json_response({"error": "store unavailable, retry"}, status=503, headers={"Retry-After": "1"})


#: Routes that answer without the store open: the probes say why, /metrics is scraped as ever, and
#: Slack's requests are acknowledged and answered (``bot.integrations.slack.inbound.STORE_AWAY``):
#: a click refused is never sent again, and Slack would show its own error.
_WITHOUT_STORE = frozenset({"/healthz", "/readyz", "/metrics", "/slack/events"})


@web.middleware
async def _store_away(
    request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
) -> web.StreamResponse:
    """Any route's answer while the store is away (Postgres restarting, failing over, not reached
    yet at start): ``503`` with ``Retry-After``, one line logged, as the webhook answers. The read
    API and the commands answered 500, with a traceback logged each time."""
    if not request.app[DEPS].opened and request.path not in _WITHOUT_STORE:
        return _unavailable()  # not open yet: nothing may read or write it half-made
    try:
        return await handler(request)
    except StoreUnavailable as exc:
        log.warning("store unavailable; answered 503", extra={"path": request.path, "reason": str(exc)})
        return _unavailable()


def _error(status: int, message: str) -> web.Response:
    return web.json_response({"error": message}, status=status)


async def healthz(request: web.Request) -> web.Response:
    return web.json_response({"status": "ok"})


async def readyz(request: web.Request) -> web.Response:
    deps = request.app[DEPS]
    checks = {"store": await deps.store.ping()}
    for index, check in enumerate(deps.ready_checks):
        checks[f"check{index}"] = check()
    ok = all(checks.values()) and not deps.stopping
    status = "stopping" if deps.stopping else "ok" if ok else "not ready"
    answer: dict[str, Any] = {"status": status, "checks": checks}
    if deps.leadership is not None:
        answer["leadership"] = deps.leadership()
    if deps.ready_detail:
        answer["detail"] = {name: describe() for name, describe in deps.ready_detail.items()}
    return web.json_response(answer, status=200 if ok else 503)


#: Series that name an incident's node and Slack thread, or a lemon node: only for a scrape that may
#: read incidents.
INCIDENT_FAMILIES = frozenset({"pitcrew_incident_info", "pitcrew_lemon_nodes"})


class _Without(Collector):
    """The registry without some families: what a scrape without the read token gets."""

    def __init__(self, registry: CollectorRegistry, names: frozenset[str]) -> None:
        self._registry, self._names = registry, names

    def collect(self) -> Iterable[Metric]:
        return (family for family in self._registry.collect() if family.name not in self._names)


async def metrics(request: web.Request) -> web.Response:
    """Every aggregate series to anyone who reaches the port (Prometheus needs no credentials for
    them); the per-incident series (node, Slack thread link) only with the credentials the read
    API takes. Wrong credentials are a 403, so a misconfigured scrape shows as ``up == 0``."""
    deps = request.app[DEPS]
    registry: Collector = deps.metrics.registry
    if denied_read(request, deps) is not None:
        if "Authorization" in request.headers:
            return _error(403, "invalid credentials: /metrics takes the read or admin token")
        registry = _Without(deps.metrics.registry, INCIDENT_FAMILIES)
    # Rendered in a thread: a few thousand series take tens of milliseconds (~25 µs a sample), and
    # on the loop every webhook would wait that long at each scrape. prometheus_client's metrics
    # are made to be read from another thread (each copies its children under its own lock).
    body = await asyncio.to_thread(generate_latest, registry)
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})
