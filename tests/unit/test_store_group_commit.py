"""Postgres's group commit of deliveries, and the lanes of its writes.

``GroupCommit`` queues a replica's deliveries and the writes take every one waiting (up to
``batch``) at the moment they begin their transaction. Cases, with writes of the test's own (a task
taking work from the real ``_Lanes``, each transaction committing only when the test lets it):
what comes while a transaction runs is the next one, whole; more than a batch waiting goes in
turns, an engine write waiting after two; a batch that fails on one delivery runs each alone,
and only that one fails; the database's failure is every caller's, heard after the store has done
what it asks; closed writes fail their callers; ``stop`` commits what is queued, then refuses.
``_Lanes`` (the writes' order): deliveries before the engine's writes put earlier, but never three
deliveries in a row while an engine write waits; after ``close`` what was put is still taken, then
nothing.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import UTC, datetime

import pytest

from bot.store.base import StoreUnavailable
from bot.store.group_commit import GroupCommit, Result
from bot.store.postgres import _Lanes
from bot.store.sql import Op

NOW = datetime(2026, 12, 3, tzinfo=UTC)


class Writes:
    """Stands in for the store's writes: a task taking work from the real ``_Lanes``; each
    transaction answers the operation's statements as an empty database would, fails if one names
    ``bad``, and commits when the test lets it (``release``)."""

    def __init__(self) -> None:
        self.lanes = _Lanes()
        self.ran: list[str] = []  # what the writes ran, in order: "d<items>" or an engine write's name
        self.closed = False
        self.go = asyncio.Semaphore(0)  # a permit a transaction
        self.heard: list[str] = []  # the store's side: ``failed`` and ``alone`` calls
        self.failures: list[BaseException | None] = []  # the transactions' in turn (none left: commit)
        self._ready = asyncio.Event()
        self._task = asyncio.create_task(self._serve())

    async def _serve(self) -> None:
        """One work at a time, in the order the lanes give them, until they are closed and empty."""
        while True:
            work = self.lanes.take()
            if work is not None:
                await work()
            elif self.lanes.closed:
                return
            else:
                self._ready.clear()
                await self._ready.wait()

    def _put(self, work: Callable[[], Awaitable[None]], *, first: bool) -> None:
        self.lanes.put(work, first=first)
        self._ready.set()

    def put(self, work: Callable[[], Awaitable[None]]) -> None:
        if self.closed:
            raise StoreUnavailable("store is not open")
        self._put(work, first=True)

    def engine_write(self, name: str) -> None:
        self._put(_appending(self.ran, name), first=False)

    async def transact(self, op: Op[list[Result]], exclusive: bool) -> list[Result]:
        await asyncio.wait_for(self.go.acquire(), timeout=10)  # else the test never let it commit
        results = _run(op)
        self.ran.append(f"d{len(results)}")
        failure = self.failures.pop(0) if self.failures else None
        if failure is not None:
            raise failure
        return results

    async def failed(self, exc: BaseException) -> None:
        self.heard.append(f"failed: {exc}")

    async def alone(self, op: Op[list[Result]], exclusive: bool) -> list[Result]:
        self.heard.append("alone")
        return _run(op)

    def release(self, count: int = 1) -> None:
        for _ in range(count):
            self.go.release()

    async def close(self) -> None:
        self.closed = True
        self.lanes.close()
        self._ready.set()
        await asyncio.wait_for(self._task, timeout=10)


def _appending(ran: list[str], name: str) -> Callable[[], Awaitable[None]]:
    """A work that appends ``name`` to ``ran`` when run."""

    async def work() -> None:
        ran.append(name)

    return work


def _run(op: Op[list[Result]]) -> list[Result]:
    """Drive ``op`` as an empty database answers it; ``ValueError`` if a statement names ``bad``."""
    answer: object = None
    try:
        while True:
            stmt = op.send(answer)
            if "bad" in repr(stmt.params):
                raise ValueError("the database refused a row")
            answer = {"all": [], "run": 0, "many": None, "one": None}[stmt.kind]
    except StopIteration as done:
        results: list[Result] = done.value
        return results


def _submit(group: GroupCommit, *fingerprints: str) -> list[asyncio.Task[int | None]]:
    """A repeat check a fingerprint (``""``: one of no alerts, which asks the database nothing)."""
    return [
        asyncio.create_task(group.repeats([(fp, NOW, "firing")] if fp else [], NOW)) for fp in fingerprints
    ]


@pytest.fixture
async def writes() -> AsyncIterator[Writes]:
    made = Writes()
    yield made
    made.release(100)
    await made.close()


async def test_what_comes_while_a_transaction_runs_is_the_next_one_whole(writes: Writes) -> None:
    group = GroupCommit(writes)
    group.start()
    first = _submit(group, "")
    await asyncio.sleep(0.05)  # its transaction begun, waiting to commit
    rest = []
    for _ in range(5):  # one at a time: each would have been a batch of its own, handed over
        rest += _submit(group, "")
        await asyncio.sleep(0.01)
    writes.release(2)
    assert await asyncio.gather(*first, *rest) == [0] * 6
    assert writes.ran == ["d1", "d5"]
    await group.stop()


async def test_more_than_a_batch_waiting_goes_in_turns_and_an_engine_write_waiting_goes_after_two(
    writes: Writes,
) -> None:
    group = GroupCommit(writes, batch=3)
    group.start()
    first = _submit(group, "")
    await asyncio.sleep(0.05)
    rest = _submit(group, *[""] * 7)
    await asyncio.sleep(0.05)
    writes.engine_write("engine")
    writes.release(4)
    assert await asyncio.gather(*first, *rest) == [0] * 8
    assert writes.ran == ["d1", "d3", "engine", "d3", "d1"]
    await group.stop()


async def test_a_batch_failing_on_one_delivery_runs_each_alone_and_only_that_one_fails(
    writes: Writes,
) -> None:
    group = GroupCommit(writes)
    group.start()
    first = _submit(group, "")
    await asyncio.sleep(0.05)
    batch = _submit(group, "fp1", "bad", "fp2")
    await asyncio.sleep(0.05)
    writes.release(2)
    outcomes = await asyncio.gather(*first, *batch, return_exceptions=True)
    assert outcomes[0] == 0 and outcomes[1] is None and outcomes[3] is None, outcomes
    assert isinstance(outcomes[2], ValueError), outcomes
    assert writes.heard == ["alone"] * 3
    await group.stop()


async def test_the_database_failing_is_every_caller_s_once_the_store_has_heard_it(writes: Writes) -> None:
    group = GroupCommit(writes)
    group.start()
    writes.failures = [None, StoreUnavailable("server closed the connection")]
    first = _submit(group, "")
    await asyncio.sleep(0.05)
    calls = _submit(group, "fp1", "fp2")
    await asyncio.sleep(0.05)
    writes.release(2)
    assert await asyncio.gather(*first) == [0]
    outcomes = await asyncio.gather(*calls, return_exceptions=True)
    assert [str(o) for o in outcomes] == ["server closed the connection"] * 2, outcomes
    assert all(isinstance(o, StoreUnavailable) for o in outcomes)
    assert writes.heard == ["failed: server closed the connection"]  # never run alone
    await group.stop()


async def test_closed_writes_fail_its_callers_and_leaves_nothing_queued(writes: Writes) -> None:
    group = GroupCommit(writes)
    group.start()
    await writes.close()
    with pytest.raises(StoreUnavailable):
        await asyncio.gather(*_submit(group, "fp1"))
    with pytest.raises(StoreUnavailable):  # tried again, not left waiting behind the first
        await asyncio.gather(*_submit(group, "fp2"))
    await asyncio.wait_for(group.stop(), timeout=5)


async def test_stop_commits_what_is_queued_then_refuses(writes: Writes) -> None:
    group = GroupCommit(writes)
    group.start()
    tasks = _submit(group, "")
    await asyncio.sleep(0.05)
    tasks += _submit(group, "", "")
    gone = _submit(group, "")[0]  # its caller goes (a client hung up): still committed, with the rest
    await asyncio.sleep(0.05)
    gone.cancel()
    stopping = asyncio.create_task(group.stop())
    await asyncio.sleep(0.05)
    assert not stopping.done()
    writes.release(2)
    await asyncio.wait_for(stopping, timeout=5)
    assert [t.result() for t in tasks] == [0] * 3 and writes.ran == ["d1", "d3"]
    with pytest.raises(StoreUnavailable):
        await group.repeats([], NOW)


def _lanes(*puts: tuple[str, bool]) -> tuple[_Lanes, list[str]]:
    """Lanes holding one work per name; the list the works append their names to when run."""
    lanes, ran = _Lanes(), list[str]()
    for name, first in puts:
        lanes.put(_appending(ran, name), first=first)
    return lanes, ran


async def _take(lanes: _Lanes, ran: list[str], count: int) -> list[str]:
    for _ in range(count):
        work = lanes.take()
        assert work is not None
        await work()
    return ran


@pytest.mark.parametrize(
    ("puts", "order"),
    [
        # Deliveries go before the engine's writes put earlier...
        ([("e1", False), ("d1", True)], ["d1", "e1"]),
        # ... but never three in a row while an engine write waits.
        (
            [
                ("e1", False),
                ("e2", False),
                ("d1", True),
                ("d2", True),
                ("d3", True),
                ("d4", True),
                ("d5", True),
            ],
            ["d1", "d2", "e1", "d3", "d4", "e2", "d5"],
        ),
        ([("d1", True), ("d2", True), ("d3", True), ("e1", False)], ["d1", "d2", "e1", "d3"]),
        # With no engine write waiting, one after the other.
        ([("d1", True), ("d2", True)], ["d1", "d2"]),
        ([("e1", False), ("e2", False)], ["e1", "e2"]),
    ],
)
async def test_the_writes_take_deliveries_first_and_never_starve_the_engine(
    puts: list[tuple[str, bool]], order: list[str]
) -> None:
    assert await _take(*_lanes(*puts), len(order)) == order


async def test_closed_lanes_give_what_was_put_then_nothing() -> None:
    lanes, ran = _lanes(("e1", False), ("d1", True))
    lanes.close()
    assert lanes.closed
    assert await _take(lanes, ran, 2) == ["d1", "e1"]
    assert lanes.take() is None
