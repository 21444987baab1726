"""One Alertmanager delivery into the store, inside the writer's transaction.

Dedupe by ``(fingerprint, startsAt)``: a repeat only bumps ``last_seen``; a resolved
repeat marks the alert resolved (a stale firing repeat never un-resolves it). A new firing
alert attaches to the node's active incident or opens one; a resolved alert never opens an
incident. Alerts without a node are kept (``unroutable``) and never acted on.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import datetime
from typing import Any, TypeVar

import aiosqlite

from bot.domain.incident import State
from bot.store.base import Delivery, IngestOutcome, NewEvent
from bot.store.codec import dumps, fault_json, ts
from bot.store.schema import TERMINAL_STATES

_CHUNK = 400  # well under SQLite's bound-variable limit
T = TypeVar("T")


def _chunks(items: Sequence[T], size: int = _CHUNK) -> Iterable[Sequence[T]]:
    for start in range(0, len(items), size):
        yield items[start : start + size]


async def ingest(db: aiosqlite.Connection, delivery: Delivery, now: datetime) -> IngestOutcome:
    out = IngestOutcome()
    stamp = ts(now)
    keys = [(a.fingerprint, ts(a.starts_at)) for a in delivery.alerts]
    known = await _known(db, keys)
    active = await _active_incidents(db, {a.node for a in delivery.alerts if a.node})

    inserts: list[tuple[Any, ...]] = []
    seen_updates: list[tuple[Any, ...]] = []
    resolve_updates: list[tuple[Any, ...]] = []
    events: list[tuple[str | None, NewEvent]] = []
    changed: set[str] = set()
    next_seq: int | None = None

    for alert, key in zip(delivery.alerts, keys, strict=True):
        if key in known:
            out.repeated_alerts += 1
            status, seen_in = known[key]
            if status == "firing" and alert.status == "resolved":
                resolve_updates.append((ts(alert.ends_at), stamp, *key))
                known[key] = ("resolved", seen_in)
                out.resolved += 1
                events.append((seen_in, _alert_event("alert_resolved", alert.alertname, alert.fault, key)))
            else:
                seen_updates.append((stamp, *key))
            continue

        incident_id: str | None = None
        if alert.node is None or alert.fault is None:
            out.unroutable += 1
            events.append((None, NewEvent("alert_unroutable", detail=f"{alert.alertname}: no node label")))
        elif alert.status == "resolved":
            out.resolved += 1
            incident_id = active.get(alert.node, (None, None))[0]
            events.append(
                (incident_id, _alert_event("alert_resolved_unseen", alert.alertname, alert.fault, key))
            )
        else:
            incident_id, state = active.get(alert.node, (None, None))
            if incident_id is None:
                if next_seq is None:
                    next_seq = await _next_seq(db)
                incident_id = f"pc-{next_seq:05d}"
                await db.execute(
                    "INSERT INTO incidents (id, seq, node, state, opened_at, updated_at, first_alert_at, group_key)"
                    " VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                    (
                        incident_id,
                        next_seq,
                        alert.node,
                        State.OPEN.value,
                        stamp,
                        stamp,
                        ts(alert.starts_at),
                        delivery.group_key,
                    ),
                )
                next_seq += 1
                active[alert.node] = (incident_id, State.OPEN.value)
                out.opened.append(incident_id)
                events.append((incident_id, NewEvent("incident_opened", detail=f"node {alert.node}")))
            else:
                out.attached.append(incident_id)
                if state != State.OPEN.value:
                    changed.add(incident_id)
            events.append((incident_id, _alert_event("alert_firing", alert.alertname, alert.fault, key)))
        known[key] = (alert.status, incident_id)
        out.new_alerts += 1
        inserts.append(
            (
                key[0],
                key[1],
                ts(alert.ends_at),
                alert.status,
                alert.alertname,
                alert.node,
                incident_id,
                alert.fault.key if alert.fault else None,
                fault_json(alert.fault) if alert.fault else None,
                dumps(dict(alert.labels)),
                dumps(dict(alert.annotations)),
                delivery.group_key,
                stamp,
                stamp,
            )
        )

    if inserts:
        await db.executemany(
            "INSERT INTO alerts (fingerprint, starts_at, ends_at, status, alertname, node, incident_id, fault_key,"
            " fault_json, labels_json, annotations_json, group_key, first_seen, last_seen)"
            " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            inserts,
        )
    if seen_updates:
        await db.executemany(
            "UPDATE alerts SET last_seen = ?, deliveries = deliveries + 1 WHERE fingerprint = ? AND starts_at = ?",
            seen_updates,
        )
    if resolve_updates:
        await db.executemany(
            "UPDATE alerts SET status = 'resolved', ends_at = ?, last_seen = ?, deliveries = deliveries + 1"
            " WHERE fingerprint = ? AND starts_at = ?",
            resolve_updates,
        )
    if changed:
        await db.executemany(
            "UPDATE incidents SET faults_changed = 1, updated_at = ? WHERE id = ?",
            [(stamp, i) for i in changed],
        )
    await insert_events(db, events, now)
    return out


def _alert_event(kind: str, alertname: str, fault: Any, key: tuple[str, str | None]) -> NewEvent:
    detail = f"{alertname}: {fault.describe()}" if fault is not None else alertname
    return NewEvent(kind, detail=detail, data={"fingerprint": key[0], "starts_at": key[1]})


async def insert_events(
    db: aiosqlite.Connection, events: Sequence[tuple[str | None, NewEvent]], now: datetime
) -> None:
    if not events:
        return
    stamp = ts(now)
    await db.executemany(
        "INSERT INTO events (incident_id, at, kind, step, outcome, attempt, actor, detail, data_json)"
        " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
        [
            (i, stamp, e.kind, e.step, e.outcome, e.attempt, e.actor, e.detail, dumps(dict(e.data)))
            for i, e in events
        ],
    )


async def _known(db: aiosqlite.Connection, keys: Sequence[tuple[str, str | None]]) -> dict[Any, Any]:
    known: dict[Any, Any] = {}
    for chunk in _chunks(list(dict.fromkeys(keys))):
        placeholders = ",".join("(?, ?)" for _ in chunk)
        params = [v for key in chunk for v in key]
        async with db.execute(
            f"SELECT fingerprint, starts_at, status, incident_id FROM alerts"  # noqa: S608 - placeholders only
            f" WHERE (fingerprint, starts_at) IN (VALUES {placeholders})",
            params,
        ) as cursor:
            async for row in cursor:
                known[(row[0], row[1])] = (row[2], row[3])
    return known


async def _active_incidents(db: aiosqlite.Connection, nodes: set[str]) -> dict[str, tuple[str, str]]:
    found: dict[str, tuple[str, str]] = {}
    for chunk in _chunks(sorted(nodes)):
        placeholders = ",".join("?" for _ in chunk)
        async with db.execute(
            f"SELECT node, id, state FROM incidents WHERE node IN ({placeholders})"  # noqa: S608
            f" AND state NOT IN {TERMINAL_STATES}",
            list(chunk),
        ) as cursor:
            async for row in cursor:
                found[row[0]] = (row[1], row[2])
    return found


async def _next_seq(db: aiosqlite.Connection) -> int:
    async with db.execute("SELECT COALESCE(MAX(seq), 0) + 1 FROM incidents") as cursor:
        row = await cursor.fetchone()
    return int(row[0]) if row else 1
