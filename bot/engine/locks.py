"""Per-incident serialisation: commands with each other, and commands with the engine's work.

Two locks per incident. The **command slot** admits one human command (approve, reject,
rollback) at a time: a second one arriving while the first is carried out is refused as a
conflict, never queued behind it to act on a situation its sender did not see. The **work
lock** is held by the executor around every call a step makes to a far side, and by a
rollback while it undoes: the rollback first stops the incident's worker (cancelling a call
in flight), then takes the lock, so no step call of the incident runs beside an undo.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Iterator
from contextlib import contextmanager


class IncidentLocks:
    def __init__(self) -> None:
        self._work: dict[str, asyncio.Lock] = {}
        self._commands: set[str] = set()

    def work(self, incident_id: str) -> asyncio.Lock:
        return self._work.setdefault(incident_id, asyncio.Lock())

    @contextmanager
    def command(self, incident_id: str) -> Iterator[bool]:
        """``True`` inside when this command holds the incident's slot, ``False`` when another does."""
        if incident_id in self._commands:
            yield False
            return
        self._commands.add(incident_id)
        try:
            yield True
        finally:
            self._commands.discard(incident_id)

    def forget(self, keep: Iterable[str]) -> None:
        """Drop the locks of incidents no longer alive (and not locked)."""
        alive = set(keep) | self._commands
        for incident_id in [i for i, lock in self._work.items() if i not in alive and not lock.locked()]:
            self._work.pop(incident_id)
