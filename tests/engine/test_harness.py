"""The fake time the engine tests stand on: if it lied, every other test here would too.

Cases: sleepers wake in deadline order and the clock reads each deadline; ``wait`` ends
with True when its event is set first and with False after exactly its limit; a cancelled
sleeper does not hold time; ``advance`` wakes everyone on the way; settling waits for a
store write committing in the writer thread; a loop that never waits is reported, not
waited on for ever.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from bot.store.base import NewEvent
from bot.store.sqlite import SqliteStore
from tests.engine.harness import EPOCH, FakeTime, InFlight, Livelock


async def test_sleepers_wake_in_deadline_order() -> None:
    time = FakeTime()
    woke: list[tuple[str, float]] = []

    async def sleeper(name: str, seconds: float) -> None:
        await time.sleep(seconds)
        woke.append((name, time.elapsed))

    tasks = [asyncio.ensure_future(sleeper(n, s)) for n, s in (("c", 30), ("a", 5), ("b", 12.5))]
    while await time.jump():
        pass
    await asyncio.gather(*tasks)
    assert woke == [("a", 5), ("b", 12.5), ("c", 30)]
    assert time.now() == EPOCH.replace(second=30)


@pytest.mark.parametrize(("set_after", "limit", "result", "took"), [(3, 10, True, 3), (None, 10, False, 10)])
async def test_wait_races_the_event_against_the_limit(
    set_after: float | None, limit: float, result: bool, took: float
) -> None:
    time = FakeTime()
    event = asyncio.Event()

    async def setter() -> None:
        if set_after is not None:
            await time.sleep(set_after)
            event.set()

    setting = asyncio.ensure_future(setter())
    waiting = asyncio.ensure_future(time.wait(event, limit))
    while not waiting.done() and await time.jump():
        pass
    assert waiting.result() is result and time.elapsed == took
    await setting


async def test_a_cancelled_sleeper_holds_no_time() -> None:
    time = FakeTime()
    task = asyncio.ensure_future(time.sleep(60))
    await time.settle()
    task.cancel()
    assert await time.jump() is False and time.elapsed == 0


async def test_advance_wakes_every_sleeper_on_the_way() -> None:
    time = FakeTime()
    ticks: list[float] = []

    async def ticker() -> None:
        while True:
            await time.sleep(10)
            ticks.append(time.elapsed)

    task = asyncio.ensure_future(ticker())
    await time.advance(35)
    task.cancel()
    assert ticks == [10, 20, 30] and time.elapsed == 35


async def test_settling_waits_for_a_write_in_the_writer_thread(tmp_path: Path) -> None:
    time = FakeTime()
    sqlite = SqliteStore(tmp_path / "t.db", synchronous="off")
    await sqlite.open()
    try:
        store = InFlight(sqlite, time)
        write = asyncio.ensure_future(store.record(None, NewEvent("probe"), time.now()))
        await time.settle()
        assert write.done()  # settled means the commit came back, not merely that the loop idled
        assert [e.kind for e in await sqlite.events_since(0)] == ["probe"]
    finally:
        await sqlite.close()


async def test_a_loop_that_never_waits_is_reported() -> None:
    time = FakeTime()

    async def spin() -> None:
        while True:
            time.begin()
            time.end()
            await asyncio.sleep(0)

    task = asyncio.ensure_future(spin())
    with pytest.raises(Livelock):
        await time.settle()
    task.cancel()
