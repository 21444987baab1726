"""Group commit of webhook deliveries on Postgres: every delivery waiting, one transaction.

Alertmanager's deliveries arrive at once from many groups, and each is acknowledged only once
what it stores has committed. One transaction and one commit (one WAL flush) per delivery, each
under the write lock, made a replica as slow as its round trips and fsyncs in a row. Here a
replica's deliveries queue up; one task takes every one waiting (up to ``BATCH``), runs them in
one transaction and commits once, as SQLite's writer (``bot.store.writer``) does; each caller
hears back only after that commit.

Up to ``DEPTH`` batches are handed over at once: while one commits, the next already waits in
the writes' thread, which goes on to it at once, and the one after gathers. With one batch at a
time, the thread waited after every commit for the event loop to come round and hand it the next,
and took an engine write meanwhile. ``bench/ingest.py`` on Postgres, one replica, four pairs of
runs alternating on a noisy machine (the first two before the engine's turn below): saturated p99
54.1 → 41.5, 51.8 → 40.4, 50.7 → 35.1 and 67.7 → 57.6 ms; two replicas, within the noise. The
engine's writes still get their turn: the thread never runs two batches of deliveries in a row
while one waits (``bot.store.postgres._Lanes``).

A batch is worked out by one operation (``deliveries``): the repeat checks of the batch first
(one lookup of their keys, one update of the counters of those that are repeats), then the new
deliveries through ``bot.store.ingest`` with what that lookup found. A batch that stores anything
new takes the store's write lock (``exclusive``), so incident numbers, one incident per node and
the order of events stay what one writer at a time makes them; a batch of repeats only counts,
under the lock's shared mode: repeats of several replicas commit side by side, never beside a
writer. Every batch updates counters in key order, so two batches never wait on each other's rows.
Most repeats never come here: a replica answers those it remembers from memory and commits their
counts every second (``bot.store.repeats``); a batch looks up only what it does not remember, or
what comes while the database has not committed for a second.

If a batch fails for any reason but the database's (a delivery the database refuses), it is
rolled back and each delivery runs again alone, so a bad one fails only itself: the rule SQLite's
writer follows too, written once in ``bot.store.batch``.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from datetime import datetime

from bot.domain.alerts import AlertStatus, dedupe_key
from bot.store.base import Delivery, IngestOutcome, StoreUnavailable
from bot.store.batch import Answer, commit_batch
from bot.store.codec import ts
from bot.store.ingest import KeyState, bump_seen, ingest, known_keys
from bot.store.repeats import Counts, add, repeat, rows
from bot.store.sql import Op

#: Deliveries per transaction at most (the durable baseline of ``bench/ingest.py`` batches as many).
BATCH = 64
#: Batches handed over and not yet committed, at most.
DEPTH = 2


@dataclass(frozen=True, slots=True)
class Repeats:
    """Is every alert of a delivery stored in this status already? Then count it."""

    alerts: tuple[tuple[str, datetime, AlertStatus], ...]
    now: datetime


@dataclass(frozen=True, slots=True)
class Ingest:
    """A delivery to store in full."""

    delivery: Delivery
    now: datetime


Item = Repeats | Ingest
#: What an item gets back: a ``Repeats`` the number of alerts counted (``None``: not all were
#: repeats, nothing counted), an ``Ingest`` its outcome.
Result = int | None | IngestOutcome

#: Runs an operation in one transaction, under the write lock (``True``) or its shared mode; once
#: committed, hands the results to the ``Answer`` if there is one.
Transact = Callable[[Op[list[Result]], bool, Answer | None], Awaitable[list[Result]]]


def exclusive(items: Sequence[Item]) -> bool:
    """Whether a batch may store anything new (else it only counts repeats)."""
    return any(isinstance(item, Ingest) for item in items)


def deliveries(items: Sequence[Item]) -> Op[list[Result]]:
    """The batch's repeat checks (one lookup, one counter update), then its new deliveries."""
    results: list[Result] = [None] * len(items)
    checks = [(i, item) for i, item in enumerate(items) if isinstance(item, Repeats)]
    known: dict[tuple[str, str], KeyState] = {}
    wanted = [dedupe_key(fp, starts) for _, item in checks for fp, starts, _ in item.alerts]
    if wanted:
        known = yield from known_keys(wanted)
    seen: Counts = {}
    for index, check in checks:
        keys = [dedupe_key(fp, starts) for fp, starts, _ in check.alerts]
        if all(
            repeat(known.get(key), status) for key, (_, _, status) in zip(keys, check.alerts, strict=True)
        ):
            add(seen, keys, ts(check.now) or "")
            results[index] = len(keys)
    if seen:
        yield bump_seen(rows(seen))
    jobs = [(i, item) for i, item in enumerate(items) if isinstance(item, Ingest)]
    if jobs:
        stored = yield from ingest([(job.delivery, job.now) for _, job in jobs], known)
        for (index, _), outcome in zip(jobs, stored, strict=True):
            results[index] = outcome
    return results


class GroupCommit:
    """The queue of a replica's deliveries and the one task that hands them over to commit, a
    batch at a time and up to ``depth`` batches at once."""

    def __init__(self, transact: Transact, *, batch: int = BATCH, depth: int = DEPTH) -> None:
        self._transact = transact
        self._batch = batch
        self._depth = depth
        self._queue: asyncio.Queue[tuple[Item, asyncio.Future[Result]]] = asyncio.Queue()
        self._task: asyncio.Task[None] | None = None
        #: The batches handed over, each until its callers are answered.
        self._committing: set[asyncio.Task[None]] = set()

    def start(self) -> None:
        self._queue = asyncio.Queue()
        self._task = asyncio.create_task(self._loop(), name="pitcrew-store-group-commit")

    async def stop(self) -> None:
        """Commit what is queued, then stop; a delivery queued after that hears it was not stored."""
        task, self._task = self._task, None
        if task is None:
            return
        if not task.done():
            await self._queue.join()
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await asyncio.gather(*self._committing)
        while not self._queue.empty():
            _, future = self._queue.get_nowait()
            self._queue.task_done()
            if not future.done():
                future.set_exception(StoreUnavailable("store closed before this delivery was stored"))

    async def repeats(self, alerts: Sequence[tuple[str, datetime, AlertStatus]], now: datetime) -> int | None:
        result = await self._submit(Repeats(tuple(alerts), now))
        assert result is None or isinstance(result, int)
        return result

    async def ingest(self, delivery: Delivery, now: datetime) -> IngestOutcome:
        result = await self._submit(Ingest(delivery, now))
        assert isinstance(result, IngestOutcome)
        return result

    async def _submit(self, item: Item) -> Result:
        if self._task is None or self._task.done():
            raise StoreUnavailable("store is not open")
        future: asyncio.Future[Result] = asyncio.get_running_loop().create_future()
        self._queue.put_nowait((item, future))
        return await future

    async def _loop(self) -> None:
        slots = asyncio.Semaphore(self._depth)
        while True:
            batch = [await self._queue.get()]
            await slots.acquire()  # what comes meanwhile joins this batch
            while len(batch) < self._batch and not self._queue.empty():
                batch.append(self._queue.get_nowait())
            task = asyncio.create_task(self._commit(batch, slots.release), name="pitcrew-store-batch")
            self._committing.add(task)
            task.add_done_callback(self._committing.discard)

    async def _commit(
        self, batch: Sequence[tuple[Item, asyncio.Future[Result]]], release: Callable[[], None]
    ) -> None:
        """One batch handed over; once it committed (or failed), the next may be (``release``).
        Batches reach the thread in order; only a batch that failed on one of its deliveries runs
        them again one by one after the batch handed over behind it."""
        try:
            outcomes = await commit_batch([item for item, _ in batch], self._run, [f for _, f in batch])
        finally:
            release()
        for (_, future), outcome in zip(batch, outcomes, strict=True):
            if not future.done():  # its caller may have gone (a client hung up)
                if isinstance(outcome, BaseException):
                    future.set_exception(outcome)
                else:
                    future.set_result(outcome)
            self._queue.task_done()

    async def _run(self, part: Sequence[Item], answer: Answer | None) -> list[Result]:
        """``part`` of a batch in one transaction (``commit_batch``: if the batch fails on one of
        its deliveries, each runs alone); ``answer``: the whole batch's callers, answered from the
        thread that committed it."""
        return await self._transact(deliveries(part), exclusive(part), answer)
