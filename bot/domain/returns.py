"""The repair ladder's second trigger: the fault back after the node was returned to service.

A rung's repair can look done — the node validated, resumed, back in service — and the same fault
fire again minutes later: the reset or the reboot did not clear it. A playbook with a ``next``
rung keeps its incident open for ``fault_returns_within`` after the node's return; an alert of
one of the incident's own faults that starts after the return and inside that watch climbs the
incident to the next rung (``bot.engine.admission.Admission.climb``), as a failed validation
does. A fault the incident did not have is a new fault (the replan's business), and an alert that
started before the return is the fault the rung was repairing, not its return.

Pure: the engine passes the return, the incident's alerts and the window; no clock is read here.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta

from bot.domain.durations import format_duration

#: Steps that put the node back into service: the node's return is when one of them ended.
RETURNS: frozenset[str] = frozenset({"slurm_resume", "slurm_returned"})


@dataclass(frozen=True, slots=True)
class Returned:
    """The node went back into service: by which step, and when."""

    step: str
    at: datetime


@dataclass(frozen=True, slots=True)
class AlertSeen:
    """An alert of the incident, as this rule reads it: which fault, and when it started firing."""

    fault_key: str | None
    starts_at: datetime


@dataclass(frozen=True, slots=True)
class FaultBack:
    """One of the incident's faults fired again after the node was returned."""

    fault_key: str
    returned: Returned
    started_at: datetime

    def words(self) -> str:
        after = format_duration(max(self.started_at - self.returned.at, timedelta(0)))
        return f"{self.fault_key} fired again {after} after {self.returned.step} returned the node"


def fault_back(
    returned: Returned,
    window: timedelta | None,
    fault_keys: Collection[str],
    alerts: Iterable[AlertSeen],
) -> FaultBack | None:
    """The first alert of one of ``fault_keys`` that started after the return and, with a
    ``window``, no later than the window's end; ``None`` when the fault has not come back."""
    latest = returned.at + window if window is not None else None
    back = [
        a
        for a in alerts
        if a.fault_key in fault_keys
        and a.starts_at > returned.at
        and (latest is None or a.starts_at <= latest)
    ]
    first = min(back, key=lambda a: a.starts_at, default=None)
    if first is None or first.fault_key is None:
        return None
    return FaultBack(first.fault_key, returned, first.starts_at)


def watched_until(returned: Returned, window: timedelta | None) -> datetime | None:
    """Until when the incident stays open for the fault to come back (``None``: it does not wait)."""
    return returned.at + window if window else None
