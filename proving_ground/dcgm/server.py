"""The stand-in's HTTP side: one listener per node (one Prometheus target each), in a background thread.

Owns ``/metrics``, ``/state``, ``/inject`` and ``/clear`` per node, and ``ServerThread``, which serves
aiohttp applications from a thread with its own event loop so blocking test code (polling,
subprocess waits) never starves them; the tests' webhook sink reuses it.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Sequence
from typing import Any, Generic, Self, TypeVar

from aiohttp import web

from proving_ground.dcgm.node import Node

N = TypeVar("N")


def node_app(node: Node) -> web.Application:
    """The HTTP face of one node: what Prometheus scrapes and what tests and the demo poke."""

    async def metrics(_: web.Request) -> web.Response:
        if node.http_500:
            return web.Response(status=500, text="injected exporter failure\n")
        return web.Response(text=node.render(), content_type="text/plain", charset="utf-8")

    async def inject(request: web.Request) -> web.Response:
        body = await request.json()
        try:
            node.inject(body.pop("fault", "xid"), **body)
        except (ValueError, KeyError, IndexError, TypeError) as exc:
            return web.json_response({"error": str(exc)}, status=400)
        return web.json_response(node.state())

    async def clear(request: web.Request) -> web.Response:
        body = await request.json() if request.can_read_body else {}
        node.clear(body.get("gpu"))
        return web.json_response(node.state())

    async def state(_: web.Request) -> web.Response:
        return web.json_response(node.state())

    app = web.Application()
    app.add_routes(
        [
            web.get("/metrics", metrics),
            web.get("/state", state),
            web.post("/inject", inject),
            web.post("/clear", clear),
        ]
    )
    return app


class ServerThread:
    """aiohttp applications on loopback, served by a daemon thread with its own event loop."""

    def __init__(self, apps: Sequence[web.Application], host: str = "127.0.0.1", ports: Sequence[int] = ()):
        self._apps, self._host, self._ports = list(apps), host, list(ports) or [0] * len(apps)
        self.addresses: list[str] = []
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="standin-http", daemon=True)

    def start(self, timeout: float = 15.0) -> ServerThread:
        self._thread.start()
        if not self._ready.wait(timeout) or self._error:
            raise RuntimeError(f"stand-in servers did not start: {self._error!r}")
        return self

    def stop(self) -> None:
        if self._thread.is_alive():
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=15)

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        runners: list[web.AppRunner] = []
        try:
            for app, port in zip(self._apps, self._ports, strict=True):
                runner = web.AppRunner(app, access_log=None)
                self._loop.run_until_complete(runner.setup())
                runners.append(runner)
                self._loop.run_until_complete(web.TCPSite(runner, self._host, port).start())
                host, bound = runner.addresses[0][:2]
                self.addresses.append(f"{host}:{bound}")
        except BaseException as exc:  # reported to start(), which raises it in the caller's thread
            self._error = exc
        self._ready.set()
        if self._error is None:
            self._loop.run_forever()
        for runner in runners:
            self._loop.run_until_complete(runner.cleanup())
        self._loop.close()


class NodeServers(Generic[N]):
    """Nodes of a stand-in, one listener each (one Prometheus target per node, like one exporter pod
    per node): the dcgm-exporter and node-exporter stand-ins differ only in their nodes and app."""

    def __init__(
        self, nodes: dict[str, N], app: Callable[[N], web.Application], host: str, ports: Sequence[int]
    ) -> None:
        self.nodes = nodes
        self._server = ServerThread([app(n) for n in nodes.values()], host, ports)

    def node(self, name: str) -> N:
        return self.nodes[name]

    def address(self, name: str) -> str:
        return self._server.addresses[list(self.nodes).index(name)]

    def start(self) -> Self:
        self._server.start()
        return self

    def stop(self) -> None:
        self._server.stop()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *_: object) -> None:
        self.stop()


class Standin(NodeServers[Node]):
    """Several dcgm-exporter nodes, one listener each."""

    def __init__(
        self, nodes: Sequence[str], *, host: str = "127.0.0.1", ports: Sequence[int] = (), **node_options: Any
    ) -> None:
        super().__init__({name: Node(name, **node_options) for name in nodes}, node_app, host, ports)
