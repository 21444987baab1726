"""The node-exporter stand-in's HTTP side: one listener per node (one Prometheus target each).

Serves ``GET /metrics`` per node from the dcgm stand-in's ``ServerThread`` (a background thread
with its own loop, so blocking test code never starves it). Faults are injected in process, on
``Standin.node(name)``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from aiohttp import web

from proving_ground.dcgm.server import NodeServers
from proving_ground.nodeexporter.node import Node


def node_app(node: Node) -> web.Application:
    async def metrics(_: web.Request) -> web.Response:
        # promhttp answers the text format 0.0.4 to a scraper that does not ask for protobuf.
        return web.Response(
            text=node.render(), headers={"Content-Type": "text/plain; version=0.0.4; charset=utf-8"}
        )

    app = web.Application()
    app.add_routes([web.get("/metrics", metrics)])
    return app


class Standin(NodeServers[Node]):
    """Several nodes, one listener each, like node-exporter's DaemonSet."""

    def __init__(
        self, nodes: Sequence[str], *, host: str = "127.0.0.1", ports: Sequence[int] = (), **node_options: Any
    ) -> None:
        super().__init__({name: Node(name, **node_options) for name in nodes}, node_app, host, ports)
