"""Wake-ups for waiting incidents: an approval decided, an alert resolved, a pause lifted.

Waits end on a signal or after a bounded time, so a missed signal only delays, never
strands, an incident.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterable

#: Waits that a signal ends (approvals, watching, pause) still look again this often.
RECHECK = 30.0


class Signals:
    def __init__(self) -> None:
        self._events: dict[str, asyncio.Event] = {}

    def signal(self, incident_id: str) -> None:
        self._events.setdefault(incident_id, asyncio.Event()).set()

    def signal_all(self) -> None:
        for event in self._events.values():
            event.set()

    async def wait(self, incident_id: str, limit: float | None) -> None:
        """Sleep until signalled or ``limit`` seconds pass (at most ``RECHECK``)."""
        event = self._events.setdefault(incident_id, asyncio.Event())
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(event.wait(), timeout=max(min(limit or RECHECK, RECHECK), 0.001))
        event.clear()

    def forget(self, keep: Iterable[str]) -> None:
        """Drop the events of incidents no longer alive."""
        alive = set(keep)
        for incident_id in [i for i in self._events if i not in alive]:
            self._events.pop(incident_id)
