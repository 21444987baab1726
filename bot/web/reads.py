"""The read API: ``GET /api/v1/incidents`` and ``GET /api/v1/incidents/{id}``, behind a read credential.

Incidents name nodes, jobs and users, so a read needs the read token
(``server.auth.read_token_file``) or the admin token; with neither configured reads are off,
unless ``server.auth.allow_unauthenticated_reads`` (refused by ``bot.config`` on anything but a
loopback listen) says otherwise. An incident's alerts and events come in pages
(``alerts_limit``/``alerts_after``, ``events_limit``/``events_after``; the answer's
``alerts_next``/``events_next`` are the cursors of the next page).

Nothing here runs long on the event loop: the store reads in its reader thread, and the
answer is built and serialised in one render thread of its own, so a read storm costs the
webhook only the hand-offs.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Protocol

from aiohttp import web

from bot.config import Config
from bot.domain.labels import node_name
from bot.store.base import LIST_MAX, PAGE_DEFAULT, PAGE_MAX, BadCursor, Store
from bot.web import auth, views

_RENDER = web.AppKey("read-render", ThreadPoolExecutor)


class ReadDeps(Protocol):
    config: Config
    store: Store
    read_credentials: auth.Credentials
    admin_credentials: auth.Credentials


class BadParameter(ValueError):
    """A query parameter the reader got wrong; the message names it."""


def add_read_routes(app: web.Application, key: web.AppKey[Any]) -> None:
    app.router.add_get("/api/v1/incidents", _guarded(key, list_incidents))
    app.router.add_get("/api/v1/incidents/{incident_id}", _guarded(key, show_incident))
    app.cleanup_ctx.append(_render_thread)


async def _render_thread(app: web.Application) -> AsyncIterator[None]:
    app[_RENDER] = ThreadPoolExecutor(max_workers=1, thread_name_prefix="pitcrew-api-render")
    yield
    app[_RENDER].shutdown(wait=True)


Handler = Callable[[web.Request, ReadDeps], Any]


def _guarded(key: web.AppKey[Any], handler: Handler) -> Callable[[web.Request], Any]:
    async def guarded(request: web.Request) -> web.StreamResponse:
        deps: ReadDeps = request.app[key]
        denied = denied_read(request, deps)
        if denied is not None:
            return denied
        try:
            response: web.StreamResponse = await handler(request, deps)
        except (BadParameter, BadCursor) as exc:
            return web.json_response({"error": str(exc)}, status=400)
        return response

    return guarded


def denied_read(request: web.Request, deps: ReadDeps) -> web.Response | None:
    """``None`` when the request may read, else the 401/403 answer."""
    if deps.config.settings.server.auth.allow_unauthenticated_reads:
        return None
    accepted = [c for c in (deps.read_credentials, deps.admin_credentials) if c.required]
    if not accepted:
        return web.json_response(
            {"error": "read API disabled: set server.auth.read_token_file (or admin_token_file)"}, status=403
        )
    answers = [auth.check(request, credentials) for credentials in accepted]
    return None if any(answer is None for answer in answers) else answers[0]


def page_limit(request: web.Request, name: str) -> int:
    raw = request.query.get(name)
    if raw is None:
        return PAGE_DEFAULT
    if not raw.isdecimal() or not 1 <= int(raw) <= PAGE_MAX:
        raise BadParameter(f"{name} must be a whole number from 1 to {PAGE_MAX}, not {raw!r}")
    return int(raw)


def cursor(request: web.Request, name: str) -> str | None:
    raw = request.query.get(name)
    if raw is not None and not raw:
        raise BadParameter(f"{name} is empty: pass the cursor the page before gave, or leave it out")
    return raw


def encode(document: dict[str, Any]) -> bytes:
    """``document`` as JSON, its lists one item at a time.

    Same bytes as ``json.dumps``; but one ``json.dumps`` over a page of 1,000 alerts is one C call
    that holds the GIL for 15 ms, and the event loop (the webhook) waits that long for it. Item by
    item, each call is short and the loop gets the GIL back between them.
    """
    parts = []
    for key, value in document.items():
        text = "[" + ", ".join(map(json.dumps, value)) + "]" if isinstance(value, list) else json.dumps(value)
        parts.append(f"{json.dumps(key)}: {text}")
    return ("{" + ", ".join(parts) + "}").encode()


async def _render(request: web.Request, build: Callable[[], dict[str, Any]]) -> web.Response:
    """``build()`` and its JSON in the render thread; the answer."""

    def rendered() -> bytes:
        return encode(build())

    body = await asyncio.get_running_loop().run_in_executor(request.app[_RENDER], rendered)
    return web.Response(body=body, content_type="application/json")


async def list_incidents(request: web.Request, deps: ReadDeps) -> web.Response:
    active = request.query.get("active", "").lower() in {"1", "true", "yes"}
    try:
        limit = min(max(int(request.query.get("limit", "100")), 1), LIST_MAX)
    except ValueError:
        raise BadParameter("limit must be an integer") from None
    node = request.query.get("node")
    if node is not None:
        try:  # the same spelling rule as the webhook's: GPU-NODE-07 is gpu-node-07
            node = node_name(node.strip())
        except ValueError as exc:
            raise BadParameter(f"node {node!r} {exc}") from None
    records = await deps.store.incidents(active_only=active, node=node, limit=limit)
    return await _render(request, lambda: {"incidents": [views.incident_view(r) for r in records]})


async def show_incident(request: web.Request, deps: ReadDeps) -> web.Response:
    incident_id = request.match_info["incident_id"]
    alerts_limit, events_limit = page_limit(request, "alerts_limit"), page_limit(request, "events_limit")
    alerts_after, events_after = cursor(request, "alerts_after"), cursor(request, "events_after")
    incident = await deps.store.incident(incident_id)
    if incident is None:
        return web.json_response({"error": f"no incident {incident_id}"}, status=404)
    try:
        alerts = await deps.store.alerts_page(incident_id, limit=alerts_limit, after=alerts_after)
    except BadCursor as exc:
        raise BadParameter(f"alerts_after: {exc}") from None
    try:
        events = await deps.store.events_page(incident_id, limit=events_limit, after=events_after)
    except BadCursor as exc:
        raise BadParameter(f"events_after: {exc}") from None
    steps = await deps.store.steps_of(incident_id)
    approval = await deps.store.approval(incident_id)
    links = await deps.store.incident_links(incident_id)
    return await _render(
        request,
        lambda: views.incident_detail(
            incident,
            alerts.items,
            events.items,
            steps,
            approval,
            alerts_next=alerts.next,
            events_next=events.next,
            links=links,
        ),
    )
