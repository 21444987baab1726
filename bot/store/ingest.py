"""One Alertmanager delivery into the store, inside the writer's transaction.

Dedupe by ``(fingerprint, startsAt)``: a repeat only bumps ``last_seen``; a resolved
repeat marks the alert resolved (a stale firing repeat never un-resolves it). A new firing
alert attaches to the node's active incident or opens one; a resolved alert never opens an
incident. Alerts without a node are kept (``unroutable``) and never acted on.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
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


KeyState = tuple[str, str | None]  # (status, incident id)


async def ingest(
    db: aiosqlite.Connection, delivery: Delivery, now: datetime, cache: Mapping[tuple[str, str], KeyState]
) -> IngestOutcome:
    """Persist one delivery; ``cache`` holds committed keys, the database answers the rest."""
    out = IngestOutcome()
    stamp = ts(now)
    keys = [(a.fingerprint, a.starts_at.isoformat(timespec="microseconds")) for a in delivery.alerts]
    known: dict[tuple[str, str], KeyState] = {k: cache[k] for k in keys if k in cache}
    missing = [k for k in keys if k not in known]
    if missing:
        known.update(await _known(db, missing))
    opening_nodes = {
        a.node
        for a, k in zip(delivery.alerts, keys, strict=True)
        if k not in known and a.node is not None and a.fault is not None
    }
    active = await _active_incidents(db, opening_nodes) if opening_nodes else {}
    faults_of = await _fault_keys(db, [i for i, state in active.values() if state != State.OPEN.value])

    inserts: list[tuple[Any, ...]] = []
    seen_updates: list[tuple[Any, ...]] = []
    resolve_updates: list[tuple[Any, ...]] = []
    events: list[tuple[str | None, NewEvent]] = []
    next_seq: int | None = None

    for alert, key in zip(delivery.alerts, keys, strict=True):
        if key in known:
            out.repeated_alerts += 1
            status, seen_in = known[key]
            if status == "firing" and alert.status == "resolved":
                resolve_updates.append((ts(alert.ends_at), stamp, *key))
                known[key] = out.cache[key] = ("resolved", seen_in)
                out.resolved += 1
                if seen_in is not None:
                    out.resolved_in.append(seen_in)
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
                seen_faults = faults_of.setdefault(incident_id, set())
                if state != State.OPEN.value and alert.fault.key not in seen_faults:
                    out.changed.append(incident_id)  # a new fault on an incident already under way
                seen_faults.add(alert.fault.key)
            events.append((incident_id, _alert_event("alert_firing", alert.alertname, alert.fault, key)))
        known[key] = out.cache[key] = (alert.status, incident_id)
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
        await bump_seen(db, [(stamp, 1, fp, starts) for stamp, fp, starts in seen_updates])
    if resolve_updates:
        await db.executemany(
            "UPDATE alerts SET status = 'resolved', ends_at = ?, last_seen = ?, deliveries = deliveries + 1"
            " WHERE fingerprint = ? AND starts_at = ?",
            resolve_updates,
        )
    if out.changed:
        await db.executemany(
            "UPDATE incidents SET faults_changed = 1, updated_at = ? WHERE id = ?",
            [(stamp, i) for i in set(out.changed)],
        )
    await insert_events(db, events, now)
    return out


async def bump_seen(db: aiosqlite.Connection, rows: Sequence[tuple[str | None, int, str, str]]) -> None:
    """Repeat deliveries: ``(last_seen, count, fingerprint, starts_at)``."""
    await db.executemany(
        "UPDATE alerts SET last_seen = MAX(last_seen, ?), deliveries = deliveries + ? WHERE fingerprint = ? AND starts_at = ?",
        rows,
    )


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


async def _known(
    db: aiosqlite.Connection, keys: Sequence[tuple[str, str]]
) -> dict[tuple[str, str], KeyState]:
    known: dict[tuple[str, str], KeyState] = {}
    for chunk in _chunks(list(dict.fromkeys(keys))):
        placeholders = ",".join("(?, ?)" for _ in chunk)
        rows = await db.execute_fetchall(
            f"SELECT fingerprint, starts_at, status, incident_id FROM alerts"  # noqa: S608 - placeholders only
            f" WHERE (fingerprint, starts_at) IN (VALUES {placeholders})",
            [v for key in chunk for v in key],
        )
        known.update({(r[0], r[1]): (r[2], r[3]) for r in rows})
    return known


async def _active_incidents(db: aiosqlite.Connection, nodes: set[str]) -> dict[str, tuple[str, str]]:
    found: dict[str, tuple[str, str]] = {}
    for chunk in _chunks(sorted(nodes)):
        placeholders = ",".join("?" for _ in chunk)
        rows = await db.execute_fetchall(
            f"SELECT node, id, state FROM incidents WHERE node IN ({placeholders})"  # noqa: S608
            f" AND state NOT IN {TERMINAL_STATES}",
            list(chunk),
        )
        found.update({r[0]: (r[1], r[2]) for r in rows})
    return found


async def _fault_keys(db: aiosqlite.Connection, incidents: list[str]) -> dict[str, set[str]]:
    found: dict[str, set[str]] = {}
    for chunk in _chunks(incidents):
        placeholders = ",".join("?" for _ in chunk)
        rows = await db.execute_fetchall(
            f"SELECT DISTINCT incident_id, fault_key FROM alerts WHERE incident_id IN ({placeholders})",  # noqa: S608
            list(chunk),
        )
        for incident_id, key in rows:
            found.setdefault(incident_id, set()).add(key)
    return found


async def _next_seq(db: aiosqlite.Connection) -> int:
    rows = list(await db.execute_fetchall("SELECT COALESCE(MAX(seq), 0) + 1 FROM incidents"))
    return int(rows[0][0]) if rows else 1
