"""Waiting incidents look again after a bound spread per incident, never after more than ``RECHECK``.

Cases: incidents opened together (a storm) and all waiting without a limit wake spread over the
window ``RECHECK_SPREAD`` sets, none later than ``RECHECK`` — on the old fixed bound they all woke
in the same instant; a limit the caller asked for below that bound ends the wait exactly then;
a signal ends a wait at once; a fault again ends only a wait watching for its return; the bound
is injectable and capped at ``RECHECK``. On fake time
(``tests.engine.harness.FakeTime``), so the instants are exact.
"""

from __future__ import annotations

import asyncio
from collections import Counter

import pytest

from bot.engine.signals import RECHECK, RECHECK_SPREAD, Signals, recheck_after
from tests.engine.harness import FakeTime

STORM = [f"pc-{n:05d}" for n in range(1, 201)]  # the store's incident ids, opened together
BINS = 10


async def woken_at(time: FakeTime, signals: Signals, waits: dict[str, float | None]) -> dict[str, float]:
    """Virtual second at which each incident's wait ends, none signalled."""
    ends: dict[str, float] = {}

    async def one(incident_id: str, limit: float | None) -> None:
        await signals.wait(incident_id, limit)
        ends[incident_id] = time.elapsed

    tasks = [asyncio.create_task(one(i, limit)) for i, limit in waits.items()]
    await time.advance(2 * RECHECK)
    assert all(t.done() for t in tasks)
    return ends


async def test_incidents_waiting_together_look_again_spread_over_the_window() -> None:
    time = FakeTime()
    ends = await woken_at(time, Signals(time), dict.fromkeys(STORM))
    low = (1 - RECHECK_SPREAD) * RECHECK
    assert all(low <= at <= RECHECK for at in ends.values()), sorted(ends.values())
    width = (RECHECK - low) / BINS
    bins = Counter(min(int((at - low) / width), BINS - 1) for at in ends.values())
    # Every tenth of the window gets a share (uniform would be 20 of 200), no instant a crowd.
    assert all(bins[b] >= len(STORM) / BINS / 2 for b in range(BINS)), bins
    assert max(Counter(ends.values()).values()) <= 2


@pytest.mark.parametrize(
    ("limit", "ends"),
    [
        (0.5, 0.5),  # an explicit limit below the bound is kept as asked
        (5.0, 5.0),
        ((1 - RECHECK_SPREAD) * RECHECK - 0.25, (1 - RECHECK_SPREAD) * RECHECK - 0.25),
        (None, "bound"),  # no limit: the incident's bound
        (10 * RECHECK, "bound"),  # a far deadline (an approval's): looked at again by the bound
    ],
)
async def test_a_wait_ends_at_its_limit_or_the_incidents_bound(limit: float | None, ends: object) -> None:
    time = FakeTime()
    at = await woken_at(time, Signals(time), {"pc-00007": limit})
    assert at["pc-00007"] == pytest.approx(recheck_after("pc-00007") if ends == "bound" else ends)


@pytest.mark.parametrize("limit", [None, 5.0, 10 * RECHECK])
async def test_a_signal_ends_a_wait_at_once(limit: float | None) -> None:
    time, woken = FakeTime(), asyncio.Event()
    signals = Signals(time)

    async def waiting() -> None:
        await signals.wait("pc-00001", limit)
        woken.set()

    task = asyncio.create_task(waiting())
    await time.advance(1.0)
    assert not woken.is_set()
    signals.signal("pc-00001")
    await time.settle()
    assert woken.is_set() and time.elapsed == 1.0
    await task


@pytest.mark.parametrize(("injected", "ends"), [(RECHECK, RECHECK), (7.0, 7.0), (10 * RECHECK, RECHECK)])
async def test_the_bound_is_injectable_and_never_past_recheck(injected: float, ends: float) -> None:
    time = FakeTime()
    at = await woken_at(time, Signals(time, recheck=lambda _: injected), dict.fromkeys(STORM[:3]))
    assert set(at.values()) == {ends}


async def test_a_fault_again_ends_only_a_wait_that_watches_for_its_return() -> None:
    """``Signals.fault_again`` (a new occurrence of a fault the incident has) signals a flow that
    watches for its return and no other; an incident forgotten (ended) watches no more."""
    time = FakeTime()
    signals = Signals(time)
    ended: dict[str, float] = {}

    async def waiting(incident_id: str) -> None:
        await signals.wait(incident_id, None)
        ended[incident_id] = time.elapsed

    signals.watch_returns("pc-00001", True)
    signals.watch_returns("pc-00002", True)
    signals.watch_returns("pc-00002", False)
    tasks = [asyncio.create_task(waiting(i)) for i in ("pc-00001", "pc-00002")]
    await time.advance(1.0)
    for incident_id in ("pc-00001", "pc-00002"):
        signals.fault_again(incident_id)
    await time.settle()
    assert ended == {"pc-00001": 1.0}
    signals.signal("pc-00002")  # any other signal still ends its wait
    await time.settle()
    assert ended == {"pc-00001": 1.0, "pc-00002": 1.0}
    await asyncio.gather(*tasks)
    signals.forget([])
    task = asyncio.create_task(waiting("pc-00001"))
    await time.advance(1.0)
    signals.fault_again("pc-00001")
    await time.settle()
    assert ended["pc-00001"] == 1.0, "an incident forgotten still watched for its return"
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
