"""The one backoff policy (``bot.engine.backoff.Backoff``), table-driven.

Cases: the first failure waits ``initial``, each further one doubles it up to ``maximum``, however
many failures (no overflow); the jitter takes off at most its share at random, never adds; a far
side's ``retry_after`` is waited for at least, above ``maximum`` too, plus at most ``jitter`` of
``initial``; no hint (``None`` or 0) falls back to the doubling; a policy that cannot work is
refused when it is made. As tenacity's ``wait`` it counts the attempt's failures and honours the
``TransientError``'s ``retry_after``; unjittered draws spread out.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

import pytest
from tenacity import AsyncRetrying, retry_if_exception_type, stop_after_attempt

from bot.engine.backoff import Backoff
from bot.engine.errors import Reason, TransientError

DEFAULT = Backoff(initial=1.0, maximum=60.0, jitter=0.5)


@dataclass(frozen=True)
class Case:
    failures: int
    retry_after: float | None
    draw: float
    expected: float
    policy: Backoff = DEFAULT


CASES = {
    "first failure, no jitter drawn": Case(1, None, 0.0, 1.0),
    "first failure, the most jitter": Case(1, None, 0.999, 1.0 * (1 - 0.5 * 0.999)),
    "second doubles": Case(2, None, 0.0, 2.0),
    "third doubles again": Case(3, None, 0.0, 4.0),
    "half the jitter on the sixth": Case(6, None, 0.5, 32.0 * 0.75),
    "capped at maximum": Case(7, None, 0.0, 60.0),
    "capped, jittered below it": Case(7, None, 0.999, 60.0 * (1 - 0.5 * 0.999)),
    "ten thousand failures: still the maximum": Case(10_000, None, 0.0, 60.0),
    "zero failures counts as the first": Case(0, None, 0.0, 1.0),
    "retry_after is waited for": Case(1, 5.0, 0.0, 5.0),
    "retry_after plus a spread of our own": Case(9, 5.0, 0.999, 5.0 + 1.0 * 0.5 * 0.999),
    "retry_after above the maximum is still honoured": Case(1, 120.0, 0.0, 120.0),
    "retry_after 0 is no hint": Case(3, 0.0, 0.0, 4.0),
    "no jitter: exact": Case(4, None, 0.999, 0.8, Backoff(initial=0.1, maximum=8.0, jitter=0.0)),
    "small initial, capped": Case(20, None, 0.0, 0.5, Backoff(initial=0.05, maximum=0.5)),
}


@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
def test_delay(case: Case) -> None:
    got = case.policy.delay(case.failures, case.retry_after, rand=lambda: case.draw)
    assert got == pytest.approx(case.expected)


REFUSED = {
    "zero initial": dict(initial=0.0, maximum=1.0),
    "maximum below initial": dict(initial=2.0, maximum=1.0),
    "jitter above one": dict(initial=1.0, maximum=2.0, jitter=1.5),
    "negative jitter": dict(initial=1.0, maximum=2.0, jitter=-0.1),
}


@pytest.mark.parametrize("arguments", REFUSED.values(), ids=REFUSED.keys())
def test_a_policy_that_cannot_work_is_refused(arguments: dict[str, float]) -> None:
    with pytest.raises(ValueError, match="backoff"):
        Backoff(**arguments)


def test_jitter_spreads_waiters_and_stays_within_its_share() -> None:
    policy = Backoff(initial=1.0, maximum=60.0, jitter=0.5)
    draws = random.Random(7)
    waits = [policy.delay(4, rand=draws.random) for _ in range(200)]
    assert all(4.0 <= w <= 8.0 for w in waits)
    assert len({round(w, 6) for w in waits}) > 150  # a herd that failed together does not return together
    told = [policy.delay(4, 2.0, rand=draws.random) for _ in range(200)]
    assert all(2.0 <= w <= 2.5 for w in told) and len({round(w, 6) for w in told}) > 150


async def test_as_tenacity_wait_it_counts_failures_and_honours_retry_after() -> None:
    policy = Backoff(initial=1.0, maximum=60.0, jitter=0.5)
    slept: list[float] = []

    async def sleep(seconds: float) -> None:
        slept.append(seconds)

    errors = [
        TransientError("down", reason=Reason.UNAVAILABLE),
        TransientError("down", reason=Reason.UNAVAILABLE),
        TransientError("slow down", reason=Reason.RATE_LIMITED, retry_after=30.0),
    ]
    retrying = AsyncRetrying(
        stop=stop_after_attempt(4),
        wait=policy.tenacity_wait(),
        retry=retry_if_exception_type(TransientError),
        sleep=sleep,
        reraise=True,
    )
    async for attempt in retrying:
        with attempt:
            if errors:
                raise errors.pop(0)
    assert len(slept) == 3
    assert 0.5 <= slept[0] <= 1.0  # the first failure
    assert 1.0 <= slept[1] <= 2.0  # the second: doubled
    assert 30.0 <= slept[2] <= 30.5  # the far side said 30 s: not a doubling (4 s)
