"""Where SQLite's writer commits (``bot.store.writer``), seen at the database itself.

A unit handed to the writer puts SQLite's trace callback on the writer's connection: from then on
every statement SQLite runs is recorded with the thread that ran it. Cases:

- a delivery alone runs and commits on the event loop's thread, and so does an engine write; a
  bulk write (``Bulk``: a fleet's rows) runs and commits in the writer thread;
- a write handed over while the writer is idle is run by its caller's own task, at once; one that
  comes while the writer is busy waits in the queue and the writer's task runs it;
- deliveries queued beside engine writes commit on their own, first, on the loop, and the engine's
  writes after them in a transaction of their own, on the loop too, each caller answered;
- a flush of repeat-delivery counters runs its statements and commits on the loop too;
- a write done again if lost (``Redoable``: retention's deletes) commits on the loop with
  ``synchronous=NORMAL``, without an fsync of its own, and its commit is not timed as the disk's;
  every other write as configured (``full``) before and after it, and so does such a write in one
  transaction with one that must be durable; a writer configured not to sync each commit is
  never made stricter;
- one slow ``COMMIT`` among quick ones changes nothing; once most of the last ones were slow (the
  trace callback sleeps inside each, as a slow disk's fsync would), deliveries commit in the writer
  thread, with one warning, and once most were quick again, on the loop again.
"""

from __future__ import annotations

import asyncio
import logging
import sqlite3
import threading
import time
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path

import pytest

from bot.domain.faults import Fault
from bot.store import writer as writer_module
from bot.store.base import Delivery, IncomingAlert, IngestOutcome
from bot.store.writer import Bulk, IngestJob, Redoable, Writer

T0 = datetime(2026, 12, 3, 9, 0, tzinfo=UTC)


def _job(node: str) -> IngestJob:
    fault = Fault("xid", node, "3", 79, "RESTART_BM", "fatal", "replace-node", True, "fell off the bus", True)
    alert = IncomingAlert(f"fp-{node}", T0, None, "firing", "GpuXid", node, {"node": node}, {}, fault)
    return IngestJob(Delivery("pitcrew", f"{{node={node}}}", "firing", 0, (alert,)), T0)


class Traced:
    """Every statement on the writer's connection, with the thread that ran it (and the task, on
    the loop's thread)."""

    def __init__(self) -> None:
        self.statements: list[tuple[int, str]] = []
        self.tasks: list[asyncio.Task[object] | None] = []
        self.slow = 0.0  # seconds each ``COMMIT`` takes longer while set, as on a slow disk

    def install(self, conn: sqlite3.Connection) -> None:
        conn.set_trace_callback(self._ran)

    def _ran(self, sql: str) -> None:
        self.statements.append((threading.get_ident(), sql.strip()))
        try:
            self.tasks.append(asyncio.current_task())
        except RuntimeError:  # the writer thread: no loop there
            self.tasks.append(None)
        if sql.strip() == "COMMIT" and self.slow:
            time.sleep(self.slow)  # SQLite calls this as the statement starts: inside the commit

    def mark(self) -> int:
        return len(self.statements)

    def begun_by(self, since: int = 0) -> list[asyncio.Task[object] | None]:
        """The tasks that ran each ``BEGIN`` after ``since`` (``None``: the writer thread)."""
        return [
            task
            for (_, sql), task in zip(self.statements[since:], self.tasks[since:], strict=True)
            if sql.startswith("BEGIN")
        ]

    def commits(self, since: int = 0) -> list[int]:
        """The threads that ran each ``COMMIT`` after ``since``."""
        return [thread for thread, sql in self.statements[since:] if sql == "COMMIT"]


#: The loop's limit here, well above what a loaded CI machine's fsync takes, and a slow disk's commit.
LIMIT, SLOW = 0.05, 0.1


@pytest.fixture
async def writer(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[tuple[Writer, Traced]]:
    monkeypatch.setattr(writer_module, "_LOOP_COMMIT_LIMIT", LIMIT)
    store = Writer(tmp_path / "pitcrew.db")
    await store.open()
    traced = Traced()
    try:
        await store.submit(traced.install)
        yield store, traced
    finally:
        await store.close()


async def _hold_thread(store: Writer) -> tuple[asyncio.Task[None], threading.Event]:
    """A bulk unit running in the writer thread until the returned event is set, keeping the
    writer busy while more is handed over; the task ends once it has committed."""
    held, release = threading.Event(), threading.Event()

    def hold(conn: sqlite3.Connection) -> None:
        held.set()
        release.wait(10)

    holding = asyncio.create_task(store.submit(Bulk(hold)))
    assert await asyncio.to_thread(held.wait, 10)
    return holding, release


def _engine_write(conn: sqlite3.Connection) -> str:
    conn.execute("PRAGMA user_version")  # read, in the unit's transaction: a stand-in for a step's rows
    return "engine"


async def test_a_delivery_and_an_engine_write_commit_on_the_loop_and_a_bulk_write_in_the_thread(
    writer: tuple[Writer, Traced],
) -> None:
    store, traced = writer
    loop_thread = threading.get_ident()
    since = traced.mark()
    outcome = await store.submit(_job("gpu-001"))
    assert isinstance(outcome, IngestOutcome) and outcome.new_alerts == 1
    assert traced.commits(since) == [loop_thread]
    assert any(
        thread == loop_thread and sql.startswith("INSERT") for thread, sql in traced.statements[since:]
    )
    since = traced.mark()
    assert await store.submit(_engine_write) == "engine"
    assert traced.commits(since) == [loop_thread]
    since = traced.mark()
    assert await store.submit(Bulk(_engine_write)) == "engine"
    [committed_by] = traced.commits(since)
    assert committed_by != loop_thread
    assert {thread for thread, _ in traced.statements[since:]} == {committed_by}


async def test_an_idle_writer_lets_the_caller_commit_and_a_busy_one_queues(
    writer: tuple[Writer, Traced],
) -> None:
    store, traced = writer
    since = traced.mark()
    caller = asyncio.create_task(store.submit(_job("gpu-004")))
    await caller
    assert traced.begun_by(since) == [caller]  # no hop to the writer's task and back
    holding, release = await _hold_thread(store)
    since = traced.mark()
    queued = asyncio.create_task(store.submit(_job("gpu-005")))
    await asyncio.sleep(0.05)
    assert not queued.done()  # the writer is busy: it waits its turn
    release.set()
    await holding
    assert (await queued).new_alerts == 1
    [begun_by] = traced.begun_by(since)  # the held unit had begun before
    assert begun_by is not None and begun_by is not queued  # the writer's task ran it


async def test_deliveries_queued_beside_engine_writes_commit_first_on_their_own(
    writer: tuple[Writer, Traced],
) -> None:
    store, traced = writer
    loop_thread = threading.get_ident()
    holding, release = await _hold_thread(store)
    engine = asyncio.create_task(store.submit(_engine_write))
    first, second = (
        asyncio.create_task(store.submit(_job("gpu-002"))),
        asyncio.create_task(store.submit(_job("gpu-003"))),
    )
    await asyncio.sleep(0.05)  # all three queued behind the held unit: the writer's next batch
    since = traced.mark()
    release.set()
    await holding
    outcomes = await asyncio.gather(first, second)
    assert await engine == "engine"
    assert [o.new_alerts for o in outcomes] == [1, 1]
    after_hold = traced.commits(since)[1:]  # the held unit's own commit first
    assert len(after_hold) == 2, traced.statements[since:]
    assert after_hold == [loop_thread, loop_thread]
    # The two deliveries were one transaction: one BEGIN for both, before the engine's own.
    statements = [sql for _, sql in traced.statements[since:]]
    begins = [n for n, sql in enumerate(statements) if sql.startswith("BEGIN")]
    assert len(begins) == 2, statements  # the deliveries', then the engine write's (the held unit had begun)
    assert any(sql.startswith("INSERT") for sql in statements[begins[0] : begins[1]])
    assert "PRAGMA user_version" in statements[begins[1] :]


async def test_slow_commits_send_the_deliveries_commits_to_the_thread_until_they_are_quick_again(
    writer: tuple[Writer, Traced], caplog: pytest.LogCaptureFixture
) -> None:
    store, traced = writer
    loop_thread = threading.get_ident()
    window = writer_module._COMMITS_TIMED
    nodes = (f"gpu-{n:03d}" for n in range(100))

    async def deliver(count: int) -> list[int]:
        """``count`` deliveries one after the other: the threads that committed each."""
        since = traced.mark()
        for _ in range(count):
            await store.submit(_job(next(nodes)))
        return traced.commits(since)

    with caplog.at_level(logging.INFO, logger=writer_module.log.name):
        assert await deliver(window) == [loop_thread] * window
        traced.slow = SLOW  # one slow commit among quick ones: a core or the interpreter was busy
        assert await deliver(1) == [loop_thread]
        traced.slow = 0.0
        assert await deliver(1) == [loop_thread]
        traced.slow = SLOW  # the disk turns slow: once most of the last commits were, the thread
        slow = await deliver(window // 2 + 2)
        assert slow[: window // 2] == [loop_thread] * (window // 2)
        assert loop_thread not in slow[window // 2 + 1 :]
        traced.slow = 0.0  # quick again: once most of the last commits were, the loop again
        quick = await deliver(window)
        assert quick[-1] == loop_thread and loop_thread not in quick[:2]
    said = [r.getMessage() for r in caplog.records]
    assert said.count("commits are slow; writes commit in the writer thread") == 1
    assert said.count("commits are quick again; writes commit on the event loop") == 1


async def test_a_flush_of_repeat_counts_runs_and_commits_on_the_loop(writer: tuple[Writer, Traced]) -> None:
    store, traced = writer
    loop_thread = threading.get_ident()
    outcome = await store.submit(_job("gpu-007"))
    store.memory.remember(outcome.cache)  # committed: its repeats are counted in memory from now
    assert store.memory.count([("fp-gpu-007", T0, "firing")] * 3, T0) == 3
    since = traced.mark()
    for _ in range(100):  # the writer flushes within ``_FLUSH_EVERY``
        await asyncio.sleep(0.05)
        if traced.commits(since):
            break
    flush = traced.statements[since:]
    assert [thread for thread, sql in flush if sql.startswith("UPDATE alert_deliveries")] == [loop_thread]
    assert traced.commits(since) == [loop_thread]
    assert not store.memory.seen


def _safety(conn: sqlite3.Connection) -> int:
    """SQLite's ``synchronous`` on the writer's connection as the unit runs (1 NORMAL, 2 FULL)."""
    return int(conn.execute("PRAGMA synchronous").fetchone()[0])


async def test_a_write_done_again_if_lost_commits_on_the_loop_without_an_fsync_of_its_own(
    writer: tuple[Writer, Traced],
) -> None:
    store, traced = writer
    loop_thread = threading.get_ident()
    timed = list(store._commit_times)
    since = traced.mark()
    assert await store.submit(Redoable(_safety)) == 1  # NORMAL: no fsync at its commit
    assert traced.commits(since) == [loop_thread]  # where the engine's writes commit
    assert list(store._commit_times) == timed  # a commit without an fsync says nothing of the disk
    outcome = await store.submit(_job("gpu-009"))
    assert isinstance(outcome, IngestOutcome) and outcome.new_alerts == 1
    assert await store.submit(_safety) == 2  # FULL again, for every other write
    assert await store.submit(Bulk(_safety)) == 2
    assert await store.submit(Redoable(_safety)) == 1
    assert await store.submit(_safety) == 2
    assert len(store._commit_times) == len(timed) + 4

    # In one transaction with a write that must be durable, it commits as configured.
    holding, release = await _hold_thread(store)
    redone = asyncio.create_task(store.submit(Redoable(_safety)))
    durable = asyncio.create_task(store.submit(_safety))
    await asyncio.sleep(0.05)  # both queued while the thread is held: the writer batches them
    since = traced.mark()
    release.set()
    await holding
    assert (await redone, await durable) == (2, 2)
    assert len(traced.begun_by(since)) == 1


@pytest.mark.parametrize(("configured", "level"), [("normal", 1), ("off", 0)])
async def test_a_writer_that_does_not_sync_each_commit_is_left_as_configured(
    tmp_path: Path, configured: str, level: int
) -> None:
    store = Writer(tmp_path / "pitcrew.db", synchronous=configured)
    await store.open()
    try:
        assert await store.submit(Redoable(_safety)) == level  # never made stricter
        assert await store.submit(_safety) == level
    finally:
        await store.close()
