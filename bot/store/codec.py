"""Row ↔ record conversion: timestamps, JSON columns, faults — and the one serialisation of
plans and step results.

Plans and step results are frozen typed records (``bot.domain.planner.Plan``, each step's
result dataclass). They are written as JSON objects carrying ``"v": RECORD_VERSION`` and read
back into the same types by pydantic, so the store never hands the engine a bag of string
keys. Rows written before records were versioned (release 0.1.0, no ``"v"``) are upgraded
here, on read; nothing else knows old shapes.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import fields
from datetime import datetime
from typing import Any, TypeVar

from pydantic import TypeAdapter

from bot.domain.faults import Fault
from bot.domain.incident import State
from bot.domain.planner import Plan
from bot.store.base import AlertRecord, ApprovalRecord, Event, IncidentRecord, Json, JsonObject, StepRecord

#: Version of the JSON written for plans and step results; 1 is release 0.1.0 (unmarked).
RECORD_VERSION = 2
T = TypeVar("T")


_ADAPTERS: dict[type[Any], TypeAdapter[Any]] = {}


def _adapter(kind: type[T]) -> TypeAdapter[T]:
    adapter = _ADAPTERS.get(kind)
    if adapter is None:
        adapter = _ADAPTERS[kind] = TypeAdapter(kind)
    return adapter


def encode_record(record: object) -> dict[str, Json]:
    """A typed record (plan, step result) as the JSON object the store keeps."""
    data: dict[str, Json] = _adapter(type(record)).dump_python(record, mode="json")
    data["v"] = RECORD_VERSION
    return data


def decode_record(kind: type[T], raw: Mapping[str, Any]) -> T:
    """The typed record of ``kind`` from stored JSON; unknown keys (older or newer fields) are ignored."""
    record: T = _adapter(kind).validate_python({k: v for k, v in raw.items() if k != "v"})
    return record


def fault_document(fault: Fault) -> dict[str, Json]:
    """A fault as pitcrew shows it (API, ``pitcrew plan --json``, stored plans): its key, no node."""
    return {
        "key": fault.key,
        "kind": fault.kind,
        "xid": fault.xid,
        "gpu": fault.gpu,
        "bucket": fault.bucket,
        "class": fault.fault_class,
        "playbook": fault.playbook,
        "meaning": fault.meaning,
        "known": fault.known,
        "job_fatal": fault.job_fatal,
        "detail": fault.detail,
        "link": fault.link,
    }


def _fault_record(node: str, document: Mapping[str, Any]) -> dict[str, Any]:
    fields = {k: v for k, v in document.items() if k not in {"key", "class"}}
    return {**fields, "node": node, "fault_class": document.get("class", "unknown")}


def encode_plan(plan: Plan) -> dict[str, Json]:
    """The plan document: what the store keeps, the API shows and ``pitcrew plan --json`` prints."""
    data = encode_record(plan)
    data["faults"] = [fault_document(f) for f in plan.faults]
    data["decisive"] = fault_document(plan.decisive) if plan.decisive is not None else None
    return data


def decode_plan(raw: Mapping[str, Any]) -> Plan:
    if raw.get("v") is None:
        raw = _plan_v1(raw)
    node = str(raw.get("node", ""))
    decisive = raw.get("decisive")
    return decode_record(
        Plan,
        {
            **raw,
            "faults": [_fault_record(node, f) for f in raw.get("faults", [])],
            "decisive": _fault_record(node, decisive) if decisive else None,
        },
    )


def _plan_v1(raw: Mapping[str, Any]) -> dict[str, Any]:
    """0.1.0 kept fault summaries (key, xid, gpu, playbook, describe) and the decisive fault's key."""
    faults = [_fault_v1(f) for f in raw.get("faults", [])]
    decisive_key = (raw.get("decisive") or {}).get("key")
    decisive = next((f for f in faults if f["key"] == decisive_key), None)
    return {
        **{k: v for k, v in raw.items() if k not in {"faults", "decisive"}},
        "faults": faults,
        "decisive": decisive,
    }


def _fault_v1(brief: Mapping[str, Any]) -> dict[str, Any]:
    key = str(brief.get("key", "unknown"))
    xid = brief.get("xid")
    return {
        "key": key,
        "kind": "xid" if xid is not None else key.split("@", 1)[0],
        "gpu": brief.get("gpu"),
        "xid": xid,
        "bucket": None,
        "class": "unknown",
        "playbook": brief.get("playbook", "ask-human"),
        "job_fatal": False,
        "meaning": str(brief.get("describe", "")),
        "known": True,
    }


def ts(value: datetime | None) -> str | None:
    return value.isoformat(timespec="microseconds") if value is not None else None


def dt(value: str | None) -> datetime | None:
    return datetime.fromisoformat(value) if value else None


def dumps(value: Mapping[str, Any] | list[Any] | tuple[Any, ...]) -> str:
    return json.dumps(value, separators=(",", ":"), sort_keys=True, default=str)


#: A fault's fields, in the order ``fault_json`` reads them.
_FAULT_FIELDS = tuple(field.name for field in fields(Fault))


def fault_json(fault: Fault) -> str:
    """A fault as stored: every field, by name. Read field by field: ``dataclasses.asdict`` copies
    each value deeply, 10-15 us an alert, and a batch of deliveries works its alerts out under the
    write lock. A field that is not a scalar would be a change to make here."""
    return dumps({name: getattr(fault, name) for name in _FAULT_FIELDS})


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
        plan=decode_plan(json.loads(row["plan_json"])) if row["plan_json"] else None,
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
        annotations=json.loads(row["annotations_json"]),
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
        result=_object(json.loads(row["result_json"])),
    )


def _object(value: Json) -> JsonObject:
    return value if isinstance(value, dict) else {}


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
