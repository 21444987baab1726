"""SQLite implementation of the incident store port (WAL, versioned schema, group commit).

Writes go through one ``Writer`` (``bot.store.writer``): whole transactions in one worker
thread, many per commit, acknowledged only once committed. Reads go through one ``Reader``
(``bot.store.reader``): the query and the decoding of its rows in a reader thread with its
own connection, so that no read, however large, holds up the event loop (and the webhooks it
answers); in WAL mode the reader never waits for the writer. The read queries are the
functions below, each given that connection. Repeat deliveries Alertmanager makes of groups it
already sent are counted in memory and flushed every second; reads include what is not
flushed yet — but only while the database file is the one the writer opened, or a restart
would not know those alerts. Readiness (``ping``) is the writer's word on whether writes commit.

Several processes may open one file: SQLite's write lock (``BEGIN IMMEDIATE``) serialises their
transactions, and the leadership lease (``bot.store.lease``) decides which of them acts. The
lease's times are the machine's clock read by SQLite (``_DB_NOW``), the same for every process.
"""

from __future__ import annotations

import copy
import json
import sqlite3
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, TypeVar

from bot.domain.alerts import AlertStatus, dedupe_key
from bot.domain.faults import Fault
from bot.domain.incident import State
from bot.domain.planner import PastIncident, Plan
from bot.store import codec
from bot.store import outbox as _outbox
from bot.store.base import (
    ACTION,
    PAGE_MAX,
    AlertRecord,
    ApprovalRecord,
    ApprovalStatus,
    Delivery,
    Event,
    IncidentRecord,
    IngestOutcome,
    JsonObject,
    Lease,
    NewEvent,
    OutboxItem,
    Page,
    StepRecord,
    StepStatus,
    StoreUnavailable,
    link_key,
)
from bot.store.ingest import insert_events
from bot.store.lease import Deposed, Fence
from bot.store.reader import Reader, alert_cursor, alert_key, event_key
from bot.store.schema import TERMINAL_STATES
from bot.store.writer import IngestJob, Writer

_T = TypeVar("_T")

_ALERTS = (
    "SELECT a.*, d.deliveries, d.last_seen FROM alerts a"
    " JOIN alert_deliveries d ON d.fingerprint = a.fingerprint AND d.starts_at = a.starts_at"
)
#: The store's clock in SQL, as Unix seconds (millisecond precision; one value per statement).
#: Every process on the machine reads the same clock: lease expiry never depends on who asks.
_DB_NOW = "((julianday('now') - 2440587.5) * 86400.0)"
#: The order of an incident's alerts, and the key of an alert page's cursor.
_ALERT_ORDER = "ORDER BY a.first_seen, a.fingerprint, a.starts_at"


def _faults(db: sqlite3.Connection, incident_ids: Sequence[str]) -> dict[str, tuple[Fault, ...]]:
    """Each incident's faults, one per fault key (its first occurrence), in order of first occurrence.

    One row per incident and key comes back (SQLite takes ``fault_json`` from the row holding
    ``MIN(starts_at)``): an incident with 10,000 alerts of one fault decodes one fault, not 10,000.
    """
    found: dict[str, list[Fault]] = {i: [] for i in incident_ids}
    if incident_ids:
        marks = ",".join("?" for _ in incident_ids)
        for row in db.execute(
            f"SELECT incident_id, fault_json, MIN(starts_at) AS first FROM alerts WHERE incident_id IN ({marks})"  # noqa: S608
            " AND fault_json IS NOT NULL GROUP BY incident_id, fault_key ORDER BY first, fault_key",
            list(incident_ids),
        ):
            found[row["incident_id"]].append(codec.fault_from(row["fault_json"]))
    return {i: tuple(faults) for i, faults in found.items()}


def _bounded(limit: int) -> int:
    return max(1, min(limit, PAGE_MAX))


def _lease_from(row: Mapping[str, Any]) -> Lease:
    def at(seconds: float) -> datetime:
        return datetime.fromtimestamp(seconds, UTC)

    return Lease(
        holder=row["holder"],
        epoch=row["epoch"],
        acquired_at=at(row["acquired_at"]),
        renewed_at=at(row["renewed_at"]),
        expires_at=at(row["expires_at"]),
        now=at(row["now"]),
    )


class SqliteStore:
    def __init__(
        self,
        path: Path,
        *,
        synchronous: str = "full",
        units_per_batch: int = 16,
        clock: Callable[[], datetime] | None = None,
    ) -> None:
        self.path = path
        #: The lease's clock: ``None`` is the database's own (``_DB_NOW``); tests pass fake time.
        self._clock = clock
        #: Set on a fenced view (``fenced``): every write checks it in its transaction.
        self._fence: Fence | None = None
        self._writer = Writer(path, synchronous=synchronous, units_per_batch=units_per_batch)
        self._reader = Reader(path)
        #: Event kind → outbox destinations it is also written to (``route_events``).
        self._routes: dict[str, tuple[str, ...]] = {}
        #: Outbox rows routed so far (writer thread); a unit that changed it wakes ``_on_routed``.
        self._routed = 0
        self._on_routed: list[Callable[[], None]] = []

    def route_events(
        self, kinds: frozenset[str], destination: str, *, wake: Callable[[], None] | None = None
    ) -> None:
        """Timeline events of ``kinds`` also go to ``destination``'s outbox, in their own transaction
        (step outcomes and decisions for Slack's thread). Set up before the store is used.

        ``wake`` (the outbox sender's) is called once a write that routed an event has committed,
        so a routed notice leaves at once instead of at the sender's next idle poll."""
        for kind in kinds:
            self._routes[kind] = (*self._routes.get(kind, ()), destination)
        if wake is not None:
            self._on_routed.append(wake)

    def fenced(self, fence: Fence) -> SqliteStore:
        """This store (same files, writer, reader and routes), every write checked against ``fence``."""
        view = copy.copy(self)
        view._fence = fence
        return view

    async def _write(self, unit: Callable[[sqlite3.Connection], _T]) -> _T:
        """Run ``unit`` in the writer's transaction; after the commit, wake the outbox if it routed.

        On a fenced view the unit first checks, in the same transaction, that the leadership row
        still names this process's holder and epoch. ``BEGIN IMMEDIATE`` holds the database's
        write lock from that check to the commit, so no other process can take the lease over in
        between (on Postgres: ``SELECT ... FOR SHARE`` of the row, which a takeover's UPDATE waits for).
        """
        fence = self._fence
        token = fence.token() if fence is not None else None  # Deposed before touching the store

        def run(db: sqlite3.Connection) -> tuple[_T, bool]:
            if (
                token is not None
                and not db.execute(
                    "SELECT 1 FROM leadership WHERE id = 1 AND holder = ? AND epoch = ?", token
                ).fetchone()
            ):
                raise Deposed(f"{token[0]} no longer holds epoch {token[1]}: another process took over")
            before = self._routed
            value = unit(db)
            return value, self._routed != before

        try:
            result: tuple[_T, bool] = await self._writer.submit(run)
        except Deposed as exc:
            if fence is not None:
                fence.deposed(str(exc))
            raise
        value, routed = result
        if routed:
            for wake in self._on_routed:
                wake()
        return value

    def _events(
        self, db: sqlite3.Connection, incident_id: str | None, events: Sequence[NewEvent], now: datetime
    ) -> None:
        """Append to the timeline and, for routed kinds, to the outbox, in the caller's transaction."""
        for event in events:
            insert_events(db, [(incident_id, event)], now)
            destinations = self._routes.get(event.kind)
            if destinations:
                _outbox.route(db, incident_id, event, destinations, now)
                self._routed += 1

    async def open(self) -> None:
        await self._writer.open()  # creates and migrates the database
        await self._reader.open()

    async def close(self) -> None:
        try:
            await self._writer.close()
        finally:
            await self._reader.close()

    async def ping(self) -> bool:
        """Ready for writes: readable, and the writer says its writes commit where a restart finds
        them (``Writer.ready``: files in place, writable, room left, the last write succeeded)."""
        try:
            await self._reader.run(lambda db: db.execute("SELECT 1").fetchall())
        except Exception:  # readiness probes report, they do not raise
            return False
        return await self._writer.ready()

    # ------------------------------------------------------------------- reads
    async def _rows(self, sql: str, params: Sequence[Any] = ()) -> list[sqlite3.Row]:
        return await self._reader.run(lambda db: db.execute(sql, params).fetchall())

    async def _one(self, sql: str, params: Sequence[Any] = ()) -> sqlite3.Row | None:
        return await self._reader.run(lambda db: db.execute(sql, params).fetchone())

    async def incident(self, incident_id: str) -> IncidentRecord | None:
        def query(db: sqlite3.Connection) -> IncidentRecord | None:
            row = db.execute("SELECT * FROM incidents WHERE id = ?", (incident_id,)).fetchone()
            return codec.incident_from(row, _faults(db, [incident_id])[incident_id]) if row else None

        return await self._reader.run(query)

    async def incidents(
        self, *, active_only: bool = False, node: str | None = None, limit: int = 100
    ) -> list[IncidentRecord]:
        where, params = [], []
        if active_only:
            where.append(f"state NOT IN {TERMINAL_STATES}")
        if node is not None:
            where.append("node = ?")
            params.append(node)
        clause = f"WHERE {' AND '.join(where)}" if where else ""
        sql = f"SELECT * FROM incidents {clause} ORDER BY seq DESC LIMIT ?"  # noqa: S608 - fixed fragments

        def query(db: sqlite3.Connection) -> list[IncidentRecord]:
            rows = db.execute(sql, [*params, limit]).fetchall()
            faults = _faults(db, [r["id"] for r in rows])
            return [codec.incident_from(r, faults[r["id"]]) for r in rows]

        return await self._reader.run(query)

    async def active(self) -> list[tuple[str, State, datetime]]:
        query = (
            f"SELECT id, state, opened_at FROM incidents WHERE state NOT IN {TERMINAL_STATES} ORDER BY seq"  # noqa: S608
        )
        rows = await self._rows(query)
        return [(r["id"], State(r["state"]), codec.dt(r["opened_at"]) or datetime.min) for r in rows]

    async def alerts_of(self, incident_id: str) -> list[AlertRecord]:
        def query(db: sqlite3.Connection) -> list[AlertRecord]:
            rows = db.execute(f"{_ALERTS} WHERE a.incident_id = ? {_ALERT_ORDER}", (incident_id,))
            return [self._with_pending(codec.alert_from(r)) for r in rows]

        return await self._reader.run(query)

    async def alerts_page(
        self, incident_id: str, *, limit: int, after: str | None = None
    ) -> Page[AlertRecord]:
        limit = _bounded(limit)
        where, params = "incident_id = ?", [incident_id]
        if after is not None:
            where += " AND (first_seen, fingerprint, starts_at) > (?, ?, ?)"
            params.extend(alert_key(after))  # BadCursor before anything is read
        # The page's keys first, then only its rows joined and decoded.
        sql = (
            "SELECT a.*, d.deliveries, d.last_seen FROM (SELECT fingerprint, starts_at FROM alerts"  # noqa: S608
            f" WHERE {where} ORDER BY first_seen, fingerprint, starts_at LIMIT ?) k"
            " JOIN alerts a ON a.fingerprint = k.fingerprint AND a.starts_at = k.starts_at"
            " JOIN alert_deliveries d ON d.fingerprint = a.fingerprint AND d.starts_at = a.starts_at"
            f" {_ALERT_ORDER}"
        )

        def query(db: sqlite3.Connection) -> Page[AlertRecord]:
            rows = db.execute(sql, [*params, limit + 1]).fetchall()
            page = rows[:limit]
            last = page[-1] if len(rows) > limit else None
            return Page(
                tuple(self._with_pending(codec.alert_from(r)) for r in page),
                alert_cursor((last["first_seen"], last["fingerprint"], last["starts_at"])) if last else None,
            )

        return await self._reader.run(query)

    def _with_pending(self, alert: AlertRecord) -> AlertRecord:
        """Include repeat deliveries counted in memory and not yet committed.

        Runs in the reader thread, beside the loop that counts: a read landing while a flush
        commits may count that flush's deliveries twice or not at all, until the next read."""
        key = dedupe_key(alert.fingerprint, alert.starts_at)
        pending = [p for p in (self._writer.seen.get(key), self._writer.flushing.get(key)) if p is not None]
        if not pending:
            return alert
        last = max([alert.last_seen, *(codec.dt(stamp) or alert.last_seen for stamp, _ in pending)])
        return replace(alert, deliveries=alert.deliveries + sum(n for _, n in pending), last_seen=last)

    async def alert(self, fingerprint: str, starts_at: datetime) -> AlertRecord | None:
        def query(db: sqlite3.Connection) -> AlertRecord | None:
            row = db.execute(
                f"{_ALERTS} WHERE a.fingerprint = ? AND a.starts_at = ?", dedupe_key(fingerprint, starts_at)
            ).fetchone()
            return self._with_pending(codec.alert_from(row)) if row else None

        return await self._reader.run(query)

    async def events_of(self, incident_id: str) -> list[Event]:
        def query(db: sqlite3.Connection) -> list[Event]:
            rows = db.execute("SELECT * FROM events WHERE incident_id = ? ORDER BY seq", (incident_id,))
            return [codec.event_from(r) for r in rows]

        return await self._reader.run(query)

    async def events_page(self, incident_id: str, *, limit: int, after: str | None = None) -> Page[Event]:
        limit, since = _bounded(limit), event_key(after) if after is not None else 0

        def query(db: sqlite3.Connection) -> Page[Event]:
            rows = db.execute(
                "SELECT * FROM events WHERE incident_id = ? AND seq > ? ORDER BY seq LIMIT ?",
                (incident_id, since, limit + 1),
            ).fetchall()
            events = tuple(codec.event_from(r) for r in rows[:limit])
            return Page(events, str(events[-1].seq) if len(rows) > limit else None)

        return await self._reader.run(query)

    async def events_since(self, seq: int, limit: int = 1000) -> list[Event]:
        def query(db: sqlite3.Connection) -> list[Event]:
            rows = db.execute("SELECT * FROM events WHERE seq > ? ORDER BY seq LIMIT ?", (seq, limit))
            return [codec.event_from(r) for r in rows]

        return await self._reader.run(query)

    async def steps_of(self, incident_id: str) -> dict[str, StepRecord]:
        rows = await self._rows("SELECT * FROM steps WHERE incident_id = ?", (incident_id,))
        return {r["step"]: codec.step_from(r) for r in rows}

    async def approval(self, incident_id: str) -> ApprovalRecord | None:
        row = await self._one(
            "SELECT * FROM approvals WHERE incident_id = ? ORDER BY requested_at DESC LIMIT 1", (incident_id,)
        )
        return codec.approval_from(row) if row else None

    async def switch(self, name: str) -> Mapping[str, Any] | None:
        row = await self._one("SELECT value_json, set_by, set_at FROM switches WHERE name = ?", (name,))
        if row is None or row["value_json"] is None:
            return None
        value: dict[str, Any] = json.loads(row["value_json"])
        return {**value, "set_by": row["set_by"], "set_at": row["set_at"]}

    async def history(self, node: str, since: datetime, exclude: str | None = None) -> list[PastIncident]:
        rows = await self._rows(
            "SELECT id, playbook, opened_at, acted FROM incidents WHERE node = ? AND opened_at >= ? AND id != ?"
            " AND playbook IS NOT NULL ORDER BY seq",
            (node, codec.ts(since), exclude or ""),
        )
        return [
            PastIncident(r["id"], r["playbook"], codec.dt(r["opened_at"]) or since, bool(r["acted"]))
            for r in rows
        ]

    async def nodes_in_remediation(self, since: datetime, exclude_node: str | None = None) -> frozenset[str]:
        # An active incident holds its place from admission (two admitted at once must not both
        # slip under the limit); an ended one keeps it only if pitcrew changed something for it
        # (an "action" in its audit log), so one that failed before any change gives it back.
        rows = await self._rows(
            "SELECT DISTINCT node FROM incidents i WHERE guarded_at IS NOT NULL AND guarded_at >= ? AND node != ?"  # noqa: S608 - a constant
            f" AND (state NOT IN {TERMINAL_STATES}"
            " OR EXISTS (SELECT 1 FROM events e WHERE e.incident_id = i.id AND e.kind = ?))",
            (codec.ts(since), exclude_node or "", ACTION),
        )
        return frozenset(r["node"] for r in rows)

    async def rollbacks_requested(self) -> list[str]:
        rows = await self._rows(
            "SELECT s.incident_id FROM steps s JOIN incidents i ON i.id = s.incident_id"
            " WHERE s.step = 'rollback' AND s.status = 'running' ORDER BY i.seq"
        )
        return [r["incident_id"] for r in rows]

    # ------------------------------------------------------------------- lease
    def _now(self) -> tuple[str, list[Any]]:
        """The lease clock as an SQL expression and its parameters."""
        if self._clock is None:
            return _DB_NOW, []
        return "?", [self._clock().timestamp()]

    def _lease_row(self, db: sqlite3.Connection) -> Lease | None:
        now, params = self._now()
        cursor = db.execute(
            f"SELECT holder, epoch, acquired_at, renewed_at, expires_at, {now} AS now FROM leadership WHERE id = 1",  # noqa: S608
            params,
        )
        row = cursor.fetchone()  # a tuple on the writer's connection, a Row on the reader's
        return _lease_from(dict(zip([c[0] for c in cursor.description], row, strict=True))) if row else None

    async def lease(self) -> Lease | None:
        return await self._reader.run(self._lease_row)

    async def acquire_lease(self, holder: str, ttl: timedelta) -> Lease:
        # On Postgres: the same upsert with now() (the transaction's start) and RETURNING *.
        now, params = self._now()
        seconds = ttl.total_seconds()

        def unit(db: sqlite3.Connection) -> Lease:
            db.execute(
                "INSERT INTO leadership (id, holder, epoch, acquired_at, renewed_at, expires_at)"  # noqa: S608
                f" SELECT 1, ?, 1, t, t, t + ? FROM (SELECT {now} AS t) WHERE true"
                " ON CONFLICT (id) DO UPDATE SET holder = excluded.holder, epoch = leadership.epoch + 1,"
                " acquired_at = excluded.acquired_at, renewed_at = excluded.renewed_at,"
                " expires_at = excluded.expires_at"
                " WHERE leadership.expires_at <= excluded.acquired_at OR leadership.holder = excluded.holder",
                [holder, seconds, *params],
            )
            lease = self._lease_row(db)
            assert lease is not None
            return lease

        return await self._unfenced(unit)

    async def renew_lease(self, holder: str, epoch: int, ttl: timedelta) -> Lease | None:
        now, params = self._now()

        def unit(db: sqlite3.Connection) -> Lease | None:
            cursor = db.execute(
                f"UPDATE leadership SET renewed_at = t, expires_at = t + ? FROM (SELECT {now} AS t)"  # noqa: S608
                " WHERE id = 1 AND holder = ? AND epoch = ?",
                [ttl.total_seconds(), *params, holder, epoch],
            )
            return self._lease_row(db) if cursor.rowcount else None

        return await self._unfenced(unit)

    async def release_lease(self, holder: str, epoch: int) -> None:
        now, params = self._now()

        def unit(db: sqlite3.Connection) -> None:
            db.execute(
                f"UPDATE leadership SET expires_at = MIN(expires_at, {now})"  # noqa: S608
                " WHERE id = 1 AND holder = ? AND epoch = ?",
                [*params, holder, epoch],
            )

        await self._unfenced(unit)

    async def _unfenced(self, unit: Callable[[sqlite3.Connection], _T]) -> _T:
        """The lease's own writes: never fenced (a standby must be able to take the lease)."""
        value: _T = await self._writer.submit(unit)
        return value

    # ------------------------------------------------------------------ writes
    async def ingest(self, delivery: Delivery, now: datetime) -> IngestOutcome:
        repeats = await self.count_repeats(
            [(a.fingerprint, a.starts_at, a.status) for a in delivery.alerts], now
        )
        if repeats is not None:
            return IngestOutcome(repeated_alerts=repeats)
        result: IngestOutcome = await self._writer.submit(IngestJob(delivery, now))
        self._writer.remember(result.cache)  # committed: safe to remember
        return result

    async def count_repeats(
        self, alerts: Sequence[tuple[str, datetime, AlertStatus]], now: datetime
    ) -> int | None:
        """If every alert is already stored in the same status, count the delivery and return how many
        alerts it had; else ``None`` and nothing is counted (the caller ingests it in full). Answered
        from memory, without waiting: committed keys are cached, the counts flushed every second."""
        if not self._writer.running:
            raise StoreUnavailable("store is not open")
        lost = self._writer.lost()  # the keys we remember were committed to that file
        if lost is not None:
            raise StoreUnavailable(f"{lost}: a restart would not find what this delivery stores")
        keys = []
        for fingerprint, starts_at, status in alerts:
            key = dedupe_key(fingerprint, starts_at)
            state = self._writer.keys.get(key)
            if state is None or (state[0] == "firing" and status == "resolved"):
                return None
            keys.append(key)
        stamp = codec.ts(now) or ""
        seen = self._writer.seen
        for key in keys:
            old = seen.get(key, (stamp, 0))
            seen[key] = (max(old[0], stamp), old[1] + 1)
        return len(keys)

    async def record(self, incident_id: str | None, event: NewEvent, now: datetime) -> None:
        await self._write(lambda db: self._events(db, incident_id, [event], now))

    async def save_plan(
        self, incident_id: str, plan: Plan, events: Sequence[NewEvent], now: datetime
    ) -> None:
        document = codec.dumps(codec.encode_plan(plan))

        def unit(db: sqlite3.Connection) -> None:
            db.execute(
                "UPDATE incidents SET plan_json = ?, playbook = ?, mode = ?, faults_changed = 0, updated_at = ?"
                " WHERE id = ?",
                (document, plan.playbook, plan.mode.value, codec.ts(now), incident_id),
            )
            insert_events(db, [(incident_id, e) for e in events], now)

        await self._write(unit)

    async def ack_faults(self, incident_id: str) -> None:
        await self._write(
            lambda db: db.execute("UPDATE incidents SET faults_changed = 0 WHERE id = ?", (incident_id,))
        )

    async def transition(
        self,
        incident_id: str,
        state: State,
        now: datetime,
        *,
        event: NewEvent | None = None,
        outcome: str | None = None,
        guarded: bool = False,
        unless: str | None = None,
    ) -> IncidentRecord:
        """Move an incident. ``unless="new_fault"`` skips the move if a new fault attached
        meanwhile; ``unless="firing"`` also if any of its alerts still fires. Decided inside the
        write, so a delivery landing at the same moment never attaches to an incident that then
        closes."""
        stamp = codec.ts(now)

        def unit(db: sqlite3.Connection) -> None:
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
                where += " AND NOT EXISTS (SELECT 1 FROM alerts WHERE incident_id = ? AND status = 'firing')"
                params_where.append(incident_id)
            cursor = db.execute(
                f"UPDATE incidents SET {', '.join(sets)} WHERE {where}",  # noqa: S608 - fixed fragments
                [*params, *params_where],
            )
            if event is not None and cursor.rowcount:
                self._events(db, incident_id, [event], now)

        await self._write(unit)
        record = await self.incident(incident_id)
        assert record is not None
        return record

    async def advance(self, incident_id: str, step_index: int, now: datetime) -> None:
        await self._write(
            lambda db: db.execute(
                "UPDATE incidents SET step_index = ?, updated_at = ? WHERE id = ?",
                (step_index, codec.ts(now), incident_id),
            )
        )

    async def step_started(
        self, incident_id: str, step: str, attempt: int, now: datetime, *, acted: bool
    ) -> None:
        stamp = codec.ts(now)

        def unit(db: sqlite3.Connection) -> None:
            db.execute(
                "INSERT INTO steps (incident_id, step, status, attempts, started_at) VALUES (?, ?, 'running', ?, ?)"
                " ON CONFLICT (incident_id, step) DO UPDATE SET status = 'running', attempts = excluded.attempts,"
                " started_at = CASE WHEN steps.status IN ('superseded', 'held') THEN excluded.started_at"
                " ELSE COALESCE(steps.started_at, excluded.started_at) END,"
                " result_json = CASE WHEN steps.status = 'superseded' THEN '{}' ELSE steps.result_json END,"
                " ended_at = NULL",
                (incident_id, step, attempt, stamp),
            )
            if acted:
                db.execute("UPDATE incidents SET acted = 1 WHERE id = ?", (incident_id,))
            insert_events(db, [(incident_id, NewEvent("step_started", step=step, attempt=attempt))], now)

        await self._write(unit)

    async def step_finished(
        self,
        incident_id: str,
        step: str,
        status: StepStatus,
        now: datetime,
        *,
        result: JsonObject | None = None,
        event: NewEvent,
    ) -> None:
        stamp = codec.ts(now)

        def unit(db: sqlite3.Connection) -> None:
            db.execute(
                "INSERT INTO steps (incident_id, step, status, attempts, started_at, ended_at, result_json)"
                " VALUES (?, ?, ?, 0, NULL, ?, ?) ON CONFLICT (incident_id, step) DO UPDATE SET"
                " status = excluded.status, ended_at = excluded.ended_at, result_json = excluded.result_json",
                (incident_id, step, status, stamp, codec.dumps(dict(result or {}))),
            )
            self._events(db, incident_id, [event], now)

        await self._write(unit)

    async def request_rollback(
        self, incident_id: str, result: JsonObject, event: NewEvent, now: datetime
    ) -> bool:
        document = codec.dumps(dict(result))

        def unit(db: sqlite3.Connection) -> bool:
            cursor = db.execute(
                "INSERT INTO steps (incident_id, step, status, attempts, started_at, result_json)"
                " VALUES (?, 'rollback', 'running', 0, ?, ?) ON CONFLICT (incident_id, step) DO NOTHING",
                (incident_id, codec.ts(now), document),
            )
            if cursor.rowcount:
                self._events(db, incident_id, [event], now)
            return bool(cursor.rowcount)

        recorded: bool = await self._write(unit)
        return recorded

    async def step_progress(self, incident_id: str, step: str, progress: JsonObject, now: datetime) -> None:
        document = codec.dumps(dict(progress))

        def unit(db: sqlite3.Connection) -> None:
            db.execute(
                "INSERT INTO steps (incident_id, step, status, attempts, started_at, result_json)"
                " VALUES (?, ?, 'running', 0, ?, ?) ON CONFLICT (incident_id, step) DO UPDATE SET"
                " result_json = excluded.result_json",
                (incident_id, step, codec.ts(now), document),
            )

        await self._write(unit)

    async def request_approval(
        self, incident_id: str, step: str, approvers: Sequence[str], deadline: datetime, now: datetime
    ) -> ApprovalRecord:
        def unit(db: sqlite3.Connection) -> None:
            db.execute(
                "INSERT INTO approvals (incident_id, step, requested_at, deadline, approvers_json, status)"
                " VALUES (?, ?, ?, ?, ?, 'pending') ON CONFLICT (incident_id, step) DO NOTHING",
                (incident_id, step, codec.ts(now), codec.ts(deadline), codec.dumps(list(approvers))),
            )

        await self._write(unit)
        record = await self.approval(incident_id)
        assert record is not None
        return record

    async def decide_approval(
        self, incident_id: str, status: ApprovalStatus, actor: str, now: datetime
    ) -> ApprovalRecord | None:
        def unit(db: sqlite3.Connection) -> int:
            cursor = db.execute(
                "UPDATE approvals SET status = ?, decided_by = ?, decided_at = ?"
                " WHERE incident_id = ? AND status = 'pending'",
                (status, actor, codec.ts(now), incident_id),
            )
            return cursor.rowcount

        changed: int = await self._write(unit)
        return await self.approval(incident_id) if changed else None

    async def set_switch(self, name: str, value: Mapping[str, Any] | None, actor: str, now: datetime) -> None:
        await self._write(
            lambda db: db.execute(
                "INSERT INTO switches (name, value_json, set_by, set_at) VALUES (?, ?, ?, ?)"
                " ON CONFLICT (name) DO UPDATE SET value_json = excluded.value_json, set_by = excluded.set_by,"
                " set_at = excluded.set_at",
                (name, codec.dumps(dict(value)) if value is not None else None, actor, codec.ts(now)),
            )
        )

    # ------------------------------------------------------------------ outbox
    async def enqueue(
        self,
        incident_id: str | None,
        event: NewEvent,
        kind: str,
        payload: JsonObject,
        destinations: Sequence[str],
        now: datetime,
    ) -> int:
        seq: int = await self._write(
            lambda db: _outbox.enqueue(db, incident_id, event, kind, payload, destinations, now)
        )
        return seq

    async def outbox_pending(self, destination: str, limit: int = 100) -> list[OutboxItem]:
        return await self._reader.run(lambda db: _outbox.pending(db, destination, limit))

    async def outbox_item(self, item_id: int) -> OutboxItem | None:
        return await self._reader.run(lambda db: _outbox.item(db, item_id))

    async def outbox_attempt(self, item_id: int, now: datetime) -> None:
        await self._write(lambda db: _outbox.attempt(db, item_id))

    async def outbox_delivered(self, item_id: int, ref: str | None, now: datetime) -> None:
        await self._write(lambda db: _outbox.delivered(db, item_id, ref, now))

    async def outbox_defer(self, item_id: int, not_before: datetime, error: str) -> None:
        await self._write(lambda db: _outbox.defer(db, item_id, not_before, error))

    async def outbox_ref(self, destination: str, key: str) -> str | None:
        return await self._reader.run(lambda db: _outbox.ref(db, destination, key))

    async def set_outbox_ref(self, destination: str, key: str, ref: str, now: datetime) -> None:
        await self._write(lambda db: _outbox.set_ref(db, destination, key, ref, now))

    async def incident_links(self, incident_id: str) -> dict[str, str]:
        key = link_key(incident_id)
        return await self._reader.run(lambda db: _outbox.refs_by_key(db, key))
