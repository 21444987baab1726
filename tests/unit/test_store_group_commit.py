"""Postgres's group commit of deliveries, and the lanes of its writes' thread.

``GroupCommit`` hands up to ``DEPTH`` batches over at once: while one commits, the next already
waits for the thread, and what comes meanwhile gathers into the one after. Cases, with a
transaction that commits only when the test lets it: with two at a time the second batch is
handed over before the first commits, and everything that came meanwhile is one third batch;
one at a time, nothing is handed over until the first commits; ``stop`` commits what is queued
and what waits for a slot. ``_Lanes`` (the writes' thread's order): deliveries before the
engine's writes put earlier, but never two deliveries in a row while an engine write waits;
after ``close`` what was put is still taken, then nothing.
"""

from __future__ import annotations

import asyncio
import functools
import threading
from datetime import UTC, datetime

import pytest

from bot.store.batch import Answer
from bot.store.group_commit import GroupCommit, Result
from bot.store.postgres import _Lanes
from bot.store.sql import Op

NOW = datetime(2026, 12, 3, tzinfo=UTC)


class Thread:
    """Stands in for the writes' thread: each transaction commits when the test says so."""

    def __init__(self) -> None:
        self.batches: list[int] = []  # items per transaction, in the order handed over
        self.commit: list[asyncio.Event] = []

    async def transact(self, op: Op[list[Result]], exclusive: bool, answer: Answer | None) -> list[Result]:
        # A batch of repeats with no alerts asks the database nothing: the operation ends at once.
        try:
            next(op)
        except StopIteration as done:
            results: list[Result] = done.value
        else:
            raise AssertionError("no statement expected")
        self.batches.append(len(results))
        self.commit.append(asyncio.Event())
        await self.commit[-1].wait()
        if answer is not None:
            answer(results)
        return results


async def _settle() -> None:
    for _ in range(10):
        await asyncio.sleep(0)


def _submit(group: GroupCommit, count: int) -> list[asyncio.Task[int | None]]:
    return [asyncio.create_task(group.repeats((), NOW)) for _ in range(count)]


async def test_the_next_batch_is_handed_over_before_the_one_ahead_commits() -> None:
    thread = Thread()
    group = GroupCommit(thread.transact, depth=2)
    group.start()
    first = _submit(group, 1)
    await _settle()
    second = _submit(group, 2)
    await _settle()
    assert thread.batches == [1, 2]  # both handed over; neither committed
    third = _submit(group, 3)
    await _settle()
    assert thread.batches == [1, 2]  # no slot: these gather
    thread.commit[0].set()
    await _settle()
    assert thread.batches == [1, 2, 3] and all(t.done() for t in first)
    assert not any(t.done() for t in second + third)
    thread.commit[1].set()
    thread.commit[2].set()
    assert await asyncio.gather(*second, *third) == [0] * 5
    await group.stop()


async def test_one_at_a_time_nothing_is_handed_over_until_the_batch_ahead_commits() -> None:
    thread = Thread()
    group = GroupCommit(thread.transact, depth=1)
    group.start()
    _submit(group, 1)
    await _settle()
    rest = _submit(group, 4)
    await _settle()
    assert thread.batches == [1]
    thread.commit[0].set()
    await _settle()
    assert thread.batches == [1, 4]
    thread.commit[1].set()
    await asyncio.gather(*rest)
    await group.stop()


async def test_stop_commits_what_is_queued_and_what_waits_for_a_slot() -> None:
    thread = Thread()
    group = GroupCommit(thread.transact, depth=2)
    group.start()
    tasks = _submit(group, 1)
    await _settle()
    tasks += _submit(group, 2)
    await _settle()
    tasks += _submit(group, 2)  # waiting for a slot
    await _settle()
    stopping = asyncio.create_task(group.stop())
    while not all(t.done() for t in tasks):
        for event in thread.commit:
            event.set()
        await asyncio.sleep(0)
    await stopping
    assert thread.batches == [1, 2, 2] and [t.result() for t in tasks] == [0] * 5


def _lanes(*puts: tuple[str, bool]) -> tuple[_Lanes, list[str]]:
    """Lanes holding one work per name; the list the works append their names to when run."""
    lanes, ran = _Lanes(), list[str]()
    for name, first in puts:
        lanes.put(functools.partial(ran.append, name), first=first)
    return lanes, ran


def _take(lanes: _Lanes, ran: list[str], count: int) -> list[str]:
    for _ in range(count):
        work = lanes.get()
        assert work is not None
        work()
    return ran


@pytest.mark.parametrize(
    ("puts", "order"),
    [
        # Deliveries go before the engine's writes put earlier...
        ([("e1", False), ("d1", True)], ["d1", "e1"]),
        # ... but never two in a row while an engine write waits.
        (
            [("e1", False), ("e2", False), ("d1", True), ("d2", True), ("d3", True)],
            ["d1", "e1", "d2", "e2", "d3"],
        ),
        # With no engine write waiting, one after the other.
        ([("d1", True), ("d2", True), ("e1", False)], ["d1", "e1", "d2"]),
        ([("d1", True), ("d2", True)], ["d1", "d2"]),
        ([("e1", False), ("e2", False)], ["e1", "e2"]),
    ],
)
def test_the_writes_thread_takes_deliveries_first_and_never_starves_the_engine(
    puts: list[tuple[str, bool]], order: list[str]
) -> None:
    assert _take(*_lanes(*puts), len(order)) == order


def test_closed_lanes_give_what_was_put_then_nothing_and_a_waiting_thread_hears_it() -> None:
    lanes, ran = _lanes(("e1", False), ("d1", True))
    lanes.close()
    assert _take(lanes, ran, 2) == ["d1", "e1"]
    assert lanes.get() is None

    waiting = _Lanes()
    got: list[object] = []
    thread = threading.Thread(target=lambda: got.append(waiting.get()))
    thread.start()
    waiting.close()
    thread.join(timeout=5)
    assert got == [None] and not thread.is_alive()
