"""The durable outbox: notices on their way to humans, in the store, in order.

Why in the store: a notice is part of what happened. It is written in the transaction of the
timeline event that reports it, so a crash can never leave an event whose notice is lost, nor a
notice for an event that did not commit; a sender (``bot.engine.outbox``) delivers it later,
however long the destination is down. One row per notice and destination (``slack``, later
``grafana``): destinations progress independently. ``outbox_refs`` keeps what a destination
must remember between notices (the ts of an incident's Slack thread), beside the rows.

The statements and operations here are the same for both stores (``bot.store.sql``).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import replace
from datetime import datetime
from typing import Any

from bot.store.base import ONCE, SUPERSEDED, JsonObject, NewEvent, OutboxItem
from bot.store.codec import dt, dumps, ts
from bot.store.ingest import append_event
from bot.store.sql import Op, Stmt, When, many, one, provided, put, rows, single

#: An outbox row of the event the transaction inserted last (``{event_seq}``: its ``seq``, read in
#: the database, so the operation reads no answer before it).
_INSERT_ROUTED = (
    "INSERT INTO outbox (destination, incident_id, event_seq, kind, payload_json, created_at)"
    " VALUES (?, ?, {event_seq}, ?, ?, ?)"
)
#: The seq of the event the transaction inserted last, as the operation's answer.
_EVENT_SEQ = "SELECT {event_seq} AS seq"


def enqueue(
    incident_id: str | None,
    event: NewEvent,
    kind: str,
    payload: JsonObject,
    destinations: Sequence[str],
    now: datetime,
    once: str | None = None,
) -> Op[int]:
    """The timeline event and its notice, one row per destination; the event's ``seq``. With
    ``once``, unless the event's step posted it already (``told``): then that event's ``seq``.

    Nothing is read before the last statement but what ``told`` finds: the rows name their event
    by ``{event_seq}``, and its ``seq`` is read last, so Postgres sends the event, its rows and
    ``COMMIT`` in one message (the ``seq`` read back from the event's insert was a message of its
    own, the write lock held meanwhile)."""
    if once is not None:
        assert event.step is not None, "checked by the store"
        posted = yield from told(incident_id, event.kind, event.step, once)
        if posted is not None:
            return posted
        event = replace(event, data={**event.data, ONCE: once})
    yield append_event(incident_id, event, now)
    document = dumps(dict(payload))
    yield many(_INSERT_ROUTED, [(d, incident_id, kind, document, ts(now)) for d in destinations])
    inserted = yield from single(one(_EVENT_SEQ))
    return int(inserted["seq"])


def told(incident_id: str | None, kind: str, step: str, once: str) -> Op[int | None]:
    """The ``kind`` event ``step`` wrote under ``once`` in its current run: after the step's latest
    ``SUPERSEDED`` event, where a new run begins (a crash, a retry or a pause does not begin one).
    Few rows: the step's own notices of one run; the key is matched here, not in each dialect's
    JSON. Without an incident (a notice about pitcrew as a whole), no step runs again: ``once``
    holds for good, so its key names what it is about (the breaker's: the incident that tripped
    it)."""
    if incident_id is None:
        found = yield rows(
            "SELECT seq, data_json FROM events WHERE incident_id IS NULL AND kind = ? AND step = ?"
            " ORDER BY seq",
            (kind, step),
        )
    else:
        found = yield rows(
            "SELECT seq, data_json FROM events WHERE incident_id = ? AND kind = ? AND step = ? AND seq >"
            " COALESCE((SELECT MAX(seq) FROM events WHERE incident_id = ? AND kind = ? AND step = ?), 0)"
            " ORDER BY seq",
            (incident_id, kind, step, incident_id, SUPERSEDED, step),
        )
    for row in found:
        if json.loads(row["data_json"]).get(ONCE) == once:
            return int(row["seq"])
    return None


def route(
    incident_id: str | None,
    event: NewEvent,
    destinations: Sequence[str],
    now: datetime,
    when: When | None = None,
) -> Op[None]:
    """A timeline event, and for routed kinds (``Store.route_events``) its outbox rows too; with
    ``when``, only if it finds a row (``bot.store.sql.provided``: an incident's move). Nothing is
    read: Postgres sends them with the operation's next statement or its ``COMMIT``."""
    yield append_event(incident_id, event, now, when)
    if destinations:
        payload = {
            "event": True,
            "step": event.step,
            "outcome": event.outcome,
            "actor": event.actor,
            "detail": event.detail,
        }
        document = dumps(payload)
        rows_ = [(d, incident_id, event.kind, document, ts(now)) for d in destinations]
        routed = many(_INSERT_ROUTED, rows_, wakes=True)
        yield routed if when is None else provided(routed, when)


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


def pending(destination: str, limit: int) -> Op[list[OutboxItem]]:
    found = yield rows(
        "SELECT * FROM outbox WHERE destination = ? AND delivered_at IS NULL ORDER BY id LIMIT ?",
        (destination, limit),
    )
    return [item_from(r) for r in found]


def item(item_id: int) -> Op[OutboxItem | None]:
    row = yield one("SELECT * FROM outbox WHERE id = ?", (item_id,))
    return item_from(row) if row else None


def attempt(item_id: int) -> Stmt:
    return put("UPDATE outbox SET attempts = attempts + 1 WHERE id = ?", (item_id,))


def delivered(item_id: int, ref: str | None, now: datetime) -> Stmt:
    return put(
        "UPDATE outbox SET delivered_at = ?, ref = ?, not_before = NULL, last_error = '' WHERE id = ?",
        (ts(now), ref, item_id),
    )


def defer(item_id: int, not_before: datetime, error: str) -> Stmt:
    return put(
        "UPDATE outbox SET not_before = ?, last_error = ? WHERE id = ?",
        (ts(not_before), error[:500], item_id),
    )


def ref(destination: str, key: str) -> Op[str | None]:
    row = yield one("SELECT ref FROM outbox_refs WHERE destination = ? AND key = ?", (destination, key))
    return str(row["ref"]) if row else None


def refs_by_key(key: str) -> Op[dict[str, str]]:
    found = yield rows("SELECT destination, ref FROM outbox_refs WHERE key = ?", (key,))
    return {str(r["destination"]): str(r["ref"]) for r in found}


def set_ref(destination: str, key: str, value: str, now: datetime) -> Stmt:
    return put(
        "INSERT INTO outbox_refs (destination, key, ref, updated_at) VALUES (?, ?, ?, ?)"
        " ON CONFLICT (destination, key) DO UPDATE SET ref = excluded.ref, updated_at = excluded.updated_at",
        (destination, key, value, ts(now)),
    )
