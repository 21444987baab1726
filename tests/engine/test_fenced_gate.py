"""The last check before a far-side write: the pause switch, then the process's fence.

A leader stopped between a step's intent write and its call, past its lease, must not send the
call when it wakes (``tests/e2e/test_fencing.py`` shows it with SIGSTOP on Postgres). Cases, with
the fence on a fake monotonic clock and a counting scheduler:

* while the lease is valid a write goes out, and reads are never checked;
* once the fence's time is up the write is not sent: ``Deposed``, and the leadership loop is told;
* a standby (never granted) sends nothing;
* a forced rollback's ports (not held by a pause) are fenced all the same;
* while paused the write is held (``Held``) before the fence is asked.
"""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from bot.engine.context import Ports
from bot.engine.pause import PAUSE, Held, gated
from bot.store.base import Deposed
from bot.store.lease import Fence
from bot.store.sqlite import SqliteStore


class Scheduler:
    """Counts what reached the far side."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str]] = []

    async def down(self, name: str, reason: str) -> None:
        self.calls.append(("down", name))

    async def node(self, name: str) -> str:
        self.calls.append(("node", name))
        return "read"


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
async def store(tmp_path: Path) -> Any:
    opened = SqliteStore(tmp_path / "pitcrew.db", synchronous="off")
    await opened.open()
    yield opened
    await opened.close()


def _ports(scheduler: Scheduler) -> Ports:
    return Ports(scheduler=scheduler, cluster=None, notifier=None)  # type: ignore[arg-type]


async def test_a_write_goes_out_only_while_the_fence_holds(store: SqliteStore) -> None:
    scheduler, clock = Scheduler(), Clock()
    fence = Fence("me", monotonic=clock)
    told: list[str] = []
    fence.on_deposed(told.append)
    fence.grant(1, valid_until=102.0)
    ports = gated(_ports(scheduler), store, fence)
    await ports.scheduler.down("n1", "r")
    clock.now = 102.0  # stopped past the lease: woken with the call still to send
    with pytest.raises(Deposed):
        await ports.scheduler.down("n2", "r")
    assert await ports.scheduler.node("n3") == "read"  # type: ignore[comparison-overlap]  # reads pass
    assert scheduler.calls == [("down", "n1"), ("node", "n3")]
    assert len(told) == 1 and "may have lapsed" in told[0]


async def test_a_standby_sends_nothing(store: SqliteStore) -> None:
    scheduler = Scheduler()
    ports = gated(_ports(scheduler), store, Fence("me", monotonic=Clock()))
    with pytest.raises(Deposed):
        await ports.scheduler.down("n1", "r")
    assert scheduler.calls == []


async def test_a_forced_rollback_is_not_held_but_is_fenced(store: SqliteStore) -> None:
    scheduler, clock = Scheduler(), Clock()
    fence = Fence("me", monotonic=clock)
    fence.grant(1, valid_until=102.0)
    await store.set_switch(PAUSE, {"reason": "fabric"}, "ops", datetime.now(UTC))
    held = gated(_ports(scheduler), store, fence)
    with pytest.raises(Held):
        await held.scheduler.down("n1", "r")
    forced = gated(_ports(scheduler), store, fence, hold=False)
    await forced.scheduler.down("n2", "r")
    clock.now = 103.0
    with pytest.raises(Deposed):
        await forced.scheduler.down("n3", "r")
    assert scheduler.calls == [("down", "n2")]
