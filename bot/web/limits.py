"""Connection limits of pitcrew's HTTP server: a cap, a short idle time for strangers, a quiet log.

Without them, idle connections nobody authenticated (a port scan, a slowloris, a misbehaving
client) each hold a file descriptor for aiohttp's whole keep-alive; once the process runs out
(1,024 by default) ``accept()`` fails, asyncio logs every failure with a traceback, and
Alertmanager's webhook waits in the kernel's backlog behind them.

``ConnectionGate`` sits between the listening socket and aiohttp (a protocol wrapper; aiohttp
sees an ordinary transport) and keeps:

* **a cap** — at most ``cap`` connections, kept well below the open-files limit. A connection
  arriving at the cap closes the longest-idle connection instead, strangers first (a peer that
  never sent a valid credential), then idle authenticated keep-alives; only when every one is
  in the middle of a request is the newcomer closed. So a flood of idle sockets cannot keep
  Alertmanager out.
* **a short idle time for strangers** — a connection that has not authenticated is closed once
  it has been idle (no request in progress) for ``stranger_idle`` seconds, however slowly it
  trickles header bytes; authenticated peers (Alertmanager, Prometheus with its token, the CLI)
  keep aiohttp's keep-alive.

``RateLimitFilter`` keeps a flood of identical error records (asyncio's "socket.accept() out of
system resource", aiohttp's "Error handling request") to one per interval, counting the rest.
"""

from __future__ import annotations

import asyncio
import logging
import resource
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from bot import logger

log = logger(__name__)

#: File descriptors kept for everything but client connections: the store, logs, the listening
#: socket, the far sides' connection pools, the connections accepted in one burst before the
#: gate closes them (asyncio accepts up to ``backlog`` at a time).
RESERVED_FDS = 256


def effective_cap(configured: int, open_files: int | None = None) -> int:
    """``configured``, lowered to what the open-files limit leaves for client connections."""
    if open_files is None:
        open_files = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    if open_files == resource.RLIM_INFINITY:
        return configured
    room = max(8, open_files - min(RESERVED_FDS, open_files // 2))
    return min(configured, room)


@dataclass(eq=False)
class _Connection:
    transport: asyncio.Transport
    idle_since: float
    busy: int = 0
    trusted: bool = False
    timer: asyncio.TimerHandle | None = field(default=None, repr=False)


class ConnectionGate:
    """Admits connections up to a cap and closes idle strangers; see the module docstring."""

    def __init__(self, cap: int, stranger_idle: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.cap = cap
        self.stranger_idle = stranger_idle
        self._clock = clock
        self._open: dict[asyncio.BaseTransport, _Connection] = {}  # insertion order: oldest first
        self.closed_at_cap = 0
        self.refused_at_cap = 0

    @property
    def open(self) -> int:
        return len(self._open)

    def factory(self, inner: Callable[[], asyncio.BaseProtocol]) -> Callable[[], asyncio.Protocol]:
        """Wrap aiohttp's protocol factory (``runner.server``)."""
        return lambda: _Gated(self, inner())

    # ------------------------------------------------------------ connections
    def admit(self, transport: asyncio.Transport) -> bool:
        """Whether a new connection may stay; at the cap, room is made first (or it is closed)."""
        if len(self._open) >= self.cap and not self._make_room():
            self.refused_at_cap += 1
            log.warning(
                "connection cap reached, every connection busy: closing a new one",
                extra={"cap": self.cap},
            )
            transport.abort()
            return False
        connection = _Connection(transport, self._clock())
        self._open[transport] = connection
        self._arm(connection)
        return True

    def _make_room(self) -> bool:
        """Close the longest-idle connection, strangers first; ``False`` when all are busy."""
        idle = [c for c in self._open.values() if c.busy == 0]
        if not idle:
            return False
        victim = min(idle, key=lambda c: (c.trusted, c.idle_since))
        self.closed_at_cap += 1
        log.warning(
            "connection cap reached: closing the longest-idle connection",
            extra={"cap": self.cap, "trusted": victim.trusted},
        )
        self.forget(victim.transport)
        victim.transport.abort()
        return True

    def forget(self, transport: asyncio.BaseTransport) -> None:
        connection = self._open.pop(transport, None)
        if connection is not None and connection.timer is not None:
            connection.timer.cancel()

    def _arm(self, connection: _Connection) -> None:
        """A stranger idle for ``stranger_idle`` seconds from now is closed."""
        if connection.trusted or connection.busy:
            return
        if connection.timer is not None:
            connection.timer.cancel()
        loop = asyncio.get_running_loop()
        connection.timer = loop.call_later(self.stranger_idle, self._expire, connection)

    def _expire(self, connection: _Connection) -> None:
        connection.timer = None
        if connection.trusted or connection.busy or connection.transport not in self._open:
            return
        left = connection.idle_since + self.stranger_idle - self._clock()
        if left > 0:
            connection.timer = asyncio.get_running_loop().call_later(left, self._expire, connection)
            return
        self.forget(connection.transport)
        connection.transport.close()

    # --------------------------------------------------------------- requests
    def middleware(self, trusted: Callable[[web.Request], bool]) -> Any:
        """Marks a connection busy while a request runs, and trusted once a request on it carried
        valid credentials (``trusted(request)``)."""

        @web.middleware
        async def track(request: web.Request, handler: Any) -> web.StreamResponse:
            connection = self._open.get(request.transport) if request.transport is not None else None
            if connection is None:
                response: web.StreamResponse = await handler(request)
                return response
            connection.busy += 1
            try:
                if not connection.trusted and trusted(request):
                    connection.trusted = True
                return await handler(request)  # type: ignore[no-any-return]
            finally:
                connection.busy -= 1
                connection.idle_since = self._clock()
                if connection.busy == 0:
                    self._arm(connection)

        return track


class _Gated(asyncio.Protocol):
    """aiohttp's protocol for one connection, admitted (or not) by the gate."""

    def __init__(self, gate: ConnectionGate, inner: asyncio.BaseProtocol) -> None:
        self._gate, self._inner = gate, inner
        self._admitted = False
        self._transport: asyncio.BaseTransport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self._transport = transport
        self._admitted = self._gate.admit(transport)
        if self._admitted:
            self._inner.connection_made(transport)

    def data_received(self, data: bytes) -> None:
        if self._admitted:
            self._inner.data_received(data)  # type: ignore[attr-defined]

    def eof_received(self) -> bool | None:
        return self._inner.eof_received() if self._admitted else None  # type: ignore[attr-defined]

    def connection_lost(self, exc: Exception | None) -> None:
        if self._admitted:
            self._admitted = False
            self._inner.connection_lost(exc)
        if self._transport is not None:
            self._gate.forget(self._transport)

    def pause_writing(self) -> None:
        self._inner.pause_writing()

    def resume_writing(self) -> None:
        self._inner.resume_writing()


class RateLimitFilter(logging.Filter):
    """One record per ``interval`` seconds for each message template; the next one let through
    says how many were dropped (``suppressed``)."""

    def __init__(self, interval: float = 10.0, clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__()
        self._interval, self._clock = interval, clock
        self._last: dict[tuple[str, str], float] = {}
        self._dropped: dict[tuple[str, str], int] = {}

    def filter(self, record: logging.LogRecord) -> bool:
        key = (record.name, str(record.msg))
        now = self._clock()
        last = self._last.get(key)
        if last is not None and now - last < self._interval:
            self._dropped[key] = self._dropped.get(key, 0) + 1
            return False
        self._last[key] = now
        dropped = self._dropped.pop(key, 0)
        if dropped:
            record.suppressed = dropped
        return True


def quiet(loggers: Iterable[str] = ("asyncio", "aiohttp.server"), interval: float = 10.0) -> None:
    """Rate-limit the loggers a connection flood makes talk (idempotent)."""
    for name in loggers:
        target = logging.getLogger(name)
        if not any(isinstance(f, RateLimitFilter) for f in target.filters):
            target.addFilter(RateLimitFilter(interval))


log.addFilter(RateLimitFilter())  # a flood at the cap says so every ten seconds, not per socket
