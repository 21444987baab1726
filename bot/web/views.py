"""JSON shapes of the read API. These field names are public: scripts and dashboards use them.

An incident's detail carries one page of its alerts and one of its events; ``alerts_next`` and
``events_next`` are the cursors of the pages after them (``null``: there are no more).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from bot.domain.faults import Fault
from bot.store import codec
from bot.store.base import AlertRecord, ApprovalRecord, Event, IncidentRecord, StepRecord


def _ts(value: datetime | None) -> str | None:
    return value.isoformat() if value else None


def fault_view(fault: Fault) -> dict[str, Any]:
    return dict(codec.fault_document(fault))


def incident_view(incident: IncidentRecord) -> dict[str, Any]:
    plan = codec.encode_plan(incident.plan) if incident.plan is not None else {}
    return {
        "id": incident.id,
        "node": incident.node,
        "state": incident.state.value,
        "playbook": incident.playbook,
        "mode": incident.mode,
        "steps": plan.get("steps", []),
        "next_step": incident.step_index,
        "reasons": plan.get("reasons", []),
        "guards": plan.get("guards", []),
        "opened_at": _ts(incident.opened_at),
        "updated_at": _ts(incident.updated_at),
        "closed_at": _ts(incident.closed_at),
        "first_alert_at": _ts(incident.first_alert_at),
        "outcome": incident.outcome,
        "acted": incident.acted,
        "faults": [fault_view(f) for f in incident.faults],
    }


def alert_view(alert: AlertRecord) -> dict[str, Any]:
    return {
        "fingerprint": alert.fingerprint,
        "alertname": alert.alertname,
        "status": alert.status,
        "starts_at": _ts(alert.starts_at),
        "ends_at": _ts(alert.ends_at),
        "node": alert.node,
        "fault": alert.fault_key,
        "deliveries": alert.deliveries,
        "first_seen": _ts(alert.first_seen),
        "last_seen": _ts(alert.last_seen),
        "labels": dict(alert.labels),
    }


def event_view(event: Event) -> dict[str, Any]:
    return {
        "seq": event.seq,
        "at": _ts(event.at),
        "kind": event.kind,
        "step": event.step,
        "outcome": event.outcome,
        "attempt": event.attempt,
        "actor": event.actor,
        "detail": event.detail,
        "data": dict(event.data),
    }


def audit_record(event: Event) -> dict[str, Any]:
    """One line of ``pitcrew audit export``: the event as the read API shows it, with its incident
    (``null`` for what concerns none: a pause, a breaker reset)."""
    return {"incident_id": event.incident_id, **event_view(event)}


def step_view(step: StepRecord) -> dict[str, Any]:
    return {
        "step": step.step,
        "status": step.status,
        "attempts": step.attempts,
        "started_at": _ts(step.started_at),
        "ended_at": _ts(step.ended_at),
        "result": dict(step.result),
    }


def approval_view(approval: ApprovalRecord | None) -> dict[str, Any] | None:
    if approval is None:
        return None
    return {
        "step": approval.step,
        "status": approval.status,
        "requested_at": _ts(approval.requested_at),
        "deadline": _ts(approval.deadline),
        "approvers": list(approval.approvers),
        "decided_by": approval.decided_by,
        "decided_at": _ts(approval.decided_at),
    }


def incident_detail(
    incident: IncidentRecord,
    alerts: Sequence[AlertRecord],
    events: Sequence[Event],
    steps: dict[str, StepRecord],
    approval: ApprovalRecord | None,
    *,
    alerts_next: str | None = None,
    events_next: str | None = None,
    links: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """The incident in full; ``links``: where people see it, by destination (its Slack thread)."""
    return {
        **incident_view(incident),
        "links": dict(links or {}),
        "alerts": [alert_view(a) for a in alerts],
        "alerts_next": alerts_next,
        "events": [event_view(e) for e in events],
        "events_next": events_next,
        "step_records": [step_view(s) for s in steps.values()],
        "approval": approval_view(approval),
        "goodput": _goodput(steps),
    }


def _goodput(steps: dict[str, StepRecord]) -> Any:
    """What the fault cost (``bot.domain.goodput.Goodput`` as the close step stored it), or ``None``."""
    close = steps.get("close")
    return close.result.get("goodput") if close is not None and close.status == "ok" else None
