"""Running the app until SIGINT/SIGTERM: aiohttp's ``AppRunner`` behind the ``ConnectionGate``.

What ``web.run_app`` does (a signal, then the runner's graceful shutdown and the app's cleanup),
with two differences: the listening socket hands connections to the gate (``bot.web.limits``),
which wraps aiohttp's protocol factory — ``run_app`` has no place for one; and a signal only sets
an event. aiohttp's own handlers raise ``GracefulExit`` out of the event loop, and ``asyncio.run``
then cancels every task at once, the store's writer and pool among them, while the cleanup still
needs them (the leader's last act, releasing its lease, is a write).
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
from collections.abc import Callable

from aiohttp import web

from bot import logger
from bot.web.limits import ConnectionGate

log = logger(__name__)

#: Set to stop the service (as a signal does), by what runs in it: a store found, once reached, that
#: must not be opened (``bot.web.app``).
STOP = web.AppKey("stop", asyncio.Event)

#: Idle keep-alive of authenticated peers (aiohttp's ``run_app`` default); strangers get the
#: gate's much shorter ``stranger_idle``.
KEEPALIVE = 75.0


class GatedSite(web.BaseSite):
    """A TCP site whose connections go through ``gate`` before aiohttp sees them."""

    __slots__ = ("_gate", "_host", "_port")

    def __init__(self, runner: web.BaseRunner, host: str, port: int, gate: ConnectionGate) -> None:
        super().__init__(runner, backlog=128)
        self._host, self._port, self._gate = host, port, gate

    @property
    def name(self) -> str:
        return f"http://{self._host}:{self._port}"

    async def start(self) -> None:
        await super().start()
        server = self._runner.server
        assert server is not None
        self._server = await asyncio.get_running_loop().create_server(
            self._gate.factory(server), self._host, self._port, backlog=self._backlog, reuse_address=True
        )


def run(
    app: web.Application,
    host: str,
    port: int,
    gate: ConnectionGate,
    *,
    shutdown_timeout: float,
    delay: float = 0.0,
    stopping: Callable[[], None] = lambda: None,
) -> None:
    """Serve ``app`` on ``host:port`` until a signal, or ``app[STOP]`` is set; then shut down
    gracefully. After SIGTERM, go on serving for ``delay`` seconds first, ``stopping`` called at
    once (``/readyz`` says so): a terminating pod is taken out of its Service's endpoints as the
    signal is sent, and every kube-proxy, ingress controller and load balancer goes on sending to
    it until it has heard. SIGINT, or a second signal, stops at once."""
    stop = app[STOP] = asyncio.Event()

    async def main() -> None:
        loop = asyncio.get_running_loop()
        draining: list[asyncio.TimerHandle] = []

        def terminate() -> None:
            if delay <= 0 or draining:
                stop.set()
                return
            stopping()
            log.info("stopping: SIGTERM received; serving on meanwhile", extra={"delay_s": delay})
            draining.append(loop.call_later(delay, stop.set))

        loop.add_signal_handler(signal.SIGINT, stop.set)
        loop.add_signal_handler(signal.SIGTERM, terminate)
        runner = web.AppRunner(
            app, handle_signals=False, keepalive_timeout=KEEPALIVE, shutdown_timeout=shutdown_timeout
        )
        await runner.setup()
        try:
            await GatedSite(runner, host, port, gate).start()
            log.info(
                "listening",
                extra={
                    "listen": f"{host}:{port}",
                    "max_connections": gate.cap,
                    "stranger_idle": gate.stranger_idle,
                },
            )
            await stop.wait()  # until SIGINT/SIGTERM (and the delay after SIGTERM), or STOP
            log.info("stopping")
        finally:
            for handle in draining:
                handle.cancel()
            await runner.cleanup()
            for signum in (signal.SIGINT, signal.SIGTERM):
                loop.remove_signal_handler(signum)

    with contextlib.suppress(web.GracefulExit, KeyboardInterrupt):
        asyncio.run(main())
