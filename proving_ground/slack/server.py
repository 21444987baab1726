"""Starts and stops the Slack stand-in on a free loopback port; one per test, nothing left running.

``SlackStandin.base_url`` is what a test gives ``AsyncWebClient(base_url=...)``. The Socket Mode
endpoint is served by the same server (``/link/``), as Slack serves it behind apps.connections.open.
With ``interactivity`` set (the app's request URL and signing secret), ``POST /demo/click`` is a
person clicking a button (``proving_ground.slack.clicks``).
"""

from __future__ import annotations

from aiohttp import web

from proving_ground.slack.clicks import Interactivity, handle_click
from proving_ground.slack.methods import METHODS
from proving_ground.slack.responses import Responses
from proving_ground.slack.socket_mode import SocketModeEndpoint
from proving_ground.slack.webapi import WebApi
from proving_ground.slack.world import World


class SlackStandin:
    def __init__(self, world: World | None = None, *, host: str = "127.0.0.1") -> None:
        self.host = host  # loopback unless a test's private network needs another address
        self.world = world or World()
        self.api = WebApi(self.world)
        self.api.methods.update(METHODS)
        self.socket = SocketModeEndpoint(self.world, lambda: f"ws://{self.host}:{self.port}")
        self.api.methods["apps.connections.open"] = self.socket.open
        self.responses = Responses(self.api)
        self.api.response_url = self.response_url
        self._runner: web.AppRunner | None = None
        self.port = 0
        #: Where clicks go (HTTP mode): set once the app's request URL is known.
        self.interactivity: Interactivity | None = None

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}/api/"

    def response_url(self, user: str, channel: str, kind: str = "commands") -> str:
        """A response_url Slack would put in a command (or, ``kind="actions"``, a click) by ``user``."""
        return self.responses.mint(f"http://{self.host}:{self.port}", kind, user, channel)

    @property
    def click_url(self) -> str:
        return f"http://{self.host}:{self.port}/demo/click"

    def app(self) -> web.Application:
        app = self.api.app()
        app.router.add_get("/link/", self.socket.handle)
        app.router.add_post("/demo/click", self._click)
        app.router.add_post("/{kind:commands|actions}/{key:.+}", self.responses.handle)
        return app

    async def _click(self, request: web.Request) -> web.Response:
        return await handle_click(self.interactivity, request)

    async def start(self) -> SlackStandin:
        self._runner = web.AppRunner(self.app(), shutdown_timeout=1.0)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.host, 0)
        await site.start()
        server = site._server
        assert server is not None
        self.port = server.sockets[0].getsockname()[1]  # type: ignore[attr-defined]
        return self

    async def stop(self) -> None:
        if self._runner is not None:
            await self.socket.close_all()
            await self._runner.cleanup()
            self._runner = None
