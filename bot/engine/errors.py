"""Errors that cross the port boundary.

Every integration translates its library's exceptions into one of these two, chaining the
original as ``__cause__``, so the engine decides retry-or-escalate without knowing which
library failed. ``reason`` is a short, bounded token (it becomes a log field and a metric
label), never a free-form message.
"""

from __future__ import annotations


class PitcrewError(Exception):
    """Root of pitcrew's own errors."""

    def __init__(self, message: str, *, reason: str = "error") -> None:
        super().__init__(message)
        self.reason = reason


class TransientError(PitcrewError):
    """The far side may succeed later (timeout, 5xx, 429, connection refused).

    ``retry_after`` is the far side's hint in seconds, when it gave one.
    """

    def __init__(self, message: str, *, reason: str = "transient", retry_after: float | None = None) -> None:
        super().__init__(message, reason=reason)
        self.retry_after = retry_after


class PermanentError(PitcrewError):
    """Retrying will not help (4xx other than 409/429, a refused precondition, bad data)."""
