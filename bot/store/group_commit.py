"""Group commit of webhook deliveries on Postgres: every delivery waiting, one transaction.

Alertmanager's deliveries arrive at once from many groups, and each is acknowledged only once what
it stores has committed. One transaction and one commit (one WAL flush) per delivery, each under
the write lock, made a replica as slow as its round trips and fsyncs in a row. Here a replica's
deliveries queue up, and the store's writes (``bot.store.postgres._Writes``, each transaction a
task on the event loop) take every one waiting (up to ``BATCH``) at the moment they begin their
transaction, run them in it and commit once, as SQLite's writer (``bot.store.writer``) does; each
caller hears back only after that commit.

Taken when the transaction begins, not handed over when formed: a delivery waits for at most the
transaction under way (and one that has sent its ``COMMIT``: ``bot.store.postgres._Writes``) and
then its own. Before, a task formed batches and handed up to two over at once; a batch formed
while the writes were busy then sat in their queue with what it had, and deliveries that came
meanwhile gathered into a third. Timed under ``bench/ingest.py``'s saturated
stream on Postgres (one replica, 465 deliveries that stored something new), a delivery waited
3.7 ms (p50) for a batch to be formed, 6.2 ms for the writes, and ran 4.1 ms; taken when the
transaction begins, it waits 2.2 ms and runs 4.2 ms, in batches of two instead of one and a half.
``bench/ingest.py --rounds 3``, before and after: saturated p99 22.7 -> 16.1 ms on one replica
and 16.8 -> 14.3 ms on two; the stored deliveries' p50 16.8 -> 11.1 ms and 8.7 -> 7.8 ms. The
engine's writes still get their turn: no more than two batches of deliveries run in a row while
one waits (``bot.store.postgres._Lanes``).

A batch is worked out by one operation (``deliveries``): the repeat checks of the batch first
(one lookup of their keys), then the new deliveries through ``bot.store.ingest`` with what that
lookup found, the counters of the checks that are repeats updated with theirs. A batch that stores anything
new takes the store's write lock (``exclusive``), so incident numbers, one incident per node and
the order of events stay what one writer at a time makes them; a batch of repeats only counts,
under the lock's shared mode: repeats of several replicas commit side by side, never beside a
writer. Every batch updates counters in one statement, in key order (``bump_seen``), so neither
two batches nor a batch and a flush of counts (which takes no lock) wait on each other's rows in
a cycle.
Most repeats never come here: a replica answers those it remembers from memory and commits their
counts every second (``bot.store.repeats``); a batch looks up only what it does not remember, or
what comes while the database has not committed for a second.
The new deliveries' lookup (their alerts stored or not, their nodes' incidents) is not made when
the store can say what it would answer (``bot.store.expect``): the transaction confirms it in the
server instead, and its one message carries its writes and ``COMMIT``; if it does not hold,
nothing is kept and the batch runs again with its lookup (``Mispredicted``).

If a batch fails for any reason but the database's (a delivery the database refuses), it is
rolled back and each delivery runs again alone, so a bad one fails only itself: the rule SQLite's
writer follows too, written once in ``bot.store.batch`` (``each_alone``). The database's own
failure is every caller's, heard once the store has done what a lost server asks
(``Writes.failed``).
"""

from __future__ import annotations

import asyncio
import collections
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Protocol

from bot import logger
from bot.domain.alerts import AlertStatus, dedupe_key
from bot.store.base import Delivery, IngestOutcome, StoreUnavailable
from bot.store.batch import Answer, each_alone, settle
from bot.store.codec import ts
from bot.store.expect import Expectations, Expecting, Mispredicted
from bot.store.ingest import KeyState, bump_seen, ingest, known_keys
from bot.store.repeats import Counts, add, repeat, rows
from bot.store.sql import Op

log = logger(__name__)

#: Deliveries per transaction at most (the durable baseline of ``bench/ingest.py`` batches as many).
BATCH = 64


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


def exclusive(items: Sequence[Item]) -> bool:
    """Whether a batch may store anything new (else it only counts repeats)."""
    return any(isinstance(item, Ingest) for item in items)


def deliveries(items: Sequence[Item], expecting: Expecting | None = None) -> Op[list[Result]]:
    """The batch's repeat checks (one lookup), then its new deliveries (``expecting``: what their
    lookup may be expected to answer, ``bot.store.expect``); every counter in one update."""
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
    jobs = [(i, item) for i, item in enumerate(items) if isinstance(item, Ingest)]
    if jobs:  # the repeats counted in the new deliveries' one update of the counters
        stored = yield from ingest([(job.delivery, job.now) for _, job in jobs], known, rows(seen), expecting)
        for (index, _), outcome in zip(jobs, stored, strict=True):
            results[index] = outcome
    elif seen:
        yield bump_seen(rows(seen))
    return results


class Writes(Protocol):
    """The store's writes (``bot.store.postgres._Writes``), as the group commit uses them."""

    def put(self, work: Callable[[], Awaitable[None]]) -> None:
        """Run ``work`` by the writes, in the deliveries' lane; ``StoreUnavailable`` once closed."""

    async def transact(self, op: Op[list[Result]], exclusive: bool) -> list[Result]:
        """By the writes (a transaction's task): ``op`` in one transaction, under the write lock
        (``exclusive``) or its shared mode; its result once committed. Raises if it did not commit."""

    async def failed(self, exc: BaseException) -> None:
        """Before the callers of a batch that failed with ``exc`` hear of it."""

    async def alone(self, op: Op[list[Result]], exclusive: bool) -> list[Result]:
        """``transact`` in a transaction of its own: an item run alone after its batch failed on one
        of them."""


class GroupCommit:
    """A replica's deliveries, queued; the writes take every one waiting (up to ``batch``)
    at the moment they begin their transaction. One turn is put at a time (``_scheduled``),
    whatever comes meanwhile: the queue is what it takes."""

    def __init__(
        self, writes: Writes, *, batch: int = BATCH, expectations: Expectations | None = None
    ) -> None:
        self._writes = writes
        self._batch = batch
        #: What batches may expect their lookups to answer (``None``: they always look up).
        self.expectations = expectations
        self._pending: collections.deque[tuple[Item, asyncio.Future[Result]]] = collections.deque()
        self._scheduled = False  # a turn is put and has not yet taken its batch
        #: Callers not yet answered: ``stop`` waits for them.
        self._unanswered: set[asyncio.Future[Result]] = set()
        self._loop: asyncio.AbstractEventLoop | None = None  # ``None``: not started, or stopped
        self._failing: set[asyncio.Task[None]] = set()  # batches that failed, being answered

    def start(self) -> None:
        self._loop = asyncio.get_running_loop()

    async def stop(self) -> None:
        """Commit what is queued, then stop; a delivery queued after that hears it was not stored."""
        if self._loop is None:
            return
        self._loop = None
        await asyncio.gather(*self._unanswered, return_exceptions=True)
        await asyncio.gather(*self._failing)

    async def repeats(self, alerts: Sequence[tuple[str, datetime, AlertStatus]], now: datetime) -> int | None:
        result = await self._submit(Repeats(tuple(alerts), now))
        assert result is None or isinstance(result, int)
        return result

    async def ingest(self, delivery: Delivery, now: datetime) -> IngestOutcome:
        result = await self._submit(Ingest(delivery, now))
        assert isinstance(result, IngestOutcome)
        return result

    async def _submit(self, item: Item) -> Result:
        loop = self._loop
        if loop is None:
            raise StoreUnavailable("store is not open")
        future: asyncio.Future[Result] = loop.create_future()
        self._unanswered.add(future)
        future.add_done_callback(self._answered)
        self._pending.append((item, future))
        if not self._scheduled:
            self._scheduled = True
            self._schedule()
        # A caller that goes (a client hung up) cancels its future, not its delivery: the writes
        # commit it with the rest (and before they stop, ``_Lanes.close``), answering nobody.
        return await future

    def _answered(self, future: asyncio.Future[Result]) -> None:
        self._unanswered.discard(future)
        if not future.cancelled():
            future.exception()  # retrieved: nobody may be waiting for it any more

    def _schedule(self) -> None:
        """A turn of the writes for the deliveries waiting; if the writes are closed, they hear so."""
        try:
            self._writes.put(self._turn)
        except StoreUnavailable as exc:
            waiting = list(self._pending)
            self._pending.clear()
            self._scheduled = False
            self._fail(waiting, exc)

    async def _turn(self) -> None:
        """By the writes (a transaction's task): the deliveries waiting now (up to ``batch``), in
        one transaction, their callers answered once it committed, or (``_fail``) when it did not.
        What is left gets a turn of its own, after an engine write if one waits
        (``bot.store.postgres._Lanes``)."""
        batch = [self._pending.popleft() for _ in range(min(self._batch, len(self._pending)))]
        self._scheduled = bool(self._pending)
        if self._scheduled:
            self._schedule()
        if not batch:
            return
        items = [item for item, _ in batch]
        expectations = self.expectations
        expecting = None if expectations is None else expectations.turn(items[0].now)
        try:
            try:
                results = await self._writes.transact(deliveries(items, expecting), exclusive(items))
            except Mispredicted:  # nothing kept: the batch again, with its lookups
                assert expectations is not None
                expectations.missed()
                expecting = expectations.lookup()  # and what it finds is expected next
                results = await self._writes.transact(deliveries(items, expecting), exclusive(items))
        except BaseException as exc:  # heard by its callers, never the end of the transaction's task
            self._fail(batch, exc)
            if not isinstance(exc, Exception):
                raise
            return
        if expectations is not None and expecting is not None:
            expectations.committed(expecting)
        settle([future for _, future in batch], results)  # committed on the loop: at once

    def _fail(self, batch: Sequence[tuple[Item, asyncio.Future[Result]]], exc: BaseException) -> None:
        """The callers of ``batch`` hear of ``exc`` (``_answer_failed``), in a task of its own: the
        items of a batch that failed on one of them run again, each alone, behind the writes."""
        task = asyncio.get_running_loop().create_task(self._answer_failed(batch, exc))
        self._failing.add(task)
        task.add_done_callback(self._failing.discard)

    async def _answer_failed(
        self, batch: Sequence[tuple[Item, asyncio.Future[Result]]], exc: BaseException
    ) -> None:
        """A batch that did not commit: the database's failure (``StoreUnavailable``) is every
        caller's, heard once the store has done what it asks (``Writes.failed``); any other is one
        of its deliveries', so each runs alone (``bot.store.batch.each_alone``), unless it was
        alone already."""
        outcomes: list[Result | BaseException]
        if isinstance(exc, StoreUnavailable) or not isinstance(exc, Exception) or len(batch) == 1:
            await self._writes.failed(exc)
            outcomes = [exc] * len(batch)
        else:
            log.warning(
                "a batch failed; each of its items runs alone", extra={"items": len(batch), "error": str(exc)}
            )
            outcomes = list(await each_alone([item for item, _ in batch], self._alone))
        settle([future for _, future in batch], outcomes)

    async def _alone(self, part: Sequence[Item], answer: Answer | None) -> list[Result]:
        return await self._writes.alone(deliveries(part), exclusive(part))
