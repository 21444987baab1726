"""Row ↔ record conversion for the SQLite store: timestamps, JSON columns, faults."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import asdict
from datetime import datetime
from typing import Any

from bot.domain.faults import Fault
from bot.domain.incident import State
from bot.store.base import AlertRecord, ApprovalRecord, Event, IncidentRecord, StepRecord


def ts(value: datetime | None) -> str | None:
    return value.isoformat(timespec="microseconds") if value is not None else None


def dt(value: str | None) -> datetime | None:
    return datetime.fromisoformat(value) if value else None


def dumps(value: Mapping[str, Any] | list[Any] | tuple[Any, ...]) -> str:
    return json.dumps(value, separators=(",", ":"), sort_keys=True, default=str)


def fault_json(fault: Fault) -> str:
    return dumps(asdict(fault))


def fault_from(text: str) -> Fault:
    return Fault(**json.loads(text))


def incident_from(row: Any, faults: tuple[Fault, ...] = ()) -> IncidentRecord:
    opened, updated = dt(row["opened_at"]), dt(row["updated_at"])
    assert opened is not None and updated is not None
    return IncidentRecord(
        id=row["id"],
        node=row["node"],
        state=State(row["state"]),
        opened_at=opened,
        updated_at=updated,
        first_alert_at=dt(row["first_alert_at"]),
        playbook=row["playbook"],
        mode=row["mode"],
        plan=json.loads(row["plan_json"]) if row["plan_json"] else None,
        step_index=row["step_index"],
        acted=bool(row["acted"]),
        guarded_at=dt(row["guarded_at"]),
        closed_at=dt(row["closed_at"]),
        outcome=row["outcome"],
        group_key=row["group_key"],
        faults=faults,
        faults_changed=bool(row["faults_changed"]),
    )


def alert_from(row: Any) -> AlertRecord:
    starts, first, last = dt(row["starts_at"]), dt(row["first_seen"]), dt(row["last_seen"])
    assert starts is not None and first is not None and last is not None
    return AlertRecord(
        fingerprint=row["fingerprint"],
        starts_at=starts,
        ends_at=dt(row["ends_at"]),
        status=row["status"],
        alertname=row["alertname"],
        node=row["node"],
        incident_id=row["incident_id"],
        fault_key=row["fault_key"],
        deliveries=row["deliveries"],
        first_seen=first,
        last_seen=last,
        labels=json.loads(row["labels_json"]),
    )


def event_from(row: Any) -> Event:
    at = dt(row["at"])
    assert at is not None
    return Event(
        seq=row["seq"],
        incident_id=row["incident_id"],
        at=at,
        kind=row["kind"],
        step=row["step"],
        outcome=row["outcome"],
        attempt=row["attempt"],
        actor=row["actor"],
        detail=row["detail"],
        data=json.loads(row["data_json"]),
    )


def step_from(row: Any) -> StepRecord:
    return StepRecord(
        incident_id=row["incident_id"],
        step=row["step"],
        status=row["status"],
        attempts=row["attempts"],
        started_at=dt(row["started_at"]),
        ended_at=dt(row["ended_at"]),
        result=json.loads(row["result_json"]),
    )


def approval_from(row: Any) -> ApprovalRecord:
    requested, deadline = dt(row["requested_at"]), dt(row["deadline"])
    assert requested is not None and deadline is not None
    return ApprovalRecord(
        incident_id=row["incident_id"],
        step=row["step"],
        requested_at=requested,
        deadline=deadline,
        approvers=tuple(json.loads(row["approvers_json"])),
        status=row["status"],
        decided_by=row["decided_by"],
        decided_at=dt(row["decided_at"]),
    )
