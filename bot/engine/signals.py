"""Wake-ups for waiting incidents (an approval decided, an alert resolved, a pause lifted), and
the engine's one source of waiting: a ``Timer``, real in production and fake in tests.

Waits end on a signal or after a bounded time, so a missed signal only delays, never
strands, an incident. That bound is spread per incident (``recheck_after``): incidents opened
together in a storm would otherwise all look again in the same instant, a burst of store reads
every ``RECHECK`` seconds that lands on the webhook's tail latency.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Callable, Iterable
from typing import Protocol

#: Waits that a signal ends (approvals, watching, pause) still look again at least this often.
RECHECK = 30.0
#: The share of ``RECHECK`` over which the incidents' re-checks are spread: each incident looks
#: again after between ``(1 - RECHECK_SPREAD) * RECHECK`` and ``RECHECK`` seconds.
RECHECK_SPREAD = 0.5


def recheck_after(incident_id: str) -> float:
    """How long this incident's waits last at most: ``RECHECK`` less a share of
    ``RECHECK_SPREAD`` fixed by its id (the same in every run and on every replica, so fake-time
    tests stay deterministic; different periods keep incidents woken together apart afterwards)."""
    digest = hashlib.blake2b(incident_id.encode(), digest_size=8).digest()
    share = int.from_bytes(digest, "big") / 2**64  # in [0, 1)
    return RECHECK * (1.0 - RECHECK_SPREAD * share)


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
    def __init__(self, timer: Timer | None = None, recheck: Callable[[str], float] = recheck_after) -> None:
        """``recheck``: an incident's bound on a wait (``recheck_after``; at most ``RECHECK``)."""
        self._events: dict[str, asyncio.Event] = {}
        #: Incidents whose flow watches for its fault to come back (``watch_returns``).
        self._returns: set[str] = set()
        self._timer = timer or RealTimer()
        self._recheck = recheck

    def signal(self, incident_id: str) -> None:
        self._events.setdefault(incident_id, asyncio.Event()).set()

    def signal_all(self) -> None:
        for event in self._events.values():
            event.set()

    def watch_returns(self, incident_id: str, watching: bool) -> None:
        """Whether this incident's flow watches for its fault to come back after the node's return
        (``bot.engine.returned``): only then does a new occurrence of its fault signal it."""
        if watching:
            self._returns.add(incident_id)
        else:
            self._returns.discard(incident_id)

    def fault_again(self, incident_id: str) -> None:
        """A new occurrence of a fault the incident has (``IngestOutcome.recurred``): the signal of
        a flow that watches for its return, nothing to any other flow, which would read its
        incident again and find nothing to do. On a fleet in steady state most deliveries that
        store something are such occurrences, one per repeat of an alert with a new ``startsAt``."""
        if incident_id in self._returns:
            self.signal(incident_id)

    async def wait(self, incident_id: str, limit: float | None) -> None:
        """Sleep until signalled or ``limit`` seconds pass, at most the incident's re-check bound
        (``recheck_after``): a shorter ``limit`` is kept as asked, never spread."""
        event = self._events.setdefault(incident_id, asyncio.Event())
        await self._timer.wait(event, self.limit(incident_id, limit))
        event.clear()

    def limit(self, incident_id: str, limit: float | None) -> float:
        """How long ``wait`` waits without a signal."""
        bound = min(self._recheck(incident_id), RECHECK)
        return max(min(limit or bound, bound), 0.001)

    def forget(self, keep: Iterable[str]) -> None:
        """Drop the events of incidents no longer alive."""
        alive = set(keep)
        for incident_id in [i for i in self._events if i not in alive]:
            self._events.pop(incident_id)
        self._returns &= alive
