"""A Grafana HTTP API stand-in: the annotation endpoints pitcrew calls, with faults on demand.

Shapes follow Grafana's HTTP API (``/api/annotations``, ``/api/health``): ``POST`` answers
``{"message": "Annotation added", "id": N}``, ``PATCH /api/annotations/{id}`` answers
``{"message": "Annotation patched"}`` (``timeEnd``, ``text``, ``tags``), ``GET /api/annotations``
lists those carrying every ``tags`` given (as Grafana does without ``matchAny``), a missing or
unknown bearer token is ``401``, a token without the permission ``403``. ``fail(status, times)``
answers the next calls with an error; ``stop()``/``start()`` make it unreachable and back on the
same port, which it holds in between (bound, not listening: a connection is refused, and no other
test's server started meanwhile takes the port and the calls meant for Grafana); ``on_create`` runs once an annotation is stored, before the answer (a test kills
pitcrew there: Grafana has it, pitcrew never hears).
"""

from __future__ import annotations

import socket
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

TOKEN = "glsa_pitcrew_standin_token"
READ_ONLY = "glsa_read_only_token"


@dataclass
class Annotation:
    id: int
    time: int
    tags: list[str]
    text: str
    dashboard_uid: str | None = None
    time_end: int | None = None


@dataclass
class GrafanaWorld:
    annotations: dict[int, Annotation] = field(default_factory=dict)
    #: Every request seen: (method, path, status).
    requests: list[tuple[str, str, int]] = field(default_factory=list)
    failures: list[int] = field(default_factory=list)
    on_create: Callable[[Annotation], None] | None = None


class GrafanaStandin:
    def __init__(self, world: GrafanaWorld | None = None) -> None:
        self.world = world or GrafanaWorld()
        self._runner: web.AppRunner | None = None
        self._held: socket.socket | None = None  # the port, while stopped
        self.port = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def fail(self, status: int, times: int = 1) -> None:
        self.world.failures.extend([status] * times)

    def app(self) -> web.Application:
        app = web.Application(middlewares=[self._record])
        app.router.add_get("/api/health", self._health)
        app.router.add_get("/api/annotations", self._list)
        app.router.add_post("/api/annotations", self._create)
        app.router.add_patch("/api/annotations/{id}", self._patch)
        return app

    async def start(self) -> GrafanaStandin:
        self.release()
        self._runner = web.AppRunner(self.app(), shutdown_timeout=0.5)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", self.port, reuse_address=True)
        await site.start()
        server = site._server
        assert server is not None
        self.port = server.sockets[0].getsockname()[1]  # type: ignore[attr-defined]
        return self

    async def stop(self) -> None:
        """Unreachable until ``start``: the port is kept, bound without listening."""
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
            held = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            held.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            held.bind(("127.0.0.1", self.port))
            self._held = held

    def release(self) -> None:
        """Let go of the port held while stopped (``start`` does; so does the fixture at the end)."""
        if self._held is not None:
            self._held.close()
            self._held = None

    # ------------------------------------------------------------------ handlers
    @web.middleware
    async def _record(self, request: web.Request, handler: Any) -> web.StreamResponse:
        if self.world.failures:
            status = self.world.failures.pop(0)
            response: web.StreamResponse = web.json_response({"message": "injected failure"}, status=status)
        else:
            response = await handler(request)
        self.world.requests.append((request.method, request.path, response.status))
        return response

    def _denied(self, request: web.Request, permission: str) -> web.Response | None:
        token = request.headers.get("Authorization", "").removeprefix("Bearer ")
        if token not in {TOKEN, READ_ONLY}:
            return web.json_response({"message": "Unauthorized"}, status=401)
        if token == READ_ONLY and permission != "annotations:read":
            return web.json_response(
                {
                    "message": f"You'll need additional permissions to perform this action. Permissions needed: {permission}"
                },
                status=403,
            )
        return None

    async def _health(self, request: web.Request) -> web.Response:
        return web.json_response({"commit": "standin", "database": "ok", "version": "11.3.0"})

    async def _list(self, request: web.Request) -> web.Response:
        if denied := self._denied(request, "annotations:read"):
            return denied
        tags = request.query.getall("tags", [])
        found = [a for a in self.world.annotations.values() if all(t in a.tags for t in tags)]
        return web.json_response(
            [
                {"id": a.id, "time": a.time, "timeEnd": a.time_end or a.time, "tags": a.tags, "text": a.text}
                for a in found[: int(request.query.get("limit", "100"))]
            ]
        )

    async def _create(self, request: web.Request) -> web.Response:
        if denied := self._denied(request, "annotations:create"):
            return denied
        body = await request.json()
        if not isinstance(body, dict) or not isinstance(body.get("text"), str) or not body["text"]:
            return web.json_response({"message": "text field should not be empty"}, status=400)
        annotation = Annotation(
            id=len(self.world.annotations) + 1,
            time=int(body.get("time") or 0),
            tags=[str(t) for t in body.get("tags") or []],
            text=body["text"],
            dashboard_uid=body.get("dashboardUID"),
            time_end=int(body["timeEnd"]) if body.get("timeEnd") else None,
        )
        self.world.annotations[annotation.id] = annotation
        if self.world.on_create is not None:
            self.world.on_create(annotation)
        return web.json_response({"message": "Annotation added", "id": annotation.id})

    async def _patch(self, request: web.Request) -> web.Response:
        if denied := self._denied(request, "annotations:write"):
            return denied
        annotation = self.world.annotations.get(int(request.match_info["id"]))
        if annotation is None:
            return web.json_response({"message": "Could not find annotation to update"}, status=404)
        body = await request.json()
        if "timeEnd" in body:
            annotation.time_end = int(body["timeEnd"])
        if "text" in body:
            annotation.text = str(body["text"])
        if "tags" in body:
            annotation.tags = [str(t) for t in body["tags"]]
        return web.json_response({"message": "Annotation patched"})
