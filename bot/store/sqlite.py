"""SQLite implementation of the incident store port (WAL, versioned schema, group commit).

Writes go through one ``Writer`` (``bot.store.writer``): whole transactions in one worker
thread, many per commit, acknowledged only once committed. Reads go through one ``Reader``
(``bot.store.reader``): the query and the decoding of its rows in a reader thread with its
own connection, so that no read, however large, holds up the event loop (and the webhooks it
answers); in WAL mode the reader never waits for the writer. Repeat deliveries Alertmanager makes of groups it
already sent are counted in memory and flushed every second; reads include what is not
flushed yet — but only while the database file is the one the writer opened, or a restart
would not know those alerts. Readiness (``ping``) is the writer's word on whether writes commit.

The queries and the port's methods are ``bot.store.sqlstore`` and ``bot.store.queries``, the
same as Postgres's; this module is only how they run here (``bot.store.sql.run_sync`` in the
writer's or the reader's thread) and the paths only SQLite has (the in-memory repeat counters).

Several processes may open one file: SQLite's write lock (``BEGIN IMMEDIATE``) serialises their
transactions, and the leadership lease (``bot.store.lease``) decides which of them acts. The
lease's times are the machine's clock read by SQLite (the dialect's ``{now}``), the same for every
process.
"""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
from collections.abc import Callable, Sequence
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from bot.domain.alerts import AlertStatus
from bot.store import retention
from bot.store.base import AlertRecord, Delivery, IngestOutcome, Inspection, StoreUnavailable
from bot.store.batch import ENGINE_WRITES
from bot.store.mounts import MOUNTINFO
from bot.store.reader import Reader
from bot.store.sql import SQLITE, Op, T, run_sync
from bot.store.sqlstore import SqlStore
from bot.store.writer import Bulk, IngestJob, Redoable, Writer


class SqliteStore(SqlStore):
    dialect = SQLITE
    _prune_budget = retention.SHARED_BUDGET  # a prune shares the one writer with the deliveries
    _prune_start = retention.MIN_BATCH  # and runs on the loop: its first transaction is small too

    def __init__(
        self,
        path: Path,
        *,
        synchronous: str = "full",
        units_per_batch: int = ENGINE_WRITES,
        clock: Callable[[], datetime] | None = None,
        retention: timedelta | None = None,
        network_filesystem: bool = False,
        mount_table: Path = MOUNTINFO,
    ) -> None:
        """``network_filesystem``: the file may be on one, refused otherwise (``bot.store.mounts``:
        ``SharedFilesystem`` at ``open``); ``mount_table``: where the mounts are read (the kernel's)."""
        super().__init__(clock)
        self.path = path
        self._writer = Writer(
            path,
            synchronous=synchronous,
            units_per_batch=units_per_batch,
            retention=retention,
            network_filesystem=network_filesystem,
            mount_table=mount_table,
        )
        self._reader = Reader(path)

    async def inspect(self) -> Inspection:
        """What ``check-config --live`` reports, the store not opened (``Writer.inspection``)."""
        return await asyncio.get_running_loop().run_in_executor(None, self._writer.inspection)

    async def open(self) -> None:
        await self._writer.open()  # creates and migrates the database
        await self._reader.open()

    async def close(self) -> None:
        try:
            await self._writer.close()
        finally:
            await self._reader.close()

    async def ping(self) -> bool:
        """Ready for writes: readable, and the writer says its writes commit where a restart finds
        them (``Writer.ready``: files in place, writable, room left, the last write succeeded)."""
        try:
            await self._reader.run(lambda db: db.execute("SELECT 1").fetchall())
        except Exception:  # readiness probes report, they do not raise
            return False
        return await self._writer.ready()

    def describe(self) -> dict[str, Any]:
        return {"kind": "sqlite", "synchronous": self._writer.synchronous}

    # ------------------------------------------------------------------ drivers
    async def _read(self, op: Op[T]) -> T:
        """The whole read, query and decoding, in the reader thread."""
        return await self._reader.run(lambda db: run_sync(db, op).result)

    async def _transact(self, make: Callable[[], Op[T]]) -> tuple[T, bool]:
        """In the writer's transaction: ``BEGIN IMMEDIATE`` holds the database's write lock from
        the fence's check to the commit, so no other process can take the lease over in between."""
        result: tuple[T, bool] = await self._writer.submit(_unit(make))
        return result

    async def _bulk_transact(self, make: Callable[[], Op[T]]) -> tuple[T, bool]:
        """As ``_transact``, in the writer thread (``Bulk``): its statements may take long."""
        result: tuple[T, bool] = await self._writer.submit(Bulk(_unit(make)))
        return result

    async def _prune_transact(self, make: Callable[[], Op[T]]) -> tuple[T, bool]:
        """On the loop as an engine write, committed without an fsync of its own (``Redoable``: a
        prune lost in a power cut is done again by the next): a delivery that comes while one runs
        waits for its bounded deletes, not for the disk nor for a thread's turns."""
        result: tuple[T, bool] = await self._writer.submit(Redoable(_unit(make)))
        return result

    async def _lease_write(self, make: Callable[[], Op[T]]) -> T:
        value: T = await self._writer.submit(lambda db: run_sync(db, make()).result)
        return value

    async def _turn(self) -> None:
        """Until the writes queued before it have committed (at most ``retention.YIELD``)."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(retention.YIELD):
                await self._writer.drained()

    def _pruned(self, done: retention.Pruned) -> None:
        self._writer.memory.forget(done.keys)  # a pruned alert delivered again is new, not a repeat

    def _alert(self, alert: AlertRecord) -> AlertRecord:
        """Include repeat deliveries counted in memory and not yet committed."""
        return self._writer.memory.overlay(alert)

    # ------------------------------------------------------------------ ingest
    async def ingest(self, delivery: Delivery, now: datetime) -> IngestOutcome:
        repeats = await self.count_repeats(
            [(a.fingerprint, a.starts_at, a.status) for a in delivery.alerts], now
        )
        if repeats is not None:
            return IngestOutcome(repeated_alerts=repeats)
        result: IngestOutcome = await self._writer.submit(IngestJob(delivery, now))
        self._writer.memory.remember(result.cache)  # committed: safe to remember
        return result

    async def count_repeats(
        self, alerts: Sequence[tuple[str, datetime, AlertStatus]], now: datetime
    ) -> int | None:
        """If every alert is already stored in the same status, count the delivery and return how many
        alerts it had; else ``None`` and nothing is counted (the caller ingests it in full). Answered
        from memory, without waiting: committed keys are cached, the counts flushed every second."""
        if not self._writer.running:
            raise StoreUnavailable("store is not open")
        lost = self._writer.lost()  # the keys we remember were committed to that file
        if lost is not None:
            raise StoreUnavailable(f"{lost}: a restart would not find what this delivery stores")
        return self._writer.memory.count(alerts, now)


def _unit(make: Callable[[], Op[T]]) -> Callable[[sqlite3.Connection], tuple[T, bool]]:
    """The writer's unit for an operation and whether it woke anyone (``Driven.wakes``)."""

    def unit(db: sqlite3.Connection) -> tuple[T, bool]:
        driven = run_sync(db, make())  # made afresh each time the writer runs the unit
        return driven.result, driven.wakes

    return unit
