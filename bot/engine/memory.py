"""What one of pitcrew's own alert sources remembers between its looks, kept in the store.

The Slurm watch remembers the jobs on every busy node in service, the hung-job watch each job's
progress and since when it stood still: held in this process for its looks, and written to the
store (``Store.remember``, fenced like every engine write) as it changes, so a restart or a new
leader picks up where the last look left off. Loaded once, at the first look of the process that
leads; written only where an entry changed, so a quiet fleet costs no write.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Generic, TypeVar

from bot.store import codec
from bot.store.base import JsonObject, Store

T = TypeVar("T")


class Memory(Generic[T]):
    """The entries of one watch (``watch``, the store's key), each a record of type ``kind``."""

    def __init__(self, store: Store, watch: str, kind: type[T]) -> None:
        self._store, self._watch, self._kind = store, watch, kind
        self._saved: dict[str, T] | None = None

    async def load(self) -> dict[str, T]:
        """What the store holds (read once: later looks keep their own copy up to date)."""
        if self._saved is None:
            stored = await self._store.memory(self._watch)
            self._saved = {key: codec.decode_record(self._kind, value) for key, value in stored.items()}
        return dict(self._saved)

    async def save(self, current: Mapping[str, T], now: datetime) -> None:
        """Write the entries that differ from the last write, and forget those no longer held."""
        saved = self._saved if self._saved is not None else {}
        changed: dict[str, JsonObject | None] = {
            key: codec.encode_record(value) for key, value in current.items() if saved.get(key) != value
        }
        changed.update({key: None for key in saved if key not in current})
        await self._store.remember(self._watch, changed, now)
        self._saved = dict(current)
