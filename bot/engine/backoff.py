"""The one backoff policy: how long to wait before trying a far side again.

Both retry loops use it: the executor's (tenacity, a step's transient failures) and the outbox
sender's (a notice or annotation its destination refused for now). The delay doubles from
``initial`` up to ``maximum`` and is jittered downwards, so that a hundred incidents failing
against one far side at once do not come back in step; a far side that said when to come back
(``TransientError.retry_after``: Slack's ``Retry-After``, a Kubernetes Status'
``retryAfterSeconds``) is waited for at least that long, plus a little spread of our own.
Pure arithmetic: the caller sleeps, on its own timer.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass

from tenacity import RetryCallState

from bot.engine.errors import TransientError


@dataclass(frozen=True, slots=True)
class Backoff:
    #: The first delay, in seconds; each further failure doubles it.
    initial: float = 1.0
    #: No computed delay exceeds this (a far side's ``retry_after`` may: it is its word).
    maximum: float = 60.0
    #: The share of each delay taken off at random: 0.5 waits between half of it and all of it.
    jitter: float = 0.5

    def __post_init__(self) -> None:
        if self.initial <= 0 or self.maximum < self.initial:
            raise ValueError(f"backoff needs 0 < initial <= maximum, not {self.initial} and {self.maximum}")
        if not 0 <= self.jitter <= 1:
            raise ValueError(f"backoff jitter is a share between 0 and 1, not {self.jitter}")

    def delay(
        self, failures: int, retry_after: float | None = None, *, rand: Callable[[], float] = random.random
    ) -> float:
        """Seconds to wait after ``failures`` failures in a row (1: the first).

        ``rand`` draws from [0, 1) (tests pass a fixed one). With ``retry_after`` the wait is
        that, plus up to ``jitter`` of ``initial``, so callers told the same moment spread out.
        """
        if retry_after is not None and retry_after > 0:
            return retry_after + self.initial * self.jitter * rand()
        # Doubling stops at the ceiling before it can overflow a float.
        ceiling = self.maximum
        if failures <= 1:
            ceiling = self.initial
        elif failures - 1 < 64:
            ceiling = min(self.maximum, self.initial * 2.0 ** (failures - 1))
        return ceiling * (1 - self.jitter * rand())

    def tenacity_wait(self) -> Callable[[RetryCallState], float]:
        """This policy as tenacity's ``wait``: the attempt's number counts the failures, and a
        ``TransientError``'s ``retry_after`` is honoured."""

        def wait(state: RetryCallState) -> float:
            error = state.outcome.exception() if state.outcome is not None else None
            retry_after = error.retry_after if isinstance(error, TransientError) else None
            return self.delay(state.attempt_number, retry_after)

        return wait
