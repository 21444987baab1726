"""The store's one writer: whole transactions run in one worker thread, many units per commit.

Why a worker thread of our own and not statement-by-statement through an async driver: a
delivery's transaction is half a dozen statements, and issued one at a time through an
async bridge each had to wait for the event loop to come round again — under load (the loop
busy answering Alertmanager's redeliveries) a new alert then waited tens of milliseconds.
Here the event loop hands a batch to the thread once and gets every result back once.

Units queue up; the writer takes every delivery waiting plus a few engine writes, runs them
in one transaction and commits once (group commit: callers hear back only after the
commit, so an alert answered with 200 is on disk). If a unit fails, the batch is rolled
back and each unit is run alone, so one bad unit fails only itself. Repeat-delivery counters
are flushed on their own clock, never inside a delivery's transaction. WAL checkpoints run
on a separate (aiosqlite) connection beside the writer, never inside a commit.

A commit is acknowledged only if the database file (and its WAL) at the configured path is
still the file the writer opened: SQLite keeps writing through its open descriptors into a
file that was deleted, moved or replaced, and a restart would not find what it was told.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import sqlite3
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import aiosqlite

from bot.store.base import Delivery, StoreUnavailable
from bot.store.ingest import KeyState, bump_seen, ingest
from bot.store.schema import MIGRATIONS, SCHEMA_VERSION

log = logging.getLogger(__name__)
_CHECKPOINT_EVERY = 2.0  # seconds between WAL checkpoints
_FLUSH_EVERY = 1.0  # seconds: repeat-delivery counters reach the disk at least this often

Unit = Callable[[sqlite3.Connection], Any]
Key = tuple[str, str]


@dataclass(frozen=True, slots=True)
class IngestJob:
    """One webhook delivery to persist; the deliveries of a batch are ingested together."""

    delivery: Delivery
    now: datetime


Outcome = tuple[bool, Any]  # (ok, value or exception)


class Writer:
    def __init__(self, path: Path, *, synchronous: str = "full", units_per_batch: int = 16) -> None:
        self.path = path
        self._synchronous = synchronous.upper()
        self._units_per_batch = units_per_batch  # engine writes per transaction: bounds a delivery's wait
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="pitcrew-store-writer")
        self._conn: sqlite3.Connection | None = None
        self._queue: asyncio.Queue[tuple[Unit | IngestJob, asyncio.Future[Any]]] = asyncio.Queue()
        self._task: asyncio.Task[None] | None = None
        self._checkpointer: aiosqlite.Connection | None = None
        self._checkpoints: asyncio.Task[None] | None = None
        self._closing = False
        # Committed alert keys → (status, incident): a pure redelivery needs no write at all.
        self.keys: OrderedDict[Key, KeyState] = OrderedDict()
        self.keys_max = 200_000
        # Repeat deliveries counted in memory: key → (last seen, count); "flushing" is in a write.
        self.seen: dict[Key, tuple[str, int]] = {}
        self.flushing: dict[Key, tuple[str, int]] = {}
        # (path, st_dev, st_ino) of the database and its WAL as opened: what a restart must find.
        self._files: tuple[tuple[str, int, int], ...] = ()

    @property
    def running(self) -> bool:
        return self._task is not None and not self._task.done()

    async def open(self) -> None:
        loop = asyncio.get_running_loop()
        self._conn = await loop.run_in_executor(self._executor, self._connect)
        self._checkpointer = await aiosqlite.connect(self.path, isolation_level=None)
        await self._checkpointer.execute("PRAGMA busy_timeout=10000")
        self._task = asyncio.create_task(self._loop(), name="pitcrew-store-writer")
        self._checkpoints = asyncio.create_task(self._checkpoint_loop(), name="pitcrew-store-checkpoint")

    def _connect(self) -> sqlite3.Connection:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        conn = sqlite3.connect(self.path, isolation_level=None)
        for pragma in (
            "journal_mode=WAL",
            f"synchronous={self._synchronous}",
            "foreign_keys=ON",
            "busy_timeout=10000",
            "wal_autocheckpoint=0",  # checkpoints run beside the writer, not inside a commit
        ):
            conn.execute(f"PRAGMA {pragma}")
        _migrate(conn, self.path)
        files = []
        for path in (str(self.path), f"{self.path}-wal"):
            with contextlib.suppress(FileNotFoundError):  # no WAL if SQLite could open it read-only
                st = os.stat(path)
                files.append((path, st.st_dev, st.st_ino))
        self._files = tuple(files)
        return conn

    async def close(self) -> None:
        """Finish queued writes and flush counters, then release everything, whatever happens."""
        loop = asyncio.get_running_loop()
        self._closing = True
        try:
            if self.running:
                if self.seen:
                    await self.submit(lambda conn: None)  # the writer flushes pending counters first
                await self._queue.join()
        finally:
            for task in (self._task, self._checkpoints):
                if task is not None:
                    task.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await task
            self._task = self._checkpoints = None
            if self._checkpointer is not None:
                with contextlib.suppress(sqlite3.Error):
                    await self._checkpointer.execute("PRAGMA wal_checkpoint(TRUNCATE)")
                await self._checkpointer.close()
                self._checkpointer = None
            if self._conn is not None:
                await loop.run_in_executor(self._executor, self._conn.close)
                self._conn = None
            self._executor.shutdown(wait=True)
            self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="pitcrew-store-writer")
            self._closing = False

    async def submit(self, unit: Unit | IngestJob) -> Any:
        """Run ``unit`` in a transaction; its result once that transaction has committed."""
        if not self.running:
            raise StoreUnavailable("store is not open")
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        await self._queue.put((unit, future))
        return await future

    # ------------------------------------------------------------------ the loop
    async def _loop(self) -> None:
        loop = asyncio.get_running_loop()
        flushed = time.monotonic()
        while True:
            if self.seen and (time.monotonic() - flushed >= _FLUSH_EVERY or self._closing):
                await self._flush(loop)
                flushed = time.monotonic()
            try:
                first = await asyncio.wait_for(self._queue.get(), timeout=_FLUSH_EVERY)
            except TimeoutError:
                continue
            batch = [first]
            units = 0 if isinstance(first[0], IngestJob) else 1
            # Every waiting delivery (together they cost one statement per table) and a few
            # engine writes: a webhook never waits behind a long run of engine work.
            while not self._queue.empty() and units < self._units_per_batch:
                item = self._queue.get_nowait()
                units += not isinstance(item[0], IngestJob)
                batch.append(item)
            batch.sort(key=lambda item: not isinstance(item[0], IngestJob))
            items = [unit for unit, _ in batch]
            try:
                outcomes = await loop.run_in_executor(self._executor, self._run, items)
            except Exception as exc:
                log.exception("store write batch failed", extra={"units": len(batch)})
                outcomes = [(False, StoreUnavailable(f"write failed: {exc}"))] * len(batch)
            for (_, future), (ok, value) in zip(batch, outcomes, strict=True):
                if not future.done():
                    if ok:
                        future.set_result(value)
                    else:
                        future.set_exception(value)
            for _ in batch:
                self._queue.task_done()

    async def _flush(self, loop: asyncio.AbstractEventLoop) -> None:
        seen, self.seen = self.seen, {}
        self.flushing = seen  # readers keep counting these until the commit
        rows = [(stamp, n, fp, starts) for (fp, starts), (stamp, n) in seen.items()]

        def bump(conn: sqlite3.Connection) -> None:
            bump_seen(conn, rows)

        try:
            items: list[Unit | IngestJob] = [bump]
            await loop.run_in_executor(self._executor, self._run, items)
        except Exception:
            log.exception("could not record repeat deliveries; will retry")
            for key, (stamp, count) in seen.items():
                old = self.seen.get(key, (stamp, 0))
                self.seen[key] = (max(old[0], stamp), old[1] + count)
        finally:
            self.flushing = {}

    # ------------------------------------------------------- in the writer thread
    def _run(self, items: list[Unit | IngestJob]) -> list[Outcome]:
        """All items in one transaction (if one fails, roll back and run each alone), then make
        sure what was committed is where a restart will look: else every caller hears it failed."""
        outcomes = self._run_units(items)
        lost = self.lost()
        if lost is not None:
            raise StoreUnavailable(f"{lost}: a restart would not find this write")
        return outcomes

    def _run_units(self, items: list[Unit | IngestJob]) -> list[Outcome]:
        conn = self._conn
        assert conn is not None
        try:
            return self._transaction(conn, items)
        except sqlite3.OperationalError:
            raise  # the database itself is in trouble: every caller gets StoreUnavailable
        except Exception as exc:
            if len(items) == 1:
                return [(False, exc)]
        outcomes: list[Outcome] = []
        for item in items:
            try:
                outcomes.extend(self._transaction(conn, [item]))
            except sqlite3.OperationalError:
                raise
            except Exception as exc:
                outcomes.append((False, exc))
        return outcomes

    def _transaction(self, conn: sqlite3.Connection, items: list[Unit | IngestJob]) -> list[Outcome]:
        conn.execute("BEGIN IMMEDIATE")
        try:
            outcomes: list[Outcome] = []
            jobs = [item for item in items if isinstance(item, IngestJob)]
            if jobs:
                outcomes.extend(
                    (True, o) for o in ingest(conn, [(j.delivery, j.now) for j in jobs], self.keys)
                )
            outcomes.extend((True, unit(conn)) for unit in items if not isinstance(unit, IngestJob))
            conn.execute("COMMIT")
            return outcomes
        except BaseException:
            with contextlib.suppress(sqlite3.Error):
                conn.execute("ROLLBACK")
            raise

    def remember(self, cache: Mapping[Key, KeyState]) -> None:
        """Keys a committed delivery stored (loop thread)."""
        for key, state in cache.items():
            self.keys[key] = state
            self.keys.move_to_end(key)
        while len(self.keys) > self.keys_max:
            self.keys.popitem(last=False)

    # ----------------------------------------------------------------- readiness
    def lost(self) -> str | None:
        """Why a restart would not find what is committed now (the database or its WAL at the
        path is gone or is another file than the one opened); ``None`` if it would."""
        for path, device, inode in self._files:
            try:
                st = os.stat(path)
            except FileNotFoundError:
                return f"{path} is gone"
            except OSError as exc:
                return f"{path} cannot be checked ({exc.strerror})"
            if (st.st_dev, st.st_ino) != (device, inode):
                return f"{path} is another file than the one opened"
        return None

    async def ready(self) -> bool:
        """Whether writes commit where a restart finds them."""
        return self.running and self.lost() is None

    # --------------------------------------------------------------- checkpoints
    async def _checkpoint_loop(self) -> None:
        """Fold the WAL back into the database now and then, beside the writer, never in its way."""
        assert self._checkpointer is not None
        while True:
            await asyncio.sleep(_CHECKPOINT_EVERY)
            try:
                await self._checkpointer.execute("PRAGMA wal_checkpoint(PASSIVE)")
            except sqlite3.Error:
                # Often the first sign that the files went away: say so, writes are refused now.
                log.warning("WAL checkpoint failed; will retry", extra={"lost": self.lost()}, exc_info=True)


def _migrate(conn: sqlite3.Connection, path: Path) -> None:
    version = int(conn.execute("PRAGMA user_version").fetchone()[0])
    if version > SCHEMA_VERSION:
        raise RuntimeError(f"{path} has schema {version}, newer than this pitcrew ({SCHEMA_VERSION})")
    for number in range(version, SCHEMA_VERSION):
        # executescript commits any open transaction first, so the script carries its own.
        try:
            conn.executescript(
                f"BEGIN IMMEDIATE; {MIGRATIONS[number]}; PRAGMA user_version = {number + 1}; COMMIT;"
            )
        except Exception:
            with contextlib.suppress(sqlite3.Error):
                conn.execute("ROLLBACK")
            raise
        log.info("store schema migrated", extra={"schema_version": number + 1})
