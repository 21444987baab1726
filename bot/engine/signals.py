"""Wake-ups for waiting incidents (an approval decided, an alert resolved, a pause lifted), and
the engine's one source of waiting: a ``Timer``, real in production and fake in tests.

Waits end on a signal or after a bounded time, so a missed signal only delays, never
strands, an incident.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from typing import Protocol

#: Waits that a signal ends (approvals, watching, pause) still look again this often.
RECHECK = 30.0


class Timer(Protocol):
    """How the engine waits: every sleep and every bounded wait goes through one of these."""

    async def sleep(self, seconds: float) -> None: ...

    async def wait(self, event: asyncio.Event, limit: float) -> bool:
        """Until ``event`` is set (True) or ``limit`` seconds pass (False)."""
        ...


class RealTimer:
    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)

    async def wait(self, event: asyncio.Event, limit: float) -> bool:
        # Not ``asyncio.wait_for``: on Python 3.11 it returns the result when the waiting task is
        # cancelled in the loop iteration that sets the event (CPython gh-86296), so a worker stopped
        # just as it was woken goes on as if never stopped, and whoever stops it waits for ever.
        try:
            async with asyncio.timeout(limit):
                await event.wait()
        except TimeoutError:
            return False
        return True


class Signals:
    def __init__(self, timer: Timer | None = None) -> None:
        self._events: dict[str, asyncio.Event] = {}
        self._timer = timer or RealTimer()

    def signal(self, incident_id: str) -> None:
        self._events.setdefault(incident_id, asyncio.Event()).set()

    def signal_all(self) -> None:
        for event in self._events.values():
            event.set()

    async def wait(self, incident_id: str, limit: float | None) -> None:
        """Sleep until signalled or ``limit`` seconds pass (at most ``RECHECK``)."""
        event = self._events.setdefault(incident_id, asyncio.Event())
        await self._timer.wait(event, max(min(limit or RECHECK, RECHECK), 0.001))
        event.clear()

    def forget(self, keep: Iterable[str]) -> None:
        """Drop the events of incidents no longer alive."""
        alive = set(keep)
        for incident_id in [i for i in self._events if i not in alive]:
            self._events.pop(incident_id)
