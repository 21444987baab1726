"""The durable outbox: notices on their way to humans, in the store, in order.

Why in the store: a notice is part of what happened. It is written in the transaction of the
timeline event that reports it, so a crash can never leave an event whose notice is lost, nor a
notice for an event that did not commit; a sender (``bot.engine.outbox``) delivers it later,
however long the destination is down. One row per notice and destination (``slack``, later
``grafana``): destinations progress independently. ``outbox_refs`` keeps what a destination
must remember between notices (the ts of an incident's Slack thread), beside the rows.

These are plain functions of a connection, run by the store's writer and reader threads.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from bot.store.base import JsonObject, NewEvent, OutboxItem
from bot.store.codec import dt, dumps, ts
from bot.store.ingest import insert_events


def enqueue(
    db: sqlite3.Connection,
    incident_id: str | None,
    event: NewEvent,
    kind: str,
    payload: JsonObject,
    destinations: Sequence[str],
    now: datetime,
) -> int:
    insert_events(db, [(incident_id, event)], now)
    seq = int(db.execute("SELECT last_insert_rowid()").fetchone()[0])
    document = dumps(dict(payload))
    db.executemany(
        "INSERT INTO outbox (destination, incident_id, event_seq, kind, payload_json, created_at)"
        " VALUES (?, ?, ?, ?, ?, ?)",
        [(d, incident_id, seq, kind, document, ts(now)) for d in destinations],
    )
    return seq


def item_from(row: Any) -> OutboxItem:
    created = dt(row["created_at"])
    assert created is not None
    return OutboxItem(
        id=row["id"],
        destination=row["destination"],
        incident_id=row["incident_id"],
        kind=row["kind"],
        payload=json.loads(row["payload_json"]),
        created_at=created,
        attempts=row["attempts"],
        not_before=dt(row["not_before"]),
        delivered_at=dt(row["delivered_at"]),
        ref=row["ref"],
        last_error=row["last_error"],
        event_seq=row["event_seq"],
    )


def pending(db: sqlite3.Connection, destination: str, limit: int) -> list[OutboxItem]:
    rows = db.execute(
        "SELECT * FROM outbox WHERE destination = ? AND delivered_at IS NULL ORDER BY id LIMIT ?",
        (destination, limit),
    )
    return [item_from(r) for r in rows]


def item(db: sqlite3.Connection, item_id: int) -> OutboxItem | None:
    row = db.execute("SELECT * FROM outbox WHERE id = ?", (item_id,)).fetchone()
    return item_from(row) if row else None


def attempt(db: sqlite3.Connection, item_id: int) -> None:
    db.execute("UPDATE outbox SET attempts = attempts + 1 WHERE id = ?", (item_id,))


def delivered(db: sqlite3.Connection, item_id: int, ref: str | None, now: datetime) -> None:
    db.execute(
        "UPDATE outbox SET delivered_at = ?, ref = ?, not_before = NULL, last_error = '' WHERE id = ?",
        (ts(now), ref, item_id),
    )


def defer(db: sqlite3.Connection, item_id: int, not_before: datetime, error: str) -> None:
    db.execute(
        "UPDATE outbox SET not_before = ?, last_error = ? WHERE id = ?",
        (ts(not_before), error[:500], item_id),
    )


def ref(db: sqlite3.Connection, destination: str, key: str) -> str | None:
    row = db.execute(
        "SELECT ref FROM outbox_refs WHERE destination = ? AND key = ?", (destination, key)
    ).fetchone()
    return str(row[0]) if row else None


def refs_by_key(db: sqlite3.Connection, key: str) -> dict[str, str]:
    rows = db.execute("SELECT destination, ref FROM outbox_refs WHERE key = ?", (key,)).fetchall()
    return {str(destination): str(ref) for destination, ref in rows}


def set_ref(db: sqlite3.Connection, destination: str, key: str, value: str, now: datetime) -> None:
    db.execute(
        "INSERT INTO outbox_refs (destination, key, ref, updated_at) VALUES (?, ?, ?, ?)"
        " ON CONFLICT (destination, key) DO UPDATE SET ref = excluded.ref, updated_at = excluded.updated_at",
        (destination, key, value, ts(now)),
    )


def route(
    db: sqlite3.Connection,
    incident_id: str | None,
    event: NewEvent,
    destinations: Sequence[str],
    now: datetime,
) -> None:
    """The timeline event just inserted, as outbox rows (``SqliteStore.route_events``)."""
    seq = int(db.execute("SELECT last_insert_rowid()").fetchone()[0])
    payload = {
        "event": True,
        "step": event.step,
        "outcome": event.outcome,
        "actor": event.actor,
        "detail": event.detail,
    }
    document = dumps(payload)
    db.executemany(
        "INSERT INTO outbox (destination, incident_id, event_seq, kind, payload_json, created_at)"
        " VALUES (?, ?, ?, ?, ?, ?)",
        [(d, incident_id, seq, event.kind, document, ts(now)) for d in destinations],
    )
