"""The store's one writer: one connection, many units per commit, written on the event loop; bulk
writes in one worker thread.

Why not statement-by-statement through an async driver: a delivery's transaction is half a dozen
statements, and issued one at a time through an async bridge each had to wait for the event loop
to come round again — under load (the loop busy answering Alertmanager's redeliveries) a new
alert then waited tens of milliseconds. Here a batch runs whole where it runs, and its callers
get every result back once.

Deliveries and the engine's writes run on the event loop's own thread, their ``COMMIT`` too, and so
do a flush of repeat counters and retention's bounded deletes (``Redoable``: committed without an
fsync of their own, since a lost prune is done again); only bulk writes (``Bulk``: a fleet's watch
memory, a flush of more than ``_FLUSH_HERE`` counters) run in the writer thread, where SQLite's own
work does not hold the loop. Each SQLite call lets go of the interpreter and must take it back, and
while the loop is busy answering redeliveries a thread waits for it after every statement, and for
a core to run on, beside the loop and whoever sends the load: in the thread, a new delivery's
half-dozen statements took 6 ms for 2 ms of work, and its commit 4 ms (p50) for well under 1 ms of
fsync. The connection is the thread's while it works, so whatever came meanwhile waited too: at
saturation (``bench/ingest.py``'s stream, the server's own time) the deliveries that found an
engine write in the thread waited 15-22 ms (p50, up to 46), those that found the writer idle
3 ms. With the engine's writes on the loop as well, 95 % of new deliveries find it idle.

A write handed over while the writer is idle (nothing queued, nothing running) is run by its
caller, at once, on the loop: handed to the writer's task it waited for that task's turn of a busy
loop, and then for its own turn to hear the answer. Otherwise it queues.

A commit is an fsync, so a disk whose fsync is slow would stall every webhook: while the last
commits' median is over ``_LOOP_COMMIT_LIMIT``, commits go to the thread (the statements still run
on the loop). The loop never waits for the database's lock: ``BEGIN IMMEDIATE`` is tried there
without a busy timeout, and if another connection holds the lock the thread waits for it instead.
The connection is used by one thread at a time: the loop waits for the thread's last call to end
before it uses the connection itself, and one task at a time uses it from the loop (``_turn``).

Units queue up; the writer takes every delivery waiting plus a few engine writes, and commits
the deliveries in one transaction, then the engine's writes in another (group commit: callers
hear back only after the commit, so an alert answered with 200 is on disk); whoever committed
answers them (``bot.store.batch.answer_soon``).
If a unit fails, the batch is rolled back and each unit is run alone, so one bad unit fails
only itself (``bot.store.batch``, the rule Postgres's group commit follows too). Repeat-delivery
counters are flushed on their own clock, never inside a delivery's transaction (on the loop, up
to ``_FLUSH_HERE`` counters), and the flush adds them to the stored counts (several processes may
count repeats of one alert). ``close`` asks the loop to stop and waits for it: the loop runs what
was queued before, flushes the counters and returns; it is never cancelled in the middle of a
write (a write cancelled before the writer thread took it never ran, and the repeats it carried,
already answered 200, were lost). WAL checkpoints run on a separate (aiosqlite) connection beside
the writer, never inside a commit.

The writer also owns the truth about whether the store can take writes. A commit is
acknowledged only if the database file (and its WAL) at the configured path is still the
file the writer opened: SQLite keeps writing through its open descriptors into a file that
was deleted, moved or replaced, and a restart would not find what it was told. Readiness
(``ready``) checks that, whether the files can be written and the filesystem has room, and
whether the last write attempt succeeded, proving the store with a one-page write when it
has not written for a while or after a failure.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import contextlib
import os
import sqlite3
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import aiosqlite

from bot import logger
from bot.store.base import Delivery, Inspection, StoreUnavailable
from bot.store.batch import ENGINE_WRITES, Answer, commit_batch, settle
from bot.store.ingest import KeyState, bump_seen, ingest
from bot.store.mounts import MOUNTINFO, SharedFilesystem, allowance, filesystem, refusal, transience
from bot.store.repeats import Key, RepeatMemory
from bot.store.schema import SCHEMA_VERSION, NewerSchema, compatible_from, foresee, migrations, opening
from bot.store.sql import SQLITE, run_sync, single

log = logger(__name__)
_CHECKPOINT_EVERY = 2.0  # seconds between WAL checkpoints
_FLUSH_EVERY = 1.0  # seconds: repeat-delivery counters reach the disk at least this often
# A flush of up to this many counters runs on the event loop, as deliveries do: in the thread a
# busy second's (1,000-1,800 counters under bench/ingest.py) held the connection for 23-40 ms
# (p50), and every delivery that came meanwhile waited; on the loop it takes 6-7 ms. More (a
# fleet's worth at once) would hold the loop too long: the thread takes them.
_FLUSH_HERE = 2000
_PROBE_EVERY = 5.0  # seconds without a committed write before readiness proves the store with one
_RETRY_AFTER = 1.0  # seconds after a failed write before readiness tries again (the 503's Retry-After)
_PROBE_TIMEOUT = 2.0  # seconds a readiness probe may wait for its commit
# Below this much free space a store is about to refuse writes (a delivery's batch is tens of
# pages, a checkpoint grows the database by what the WAL holds): not ready, so deliveries go
# elsewhere before they start failing.
_SPACE_RESERVE = 1 << 20
_BUSY_TIMEOUT_MS = 10_000  # how long a write waits for another connection's lock (in the thread)
# Writes commit on the event loop while the median of the last ``_COMMITS_TIMED`` commits
# (the ``COMMIT`` alone: its WAL write and fsync) is under this, and in the writer thread while it
# is over: a local disk commits in well under a millisecond, and a slow disk's fsync must not stall
# every webhook. The median, not each commit: one that waited for a core or the interpreter under
# load says nothing about the disk.
_LOOP_COMMIT_LIMIT = 0.005
_COMMITS_TIMED = 15
#: ``synchronous`` levels at which a commit syncs the WAL itself: what ``Redoable`` relaxes.
_SYNCED = frozenset({"FULL", "EXTRA"})

Unit = Callable[[sqlite3.Connection], Any]


@dataclass(frozen=True, slots=True)
class Bulk:
    """A unit that may hold the connection long (a fleet's rows, a big flush): it runs in
    the writer thread, where SQLite's own work does not hold the event loop."""

    unit: Unit


@dataclass(frozen=True, slots=True)
class Redoable:
    """A short write whose loss in a power cut costs nothing, because it is done again (retention's
    deletes: the next prune finds the same rows). It runs as an engine write does, on the loop, and
    a transaction of such writes alone commits with ``synchronous=NORMAL``: into the WAL without an
    fsync of its own. It is made durable by the next commit that syncs (every acknowledged
    delivery's, at ``full``: an fsync writes the whole WAL, and SQLite's recovery reads its frames
    in order) or by a checkpoint; a power cut before either loses that transaction and nothing
    written after it. In one transaction with any other write, it commits as configured.

    Why on the loop and not in the thread as ``Bulk``: a delivery that comes while a write holds
    the connection waits for all of it. In the thread that is the write, its commit, and every turn
    of a busy loop it takes to hand over and back (``bench/retention.py``, 100,000 alerts: a
    prune transaction held the connection 1.3-1.4 ms at the median for 0.2-0.3 ms of statements,
    and ingest's p99 while pruning was 1.9-2.9x what it was alone); on the loop, its statements and
    a commit that writes the WAL without waiting for the disk (1.3-1.4x). Its caller bounds it (a
    prune's statements are sized to ``retention.SHARED_BUDGET``)."""

    unit: Unit


@dataclass(frozen=True, slots=True)
class IngestJob:
    """One webhook delivery to persist; the deliveries of a batch are ingested together."""

    delivery: Delivery
    now: datetime


#: What the writer's queue holds: a unit and its caller's future, or ``None``, the mark ``close``
#: queues after everything it must run (the loop flushes the counters then and stops).
Queued = tuple[Unit | Bulk | Redoable | IngestJob, "asyncio.Future[Any]"] | None


class Writer:
    def __init__(
        self,
        path: Path,
        *,
        synchronous: str = "full",
        units_per_batch: int = ENGINE_WRITES,
        retention: timedelta | None = None,
        network_filesystem: bool = False,
        mount_table: Path = MOUNTINFO,
    ) -> None:
        """``network_filesystem``: the file may be on one (``bot.store.mounts``); ``mount_table``:
        where the mounts are read (the kernel's; a test gives its own)."""
        self.path = path
        self._network_filesystem, self._mount_table = network_filesystem, mount_table
        self.synchronous = synchronous.upper()
        self._level = self.synchronous  # the connection's ``synchronous`` now (``_durability``)
        self._units_per_batch = units_per_batch  # engine writes per transaction: bounds a delivery's wait
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="pitcrew-store-writer")
        self._conn: sqlite3.Connection | None = None
        # The writer thread's last call on the connection: the loop's own calls wait for it.
        self._in_thread: concurrent.futures.Future[Any] | None = None
        self._queue: asyncio.Queue[Queued] = asyncio.Queue()
        # Held by whoever uses the connection from the loop (the writer's task, or a write run by
        # its own caller while the writer is idle): one at a time.
        self._turn = asyncio.Lock()
        self._task: asyncio.Task[None] | None = None
        self._checkpointer: aiosqlite.Connection | None = None
        self._checkpoints: asyncio.Task[None] | None = None
        # Committed alert keys, and repeat deliveries counted in memory (``bot.store.repeats``).
        self.memory = RepeatMemory(retention=retention)
        # (path, st_dev, st_ino) of the database and its WAL as opened: what a restart must find.
        self._files: tuple[tuple[str, int, int], ...] = ()
        self._failure: str | None = None  # why the last write attempt failed; None if it succeeded
        self._failed_at = 0.0
        self._wrote_at = float("-inf")  # monotonic time of the last successful write attempt
        self._probing: asyncio.Task[bool] | None = None
        self._ready = True  # what readiness last reported, to log when it turns
        self._commit_times: collections.deque[float] = collections.deque(maxlen=_COMMITS_TIMED)
        self._slow_disk = False  # what the commits' median last said, to log when it turns

    @property
    def running(self) -> bool:
        return self._task is not None and not self._task.done()

    async def open(self) -> None:
        loop = asyncio.get_running_loop()
        self._failure, self._wrote_at, self._ready = None, float("-inf"), True
        self._turn = asyncio.Lock()
        self._level = self.synchronous  # as ``_connect`` sets it
        self._conn = await loop.run_in_executor(self._executor, self._connect)
        self._checkpointer = await aiosqlite.connect(self.path, isolation_level=None)
        await self._checkpointer.execute("PRAGMA busy_timeout=10000")
        self._task = asyncio.create_task(self._loop(), name="pitcrew-store-writer")
        self._checkpoints = asyncio.create_task(self._checkpoint_loop(), name="pitcrew-store-checkpoint")

    def inspection(self) -> Inspection:
        """``inspect_file`` of this writer's file, as ``open`` would find it (blocking: a thread's)."""
        return inspect_file(
            self.path, network_filesystem=self._network_filesystem, mount_table=self._mount_table
        )

    def _connect(self) -> sqlite3.Connection:
        mount = filesystem(self.path, self._mount_table)
        if mount is not None and mount.ephemeral:
            log.warning(
                f"SQLite store {transience(mount)}",
                extra={"path": str(self.path), "filesystem": mount.fstype, "source": mount.source},
            )
        if mount is not None and mount.shared:
            if not self._network_filesystem:
                raise SharedFilesystem(refusal(self.path, mount))
            log.warning(
                "SQLite store on a filesystem other hosts may open too, allowed by "
                "store.allow_network_filesystem: nothing on another host may ever open it",
                extra={"path": str(self.path), "filesystem": mount.fstype, "source": mount.source},
            )
        self.path.parent.mkdir(parents=True, exist_ok=True)
        # Used from the loop's thread too (deliveries' statements), never by two threads at once.
        conn = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        conn.execute(f"PRAGMA busy_timeout={_BUSY_TIMEOUT_MS}")
        _wal(conn)
        for pragma in (
            f"synchronous={self.synchronous}",
            "foreign_keys=ON",
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
        try:
            if self._task is not None and not self._task.done():
                # The loop runs what is queued, flushes the counters and stops by itself: never
                # cancelled in the middle of a write (see the module's docstring).
                self._queue.put_nowait(None)
                await asyncio.wait([self._task])  # a cancelled close does not cancel the loop here
        finally:
            for task in (self._task, self._checkpoints, self._probing):
                if task is not None:
                    task.cancel()  # the loop only if it has not stopped (close was cancelled)
                    with contextlib.suppress(asyncio.CancelledError):
                        await task
            self._task = self._checkpoints = self._probing = None
            if self.memory.seen and self._conn is not None:
                # Counted while the loop's last flush was committing (or the loop had died):
                # repeats that were answered 200 reach the disk before the store closes.
                async with self._turn:
                    await self._flush(loop)
                if self.memory.seen:
                    log.error(
                        "repeat deliveries not recorded at close", extra={"alerts": len(self.memory.seen)}
                    )
            # A unit submitted while the writer stopped was never run: its caller hears so
            # instead of waiting for a commit that will not come.
            while not self._queue.empty():
                queued = self._queue.get_nowait()
                self._queue.task_done()
                if queued is not None and not queued[1].done():
                    queued[1].set_exception(StoreUnavailable("store closed before this write ran"))
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

    async def submit(self, unit: Unit | Bulk | Redoable | IngestJob) -> Any:
        """Run ``unit`` in a transaction; its result once that transaction has committed."""
        if not self.running:
            raise StoreUnavailable("store is not open")
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        if not isinstance(unit, Bulk) and self._idle():
            # Nothing ahead of it: its caller commits it at once, on the loop (as the writer's task
            # would), instead of waking that task and being woken by it, a turn of a busy loop each.
            async with self._turn:
                await self._run([(unit, future)], queued=False)
            return future.result()
        await self._queue.put((unit, future))
        return await future

    def _idle(self) -> bool:
        """Whether a write would be the writer's next and only work, committed on the loop."""
        return (
            self._queue.empty()
            and not self._turn.locked()
            and (self._in_thread is None or self._in_thread.done())
            and not self._commits_slow()
        )

    async def drained(self) -> None:
        """Until every unit queued so far has run and committed (a background write's turn)."""
        await self._queue.join()

    # ------------------------------------------------------------------ the loop
    async def _loop(self) -> None:
        loop = asyncio.get_running_loop()
        flushed = time.monotonic()
        stop = False
        while not stop:
            if self.memory.seen and time.monotonic() - flushed >= _FLUSH_EVERY:
                async with self._turn:
                    await self._flush(loop)
                flushed = time.monotonic()
            try:
                # Not ``asyncio.wait_for``: on Python 3.11 it hands the unit to a loop being
                # cancelled and the loop goes on, so whoever cancelled it waits for it for ever.
                async with asyncio.timeout(_FLUSH_EVERY):
                    first = await self._queue.get()
            except TimeoutError:
                continue
            if first is None:  # close: nothing queued before it is left
                self._queue.task_done()
                break
            batch = [first]
            units = 0 if isinstance(first[0], IngestJob) else 1
            # Every waiting delivery (together they cost one statement per table) and a few
            # engine writes: a webhook never waits behind a long run of engine work.
            while not self._queue.empty() and units < self._units_per_batch:
                item = self._queue.get_nowait()
                if item is None:  # close: this batch is the last
                    self._queue.task_done()
                    stop = True
                    break
                units += not isinstance(item[0], IngestJob)
                batch.append(item)
            # The deliveries commit on their own, before the engine's writes and without them: they
            # never wait for the writer thread (see the module's docstring).
            deliveries = [item for item in batch if isinstance(item[0], IngestJob)]
            async with self._turn:
                for part in (deliveries, [item for item in batch if not isinstance(item[0], IngestJob)]):
                    if part:
                        await self._run(part)
        if self.memory.seen:
            async with self._turn:
                await self._flush(loop)  # what was answered 200 is on disk before the loop stops

    async def _run(
        self,
        batch: list[tuple[Unit | Bulk | Redoable | IngestJob, asyncio.Future[Any]]],
        *,
        queued: bool = True,
    ) -> None:
        """One transaction for ``batch`` (``commit_batch``: each alone if it fails); every caller
        hears its own outcome. ``queued``: the batch came from the queue (not from ``submit``'s
        caller directly), which hears that it is done."""
        items = [unit for unit, _ in batch]
        futures = [future for _, future in batch]
        outcomes = await commit_batch(items, self._commit, futures)
        failed = next((o for o in outcomes if isinstance(o, StoreUnavailable)), None)
        self._attempted(failed, units=len(batch))
        settle(futures, outcomes)
        for _ in batch if queued else ():
            self._queue.task_done()

    async def _flush(self, loop: asyncio.AbstractEventLoop) -> None:
        rows = self.memory.take()  # reads keep counting them until the commit

        def bump(conn: sqlite3.Connection) -> None:
            run_sync(conn, single(bump_seen(rows)))

        try:
            # Shielded: if whoever flushes is cancelled, the write handed to the writer thread is
            # not withdrawn with it (the counts it carries were answered 200 already).
            await asyncio.shield(self._commit([bump if len(rows) <= _FLUSH_HERE else Bulk(bump)]))
        except asyncio.CancelledError:
            self.memory.flushed(committed=True)  # the shielded write goes on without us
            raise
        except Exception as exc:
            self._attempted(exc, units=1)
            log.warning("could not record repeat deliveries; will retry")
            self.memory.flushed(committed=False)
        else:
            self._attempted(None)
            self.memory.flushed(committed=True)

    def _attempted(self, error: Exception | None, *, units: int = 0) -> None:
        """Remember how the last write attempt went; log when that changes."""
        if error is None:
            if self._failure is not None:
                log.info("store writes succeed again", extra={"after": self._failure})
            self._failure, self._wrote_at = None, time.monotonic()
            return
        if self._failure is None:
            log.error("store write failed", extra={"units": units}, exc_info=error)
        self._failure, self._failed_at = str(error), time.monotonic()

    async def _commit(
        self, items: Sequence[Unit | Bulk | Redoable | IngestJob], answer: Answer | None = None
    ) -> list[Any]:
        """``items`` in one transaction: their results once committed where a restart will look.
        Their statements and the commit run on the loop, but all in the writer thread if one of
        them is ``Bulk``, or if another connection holds the database's lock (the thread waits for
        it); the commit alone in the thread while commits are slow (see the module's docstring).
        The database's own failure is ``StoreUnavailable``. ``answer``: the items' callers
        (``commit_batch``), answered by whoever committed, once committed (``_committed``)."""
        conn = self._conn
        assert conn is not None
        jobs = [item for item in items if isinstance(item, IngestJob)]
        units = [
            item.unit if isinstance(item, Bulk | Redoable) else item
            for item in items
            if not isinstance(item, IngestJob)
        ]
        bulk = any(isinstance(item, Bulk) for item in items)
        # Commits without an fsync of its own: only writes that are done again if lost (``Redoable``).
        relaxed = self.synchronous in _SYNCED and all(isinstance(item, Redoable) for item in items)
        # The keys the deliveries may take as stored without asking (``RepeatMemory.trusted``).
        keys = self.memory.trusted(max(job.now for job in jobs)) if jobs else self.memory.keys
        try:
            if self._in_thread is not None and not self._in_thread.done():
                # The connection is the thread's until its last call ends.
                await asyncio.wait([asyncio.wrap_future(self._in_thread)])
            # Between transactions (SQLite refuses it inside one), for the one about to begin,
            # wherever it commits: each transaction sets what it needs, none has to put it back.
            self._durability(conn, "NORMAL" if relaxed else self.synchronous)
            results: list[Any] = []
            begun = not bulk and _begin_now(conn)
            if begun:
                try:
                    results = _ingest(conn, jobs, keys) if jobs else []
                    results.extend(unit(conn) for unit in units)
                except BaseException:
                    _rollback(conn)
                    raise
                jobs, units = [], []  # run: what is left is the commit
            timed = not relaxed  # a commit without an fsync says nothing of the disk
            if begun and not self._commits_slow():
                rest, lost = self._committed(conn, [], [], keys, begun, list(results), answer, timed)
            else:
                rest, lost = await self._thread(
                    self._committed, conn, jobs, units, keys, begun, list(results), answer, timed
                )
            results.extend(rest)
        except sqlite3.OperationalError as exc:
            raise StoreUnavailable(f"write failed: {exc}") from exc
        if lost is not None:
            raise StoreUnavailable(f"{lost}: a restart would not find this write")
        return results

    def _durability(self, conn: sqlite3.Connection, level: str) -> None:
        """SQLite's ``synchronous`` for the next transaction on ``conn`` (set only when it changes)."""
        if level != self._level:
            conn.execute(f"PRAGMA synchronous={level}")
            self._level = level

    def _commits_slow(self) -> bool:
        """Whether the disk commits too slowly for the event loop (``_LOOP_COMMIT_LIMIT``)."""
        times = sorted(self._commit_times)
        median = times[len(times) // 2] if times else 0.0
        slow = median > _LOOP_COMMIT_LIMIT
        if slow != self._slow_disk:
            self._slow_disk = slow
            said = {"median_ms": round(median * 1000, 1)}
            if slow:
                log.warning("commits are slow; writes commit in the writer thread", extra=said)
            else:
                log.info("commits are quick again; writes commit on the event loop", extra=said)
        return slow

    def _committed(
        self,
        conn: sqlite3.Connection,
        jobs: Sequence[IngestJob],
        units: Sequence[Unit],
        keys: Mapping[Key, KeyState],
        begun: bool,
        first: list[Any],
        answer: Answer | None,
        timed: bool = True,
    ) -> tuple[list[Any], str | None]:
        """In the writer thread: the rest of the transaction (``_finish``), then whether the files
        are still the ones opened (``lost``). If they are, the callers get their results (``first``,
        worked out on the loop, then the rest) from here (``answer``); if not, none: the writer's
        task refuses the batch (``_commit``). The success is recorded before any caller hears
        (``_attempted``): a caller that asks for readiness at once (``ready``) must not be told of
        the failure this write has just ended, which the writer's task would record only later.
        ``timed``: the ``COMMIT``'s time goes into what says whether the disk is slow."""
        rest = _finish(conn, jobs, units, keys, begun, self._commit_times if timed else None)
        lost = self.lost()
        if lost is None:
            self._attempted(None)
            if answer is not None:
                answer([*first, *rest])
        return rest, lost

    async def _thread(self, call: Callable[..., Any], *args: Any) -> Any:
        """``call(*args)`` in the writer thread. If the caller is cancelled once the call has
        started, it still runs to its end (its own future says when: the loop's view of it is
        cancelled at once), and the loop's next use of the connection waits for it."""
        self._in_thread = self._executor.submit(call, *args)
        return await asyncio.wrap_future(self._in_thread)

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

    def hazard(self) -> str | None:
        """Why the store cannot be trusted with the next write, from the files alone; ``None`` if
        nothing is wrong with them. Cheap (a few system calls): run on every readiness check."""
        lost = self.lost()
        if lost is not None:
            return lost
        for path in (self.path, self.path.parent):  # the directory: SQLite creates its WAL there
            if not os.access(path, os.W_OK):
                return f"{path} is not writable"
        try:
            fs = os.statvfs(self.path.parent)
        except OSError as exc:
            return f"{self.path.parent} cannot be checked ({exc.strerror})"
        free = fs.f_bavail * fs.f_frsize
        if free < _SPACE_RESERVE:
            return f"{free} bytes free where the store is, under the {_SPACE_RESERVE} it keeps in reserve"
        return None

    async def ready(self) -> bool:
        """Whether the store takes writes now: its files are sound and the last write attempt
        succeeded. Without a write for a while, or a second after a failed one, a one-page write
        decides (one at a time however many callers ask)."""
        reason = "store is not open" if not self.running else self.hazard()
        if reason is None:
            since = time.monotonic() - (self._wrote_at if self._failure is None else self._failed_at)
            if self._failure is not None and since < _RETRY_AFTER:
                reason = self._failure
            elif self._failure is not None or since >= _PROBE_EVERY:
                if self._probing is None or self._probing.done():
                    self._probing = asyncio.create_task(self._probe(), name="pitcrew-store-probe")
                if not await asyncio.shield(self._probing):
                    reason = self._failure or "a probe write did not commit in time"
        if (reason is None) != self._ready:  # log the turns, not every probe of /readyz
            if reason is None:
                log.info("store ready: writes commit where a restart finds them")
            else:
                log.error("store not ready", extra={"reason": reason})
            self._ready = reason is None
        return reason is None

    async def _probe(self) -> bool:
        try:
            async with asyncio.timeout(_PROBE_TIMEOUT):
                await self.submit(_touch)
        except Exception:  # readiness reports, it does not raise; the writer has logged the cause
            return False
        return True

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


def _begin_now(conn: sqlite3.Connection) -> bool:
    """Open the write transaction on the loop's thread if the lock is free; ``False`` (nothing
    begun) if another connection holds it: the thread then waits for it, the loop never does."""
    conn.execute("PRAGMA busy_timeout=0")
    try:
        conn.execute("BEGIN IMMEDIATE")
    except sqlite3.OperationalError as exc:
        if exc.sqlite_errorcode in (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED):
            return False
        raise
    finally:
        conn.execute(f"PRAGMA busy_timeout={_BUSY_TIMEOUT_MS}")
    return True


def _ingest(conn: sqlite3.Connection, jobs: Sequence[IngestJob], keys: Mapping[Key, KeyState]) -> list[Any]:
    """The deliveries' statements, in the transaction begun on ``conn``: one outcome each."""
    return list(run_sync(conn, ingest([(j.delivery, j.now) for j in jobs], keys)).result)


def _finish(
    conn: sqlite3.Connection,
    jobs: Sequence[IngestJob],
    units: Sequence[Unit],
    keys: Mapping[Key, KeyState],
    begun: bool,
    times: collections.deque[float] | None,
) -> list[Any]:
    """Begin (unless the loop has), ingest ``jobs`` (those the loop could not begin for), run
    ``units``, commit, and put how long the ``COMMIT`` took in ``times`` (unless ``None``); roll
    back if any of it fails."""
    if not begun:
        conn.execute("BEGIN IMMEDIATE")
    try:
        results = _ingest(conn, jobs, keys) if jobs else []
        results.extend(unit(conn) for unit in units)
        started = time.perf_counter()
        conn.execute("COMMIT")
        if times is not None:
            times.append(time.perf_counter() - started)
    except BaseException:
        _rollback(conn)
        raise
    return results


def _rollback(conn: sqlite3.Connection) -> None:
    with contextlib.suppress(sqlite3.Error):
        conn.execute("ROLLBACK")


def _touch(conn: sqlite3.Connection) -> None:
    """The smallest real write: page 1 rewritten with the schema version it already has."""
    version = int(conn.execute("PRAGMA user_version").fetchone()[0])
    conn.execute(f"PRAGMA user_version = {version}")


def _wal(conn: sqlite3.Connection) -> None:
    """Put the database in WAL mode. Two processes opening a new store at once each try to, and
    SQLite answers one of them "database is locked" at once, without waiting out the busy timeout
    (each holds what the other needs): that one tries again until the busy timeout has passed."""
    deadline = time.monotonic() + _BUSY_TIMEOUT_MS / 1000
    while True:
        try:
            conn.execute("PRAGMA journal_mode=WAL")
            return
        except sqlite3.OperationalError as exc:
            if exc.sqlite_errorcode != sqlite3.SQLITE_BUSY or time.monotonic() >= deadline:
                raise
        time.sleep(0.01)


def _statements(script: str) -> list[str]:
    """``script``'s statements, one by one (a trigger's body, with its own ``;``, stays whole)."""
    statements, pending = [], ""
    for piece in script.split(";"):
        pending += piece + ";"
        if sqlite3.complete_statement(pending):
            if pending.strip(" \n;"):
                statements.append(pending.strip())
            pending = ""
    return statements


_MIGRATIONS = tuple(_statements(script) for script in migrations(SQLITE))


def _migrate(conn: sqlite3.Connection, path: Path) -> None:
    """Migrate the store to ``SCHEMA_VERSION``, a migration a transaction, each reading the version
    it starts from under the write lock: another process opening the store at the same time waits,
    then finds it migrated (read before the lock, both ran the first migration, and one failed on
    "table incidents already exists"). A store with nothing to migrate is not written (a read-only
    file still opens); one a newer pitcrew migrated is run on as it is, or refused
    (``bot.store.schema.standing``)."""
    while not _settled(conn, path):
        conn.execute("BEGIN IMMEDIATE")
        try:
            version, _ = _schema(conn)
            if version < SCHEMA_VERSION:
                for statement in _MIGRATIONS[version]:
                    conn.execute(statement)
                conn.execute(f"PRAGMA user_version = {version + 1}")
            elif version == SCHEMA_VERSION:  # which pitcrew may run on it, recorded
                conn.execute("CREATE TABLE IF NOT EXISTS pitcrew_schema (compatible_from INTEGER)")
                conn.execute("DELETE FROM pitcrew_schema")
                conn.execute("INSERT INTO pitcrew_schema VALUES (?)", (compatible_from(SCHEMA_VERSION),))
            conn.execute("COMMIT")  # newer: another process migrated it meanwhile (judged next)
        except BaseException:
            _rollback(conn)
            raise
        if version < SCHEMA_VERSION:
            log.info("store schema migrated", extra={"schema_version": version + 1})


def _settled(conn: sqlite3.Connection, path: Path) -> bool:
    """Nothing to write: the store is at this pitcrew's schema with its record of which pitcrew
    may run on it, or newer and run on as it is (``NewerSchema`` if it may not)."""
    version, compatible = _schema(conn)
    if version > SCHEMA_VERSION:
        opening(version, compatible, str(path))
        return True
    return version == SCHEMA_VERSION and compatible == compatible_from(SCHEMA_VERSION)


def inspect_file(
    path: Path, *, network_filesystem: bool = False, mount_table: Path = MOUNTINFO
) -> Inspection:
    """What ``check-config --live`` reports of a SQLite store, changing nothing (the file is read,
    never created or migrated): whether it may be opened where it is (``bot.store.mounts``),
    whether this user may create or write it and its WAL beside it, and what opening it will do
    to its schema."""
    where = str(path)

    def refused(detail: str, missing: str) -> Inspection:
        return Inspection("sqlite", False, detail, missing=(missing,))

    mount = filesystem(path, mount_table)
    said = ""
    if mount is not None and mount.shared:
        if not network_filesystem:
            return refused(refusal(path, mount), "a local filesystem for store.path (or a Postgres store)")
        said = f"; {allowance(mount)}"
    elif mount is not None and mount.ephemeral:
        said = f"; {transience(mount)}"

    folder = path.parent
    while not folder.exists() and folder != folder.parent:  # created at start, from here down
        folder = folder.parent
    if not os.access(folder, os.W_OK | os.X_OK):
        return refused(f"{where}: {folder} is not writable by this user", f"write access to {folder}")
    if not path.exists():
        return Inspection("sqlite", True, f"{where}: {foresee(None, None, where)[0]}{said}")
    if not os.access(path, os.R_OK | os.W_OK):
        return refused(f"{where}: not readable and writable by this user", f"write access to {path}")
    try:
        conn = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True)
        try:
            version, compatible = _schema(conn)
        finally:
            conn.close()
        schema, _ = foresee(version, compatible, where)
    except NewerSchema as exc:
        return refused(str(exc), "a pitcrew that runs on this store's schema")
    except sqlite3.Error as exc:
        return refused(f"{where}: {exc}", f"a SQLite database at {where}")
    return Inspection("sqlite", True, f"{where}: {schema}{said}")


def _schema(conn: sqlite3.Connection) -> tuple[int, int | None]:
    """The store's schema version, and the earliest schema a pitcrew may be written for to run on
    it (``None``: not recorded, a store of a pitcrew before the record or still empty)."""
    version = int(conn.execute("PRAGMA user_version").fetchone()[0])
    if conn.execute("SELECT 1 FROM sqlite_master WHERE name = 'pitcrew_schema'").fetchone() is None:
        return version, None
    row = conn.execute("SELECT compatible_from FROM pitcrew_schema").fetchone()
    return version, None if row is None or row[0] is None else int(row[0])
