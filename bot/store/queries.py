"""What the store reads and writes for the engine, the API and the lease: each query once.

Operations and statements in the neutral form of ``bot.store.sql``; ``bot.store.sqlstore``
exposes them as the store port and each store drives them over its own connection. Writes
here run in the caller's transaction (the store opens it, takes its locks and checks the fence).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from bot.domain.faults import Fault
from bot.domain.incident import State
from bot.domain.planner import PastIncident
from bot.store import codec
from bot.store.base import (
    PAGE_MAX,
    AlertRecord,
    ApprovalRecord,
    ApprovalStatus,
    Event,
    IncidentRecord,
    Lease,
    Page,
    StepRecord,
    StepStatus,
)
from bot.store.lease import Deposed
from bot.store.reader import alert_cursor, alert_key, event_key
from bot.store.sql import Dialect, Op, Stmt, T, When, check, many, one, put, rows, run

ALERTS = (
    "SELECT a.*, d.deliveries, d.last_seen FROM alerts a"
    " JOIN alert_deliveries d ON d.fingerprint = a.fingerprint AND d.starts_at = a.starts_at"
)
#: The order of an incident's alerts, and the key of an alert page's cursor.
ALERT_ORDER = "ORDER BY a.first_seen, a.fingerprint, a.starts_at"


def bounded(limit: int) -> int:
    return max(1, min(limit, PAGE_MAX))


# ------------------------------------------------------------------------- the fence
def fenced(token: tuple[str, int] | None, op: Op[T]) -> Op[T]:
    """``op``, after checking in the same transaction that the leadership row still names this
    holder and epoch (Postgres locks the row ``FOR SHARE``: a takeover waits for this commit;
    SQLite's ``BEGIN IMMEDIATE`` already holds the write lock until the commit). A ``check``: on
    Postgres it goes with the operation's first statement, not in a round trip of its own, and the
    transaction raises ``Deposed`` before it could commit."""
    if token is not None:
        holder, epoch = token
        yield check(
            "SELECT 1 AS held FROM leadership WHERE id = 1 AND holder = ? AND epoch = ? {for_share}",
            token,
            lambda: Deposed(f"{holder} no longer holds epoch {epoch}: another process took over"),
        )
    return (yield from op)


# ------------------------------------------------------------------------------ reads
def faults(incident_ids: Sequence[str]) -> Op[dict[str, tuple[Fault, ...]]]:
    """Each incident's faults, one per fault key (its first occurrence), in order of first occurrence.

    One row per incident and key comes back (two only when two alerts of one key start at the
    same instant): an incident with 10,000 alerts of one fault decodes one fault, not 10,000."""
    found: dict[str, list[tuple[str, str]]] = {i: [] for i in incident_ids}
    if incident_ids:
        answer = yield rows(
            "SELECT a.incident_id, a.fault_key, a.fault_json FROM (SELECT incident_id, fault_key,"
            " MIN(starts_at) AS first FROM alerts WHERE incident_id IN (?*) AND fault_json IS NOT NULL"
            " GROUP BY incident_id, fault_key) f JOIN alerts a ON a.incident_id = f.incident_id"
            " AND a.fault_key = f.fault_key AND a.starts_at = f.first ORDER BY f.first, f.fault_key",
            [list(incident_ids)],
        )
        for r in answer:
            found[r["incident_id"]].append((r["fault_key"], r["fault_json"]))
    return {i: _first_of_each(f) for i, f in found.items()}


def _first_of_each(found: Sequence[tuple[str, str]]) -> tuple[Fault, ...]:
    """The faults of ``found`` (key, JSON), one per key, in the order found."""
    seen: set[str] = set()
    decoded = []
    for key, text in found:
        if key not in seen:
            seen.add(key)
            decoded.append(codec.fault_from(text))
    return tuple(decoded)


#: An incident's row beside its faults as ``faults`` finds them, in one statement: the incident is
#: read at every turn of its flow, and on Postgres every statement is a round trip.
INCIDENT = (
    "SELECT i.*, a.fault_key AS found_key, a.fault_json AS found_json FROM incidents i"
    " LEFT JOIN (SELECT incident_id, fault_key, MIN(starts_at) AS first FROM alerts"
    " WHERE incident_id = ? AND fault_json IS NOT NULL GROUP BY incident_id, fault_key) f"
    " ON f.incident_id = i.id LEFT JOIN alerts a ON a.incident_id = f.incident_id"
    " AND a.fault_key = f.fault_key AND a.starts_at = f.first WHERE i.id = ? ORDER BY f.first, f.fault_key"
)


def incident(incident_id: str) -> Op[IncidentRecord | None]:
    found = yield rows(INCIDENT, (incident_id, incident_id))
    if not found:
        return None
    faults = _first_of_each([(r["found_key"], r["found_json"]) for r in found if r["found_json"] is not None])
    return codec.incident_from(found[0], faults)


def incidents(active_only: bool, node: str | None, limit: int) -> Op[list[IncidentRecord]]:
    where, params = [], []
    if active_only:
        where.append("state NOT IN {terminal}")
    if node is not None:
        where.append("node = ?")
        params.append(node)
    clause = f"WHERE {' AND '.join(where)}" if where else ""
    found = yield rows(f"SELECT * FROM incidents {clause} ORDER BY seq DESC LIMIT ?", [*params, limit])  # noqa: S608 - fixed fragments
    by_id = yield from faults([r["id"] for r in found])
    return [codec.incident_from(r, by_id[r["id"]]) for r in found]


def active() -> Op[list[tuple[str, State, datetime]]]:
    found = yield rows(
        "SELECT id, state, opened_at FROM incidents WHERE state NOT IN {terminal} ORDER BY seq"
    )
    return [(r["id"], State(r["state"]), codec.dt(r["opened_at"]) or datetime.min) for r in found]


def last_opened() -> Op[int]:
    found = yield one("SELECT COALESCE(MAX(seq), 0) AS last FROM incidents")
    return int(found["last"]) if found is not None else 0


def opened_after(seq: int) -> Op[list[tuple[int, str, State]]]:
    found = yield rows("SELECT seq, id, state FROM incidents WHERE seq > ? ORDER BY seq", (seq,))
    return [(int(r["seq"]), r["id"], State(r["state"])) for r in found]


#: An alert occurrence (``a``) that still fires: firing, and no later occurrence of its fingerprint
#: is stored. Alertmanager keeps one alert per fingerprint: a re-fire whose time range does not
#: overlap the resolved one replaces it (``provider/mem`` ``Put``), so when an alert resolves and
#: fires again between two flushes of its group no delivery ever says the first occurrence
#: resolved. It ended when the later one began, which is what fires now.
STILL_FIRING = (
    "a.status = 'firing' AND NOT EXISTS"
    " (SELECT 1 FROM alerts later WHERE later.fingerprint = a.fingerprint AND later.starts_at > a.starts_at)"
)


def firing(incident_id: str) -> Op[int]:
    found = yield one(
        f"SELECT COUNT(*) AS n FROM alerts a WHERE a.incident_id = ? AND {STILL_FIRING}",  # noqa: S608 - fixed
        (incident_id,),
    )
    return int(found["n"]) if found is not None else 0


def alerts_of(incident_id: str) -> Op[list[AlertRecord]]:
    found = yield rows(f"{ALERTS} WHERE a.incident_id = ? {ALERT_ORDER}", (incident_id,))
    return [codec.alert_from(r) for r in found]


def alerts_on(nodes: Sequence[str], since: datetime, limit: int, other_than: str) -> Op[list[AlertRecord]]:
    if not nodes:
        return []
    marks = ", ".join("?" for _ in nodes)
    found = yield rows(
        f"{ALERTS} WHERE a.node IN ({marks}) AND a.alertname != ?"
        " AND (a.status = 'firing' OR a.starts_at >= ? OR a.ends_at >= ?)"
        " ORDER BY a.starts_at DESC, a.fingerprint LIMIT ?",
        (*nodes, other_than, codec.ts(since), codec.ts(since), bounded(limit)),
    )
    return [codec.alert_from(r) for r in found]


def alerts_page(incident_id: str, limit: int, after: str | None) -> Op[Page[AlertRecord]]:
    limit = bounded(limit)
    where, params = "incident_id = ?", [incident_id]
    if after is not None:
        where += " AND (first_seen, fingerprint, starts_at) > (?, ?, ?)"
        params.extend(alert_key(after))  # BadCursor before anything is read
    # The page's keys first, then only its rows joined and decoded.
    found = yield rows(
        "SELECT a.*, d.deliveries, d.last_seen FROM (SELECT fingerprint, starts_at FROM alerts"  # noqa: S608
        f" WHERE {where} ORDER BY first_seen, fingerprint, starts_at LIMIT ?) k"
        " JOIN alerts a ON a.fingerprint = k.fingerprint AND a.starts_at = k.starts_at"
        " JOIN alert_deliveries d ON d.fingerprint = a.fingerprint AND d.starts_at = a.starts_at"
        f" {ALERT_ORDER}",
        [*params, limit + 1],
    )
    page = found[:limit]
    last = page[-1] if len(found) > limit else None
    return Page(
        tuple(codec.alert_from(r) for r in page),
        alert_cursor((last["first_seen"], last["fingerprint"], last["starts_at"])) if last else None,
    )


def alert(key: tuple[str, str]) -> Op[AlertRecord | None]:
    row = yield one(f"{ALERTS} WHERE a.fingerprint = ? AND a.starts_at = ?", key)
    return codec.alert_from(row) if row else None


def events_of(incident_id: str) -> Op[list[Event]]:
    found = yield rows("SELECT * FROM events WHERE incident_id = ? ORDER BY seq", (incident_id,))
    return [codec.event_from(r) for r in found]


def events_page(incident_id: str, limit: int, after: str | None) -> Op[Page[Event]]:
    limit, since = bounded(limit), event_key(after) if after is not None else 0
    found = yield rows(
        "SELECT * FROM events WHERE incident_id = ? AND seq > ? ORDER BY seq LIMIT ?",
        (incident_id, since, limit + 1),
    )
    events = tuple(codec.event_from(r) for r in found[:limit])
    return Page(events, str(events[-1].seq) if len(found) > limit else None)


def events_since(seq: int, limit: int) -> Op[list[Event]]:
    found = yield rows("SELECT * FROM events WHERE seq > ? ORDER BY seq LIMIT ?", (seq, limit))
    return [codec.event_from(r) for r in found]


def audit_log(after: int, since: datetime | None, until: datetime | None, limit: int) -> Op[list[Event]]:
    """Events after ``seq`` ``after``, at or after ``since`` and before ``until``, in ``seq`` order:
    one page of ``pitcrew audit export`` (the primary key's range, read from ``after`` on)."""
    where = ["seq > ?"]
    params: list[Any] = [after]
    if since is not None:
        where.append("at >= ?")
        params.append(codec.ts(since))
    if until is not None:
        where.append("at < ?")
        params.append(codec.ts(until))
    found = yield rows(
        f"SELECT * FROM events WHERE {' AND '.join(where)} ORDER BY seq LIMIT ?",  # noqa: S608 - fixed fragments
        [*params, limit],
    )
    return [codec.event_from(r) for r in found]


def steps_of(incident_id: str) -> Op[dict[str, StepRecord]]:
    found = yield rows("SELECT * FROM steps WHERE incident_id = ?", (incident_id,))
    return {r["step"]: codec.step_from(r) for r in found}


def approval(incident_id: str) -> Op[ApprovalRecord | None]:
    row = yield one(
        "SELECT * FROM approvals WHERE incident_id = ? ORDER BY requested_at DESC LIMIT 1", (incident_id,)
    )
    return codec.approval_from(row) if row else None


def memory(watch: str) -> Op[dict[str, Any]]:
    found = yield rows("SELECT key, value_json FROM watch_memory WHERE watch = ?", (watch,))
    return {r["key"]: json.loads(r["value_json"]) for r in found}


def remember(watch: str, changed: Mapping[str, Mapping[str, Any] | None], now: datetime) -> Op[None]:
    gone = [(watch, key) for key, value in changed.items() if value is None]
    kept = [
        (watch, key, codec.dumps(dict(value)), codec.ts(now))
        for key, value in changed.items()
        if value is not None
    ]
    if gone:
        yield many("DELETE FROM watch_memory WHERE watch = ? AND key = ?", gone)
    if kept:
        yield many(
            "INSERT INTO watch_memory (watch, key, value_json, updated_at) VALUES (?, ?, ?, ?)"
            " ON CONFLICT (watch, key) DO UPDATE SET value_json = excluded.value_json,"
            " updated_at = excluded.updated_at",
            kept,
        )


def switch(name: str) -> Op[Mapping[str, Any] | None]:
    row = yield one("SELECT value_json, set_by, set_at FROM switches WHERE name = ?", (name,))
    if row is None or row["value_json"] is None:
        return None
    value: dict[str, Any] = json.loads(row["value_json"])
    return {**value, "set_by": row["set_by"], "set_at": row["set_at"]}


def history(node: str, since: datetime, exclude: str | None) -> Op[list[PastIncident]]:
    found = yield rows(
        "SELECT id, playbook, opened_at, acted FROM incidents WHERE node = ? AND opened_at >= ? AND id != ?"
        " AND playbook IS NOT NULL ORDER BY seq",
        (node, codec.ts(since), exclude or ""),
    )
    return [
        PastIncident(r["id"], r["playbook"], codec.dt(r["opened_at"]) or since, bool(r["acted"]))
        for r in found
    ]


def nodes_in_remediation(since: datetime, exclude_node: str | None) -> Op[frozenset[str]]:
    # An active incident holds its place from admission (two admitted at once must not both
    # slip under the limit); an ended one keeps it only if pitcrew changed something for it
    # (an "action" in its audit log), so one that failed before any change gives it back.
    # The two arms apart, each a range of the index ``incidents_guarded``, the second a semi-join on
    # the incidents' action events (``events_action``): as one condition with OR, PostgreSQL
    # could not join, costed the events' look-up row by row, and the estimate crossed
    # ``jit_above_cost``: each count spent 200 ms compiling itself (JIT) to find no row.
    window = (codec.ts(since), exclude_node or "")
    found = yield rows(
        "SELECT node FROM incidents WHERE guarded_at IS NOT NULL AND guarded_at >= ? AND node != ?"
        " AND state NOT IN {terminal}"
        " UNION SELECT node FROM incidents i WHERE guarded_at IS NOT NULL AND guarded_at >= ? AND node != ?"
        # ACTION as a word, not a parameter: the word of events_action's condition (migration 9).
        " AND EXISTS (SELECT 1 FROM events e WHERE e.incident_id = i.id AND e.kind = 'action')",
        (*window, *window),
    )
    return frozenset(r["node"] for r in found)


def rollbacks_requested() -> Op[list[str]]:
    found = yield rows(
        "SELECT s.incident_id FROM steps s JOIN incidents i ON i.id = s.incident_id"
        " WHERE s.step = 'rollback' AND (s.status = 'running' OR i.state <> 'rolled_back')"
        " ORDER BY i.seq"
    )
    return [r["incident_id"] for r in found]


# ----------------------------------------------------------------------------- writes
def save_plan(incident_id: str, document: str, playbook: str, mode: str, now: datetime) -> Stmt:
    return put(
        "UPDATE incidents SET plan_json = ?, playbook = ?, mode = ?, faults_changed = 0, updated_at = ?"
        " WHERE id = ?",
        (document, playbook, mode, codec.ts(now), incident_id),
    )


def ack_faults(incident_id: str) -> Stmt:
    return put("UPDATE incidents SET faults_changed = 0 WHERE id = ?", (incident_id,))


def transition(
    incident_id: str,
    state: State,
    now: datetime,
    *,
    outcome: str | None,
    guarded: bool,
    unless: str | None,
) -> tuple[Stmt, When]:
    """Move an incident, and the condition under which it moved: its event is written ``provided``
    it holds (``bot.store.sql.provided``), so nothing is read back. ``unless="new_fault"`` skips
    the move if a new fault attached meanwhile; ``unless="firing"`` also if any of its alerts still
    fires. The condition is the move's own ``WHERE``, whose columns the move does not set, and no
    write that could change what it reads runs between its statements (the write lock; retention,
    which takes none, deletes closed incidents' rows only): it finds the row after the move if and
    only if the move found it. With ``unless="firing"`` it is evaluated again each time (the
    event, its outbox rows, whether it moved): one scan of the incident's firing alerts each."""
    stamp = codec.ts(now)
    sets = ["state = ?", "updated_at = ?"]
    params: list[Any] = [state.value, stamp]
    if state.terminal:
        sets.append("closed_at = ?")
        params.append(stamp)
    if outcome is not None:
        sets.append("outcome = ?")
        params.append(outcome)
    if guarded:
        sets.append("guarded_at = COALESCE(guarded_at, ?)")
        params.append(stamp)
    where, params_where = "id = ?", [incident_id]
    if unless in {"new_fault", "firing"}:
        where += " AND faults_changed = 0"
    if unless == "firing":
        where += f" AND NOT EXISTS (SELECT 1 FROM alerts a WHERE a.incident_id = ? AND {STILL_FIRING})"  # noqa: S608
        params_where.append(incident_id)
    update = put(f"UPDATE incidents SET {', '.join(sets)} WHERE {where}", [*params, *params_where])  # noqa: S608
    return update, When(f"SELECT 1 FROM incidents WHERE {where}", params_where)  # noqa: S608


def advance(incident_id: str, step_index: int, now: datetime) -> Stmt:
    return put(
        "UPDATE incidents SET step_index = ?, updated_at = ? WHERE id = ?",
        (step_index, codec.ts(now), incident_id),
    )


def step_started(incident_id: str, step: str, attempt: int, now: datetime) -> Stmt:
    return put(
        "INSERT INTO steps (incident_id, step, status, attempts, started_at) VALUES (?, ?, 'running', ?, ?)"
        " ON CONFLICT (incident_id, step) DO UPDATE SET status = 'running', attempts = excluded.attempts,"
        " started_at = CASE WHEN steps.status IN ('superseded', 'held') THEN excluded.started_at"
        " ELSE COALESCE(steps.started_at, excluded.started_at) END,"
        " result_json = CASE WHEN steps.status = 'superseded' THEN '{}' ELSE steps.result_json END,"
        " ended_at = NULL",
        (incident_id, step, attempt, codec.ts(now)),
    )


def acted(incident_id: str) -> Stmt:
    return put("UPDATE incidents SET acted = 1 WHERE id = ?", (incident_id,))


def step_finished(incident_id: str, step: str, status: StepStatus, now: datetime, document: str) -> Stmt:
    return put(
        "INSERT INTO steps (incident_id, step, status, attempts, started_at, ended_at, result_json)"
        " VALUES (?, ?, ?, 0, NULL, ?, ?) ON CONFLICT (incident_id, step) DO UPDATE SET"
        " status = excluded.status, ended_at = excluded.ended_at, result_json = excluded.result_json",
        (incident_id, step, status, codec.ts(now), document),
    )


_REQUEST_ROLLBACK = (
    "INSERT INTO steps (incident_id, step, status, attempts, started_at, result_json)"
    " VALUES (?, 'rollback', 'running', 0, ?, ?) ON CONFLICT (incident_id, step) DO NOTHING"
)
_REQUEST_ROLLBACK_AGAIN = (
    "INSERT INTO steps (incident_id, step, status, attempts, started_at, result_json)"
    " VALUES (?, 'rollback', 'running', 0, ?, ?) ON CONFLICT (incident_id, step) DO UPDATE SET"
    " status = 'running', started_at = excluded.started_at, ended_at = NULL,"
    " result_json = excluded.result_json WHERE steps.status = 'ok'"
)


def request_rollback(incident_id: str, document: str, now: datetime, *, again: bool) -> Stmt:
    """The rollback record, once: the answer is 1 if this request recorded it. Asked ``again`` (a
    rolled-back incident's rollback kept a change), a done one is started anew, and only a done one:
    of two such requests at once, the one that comes second finds it running."""
    return run(
        _REQUEST_ROLLBACK_AGAIN if again else _REQUEST_ROLLBACK, (incident_id, codec.ts(now), document)
    )


def step_progress(incident_id: str, step: str, document: str, now: datetime) -> Stmt:
    return put(
        "INSERT INTO steps (incident_id, step, status, attempts, started_at, result_json)"
        " VALUES (?, ?, 'running', 0, ?, ?) ON CONFLICT (incident_id, step) DO UPDATE SET"
        " result_json = excluded.result_json",
        (incident_id, step, codec.ts(now), document),
    )


def request_approval(
    incident_id: str, step: str, approvers: Sequence[str], deadline: datetime, now: datetime
) -> Stmt:
    return put(
        "INSERT INTO approvals (incident_id, step, requested_at, deadline, approvers_json, status)"
        " VALUES (?, ?, ?, ?, ?, 'pending') ON CONFLICT (incident_id, step) DO NOTHING",
        (incident_id, step, codec.ts(now), codec.ts(deadline), codec.dumps(list(approvers))),
    )


def decide_approval(incident_id: str, status: ApprovalStatus, actor: str, now: datetime) -> Stmt:
    return run(
        "UPDATE approvals SET status = ?, decided_by = ?, decided_at = ? WHERE incident_id = ? AND status = 'pending'",
        (status, actor, codec.ts(now), incident_id),
    )


def set_switch(name: str, value: Mapping[str, Any] | None, actor: str, now: datetime) -> Stmt:
    return put(
        "INSERT INTO switches (name, value_json, set_by, set_at) VALUES (?, ?, ?, ?)"
        " ON CONFLICT (name) DO UPDATE SET value_json = excluded.value_json, set_by = excluded.set_by,"
        " set_at = excluded.set_at",
        (name, codec.dumps(dict(value)) if value is not None else None, actor, codec.ts(now)),
    )


# ------------------------------------------------------------------------------ lease
# Times are the store's clock (``{now}``), or a fake clock's value passed in (``{clock}``, tests).
def _clock(dialect: Dialect, clock: datetime | None) -> tuple[str, list[Any]]:
    return ("{now}", []) if clock is None else ("{clock}", [dialect.instant(clock)])


def lease(dialect: Dialect, clock: datetime | None) -> Op[Lease | None]:
    now, params = _clock(dialect, clock)
    row = yield one(
        "SELECT holder, epoch, {moment_from}acquired_at{moment_to} AS acquired_at,"  # noqa: S608
        " {moment_from}renewed_at{moment_to} AS renewed_at,"
        " {moment_from}expires_at{moment_to} AS expires_at,"
        f" {{moment_from}}{now}{{moment_to}} AS now FROM leadership WHERE id = 1",
        params,
    )
    if row is None:
        return None
    return Lease(
        holder=row["holder"],
        epoch=int(row["epoch"]),
        acquired_at=dialect.moment(row["acquired_at"]),
        renewed_at=dialect.moment(row["renewed_at"]),
        expires_at=dialect.moment(row["expires_at"]),
        now=dialect.moment(row["now"]),
    )


def acquire_lease(dialect: Dialect, clock: datetime | None, holder: str, seconds: float) -> Op[Lease]:
    """Take the row when it is free, expired or already ours; the epoch grows at every take."""
    now, params = _clock(dialect, clock)
    yield run(
        "INSERT INTO leadership (id, holder, epoch, acquired_at, renewed_at, expires_at)"  # noqa: S608
        f" SELECT 1, ?, 1, n.t, n.t, n.t + {{seconds}} FROM (SELECT {now} AS t) n WHERE true"
        " ON CONFLICT (id) DO UPDATE SET holder = excluded.holder, epoch = leadership.epoch + 1,"
        " acquired_at = excluded.acquired_at, renewed_at = excluded.renewed_at,"
        " expires_at = excluded.expires_at"
        " WHERE leadership.expires_at <= excluded.acquired_at OR leadership.holder = excluded.holder",
        [holder, seconds, *params],
    )
    taken = yield from lease(dialect, clock)
    assert taken is not None
    return taken


def renew_lease(
    dialect: Dialect, clock: datetime | None, holder: str, epoch: int, seconds: float
) -> Op[Lease | None]:
    now, params = _clock(dialect, clock)
    renewed = yield run(
        f"UPDATE leadership SET renewed_at = n.t, expires_at = n.t + {{seconds}} FROM (SELECT {now} AS t) n"  # noqa: S608
        " WHERE id = 1 AND holder = ? AND epoch = ?",
        [seconds, *params, holder, epoch],
    )
    return (yield from lease(dialect, clock)) if renewed else None


def release_lease(dialect: Dialect, clock: datetime | None, holder: str, epoch: int) -> Stmt:
    now, params = _clock(dialect, clock)
    return run(
        f"UPDATE leadership SET expires_at = {{least}}(expires_at, {now}) WHERE id = 1 AND holder = ? AND epoch = ?",  # noqa: S608
        [*params, holder, epoch],
    )
