"""Watching a returned node for its fault to come back: the store's side of ``bot.domain.returns``.

Read by the flow at ``close``, before the summary: an incident whose playbook has a ``next`` rung
and whose node is back in service looks at its alerts; its own fault firing again since the return
climbs it to the next rung, and with ``fault_returns_within`` it stays open until that window has
passed (the intake signals it when one of its faults fires again, ``IngestOutcome.recurred``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime

from bot.domain.playbooks import PlaybookSet
from bot.domain.returns import RETURNS, AlertSeen, FaultBack, Returned, fault_back, watched_until
from bot.store.base import IncidentRecord, StepRecord, Store

#: The pseudo-step marking an incident that waits at ``close`` for its fault to come back.
RETURN_WATCH = "return_watch"


@dataclass(frozen=True, slots=True)
class ReturnLook:
    """What one look found: the return, the fault back (if it is), and how long the watch lasts."""

    returned: Returned
    next_rung: str
    back: FaultBack | None
    #: The incident stays open until then (``None``: it does not wait for the fault).
    until: datetime | None


async def look(
    store: Store, playbooks: PlaybookSet, incident: IncidentRecord, steps: Mapping[str, StepRecord]
) -> ReturnLook | None:
    """``None`` unless the incident's playbook has a next rung and its node was returned.
    ``steps``: as the flow read them at the top of this move (the returning steps are the node
    track's own, which nothing else writes)."""
    playbook = playbooks.playbooks.get(incident.playbook or "")
    if playbook is None or playbook.next is None:
        return None
    ends = [
        Returned(name, record.ended_at)
        for name, record in steps.items()
        if name in RETURNS and record.status == "ok" and record.ended_at is not None
    ]
    if not ends:
        return None
    returned = max(ends, key=lambda r: r.at)
    window = playbook.fault_returns_within
    alerts = [AlertSeen(a.fault_key, a.starts_at) for a in await store.alerts_of(incident.id)]
    back = fault_back(returned, window, {f.key for f in incident.faults}, alerts)
    return ReturnLook(returned, playbook.next, back, watched_until(returned, window))
