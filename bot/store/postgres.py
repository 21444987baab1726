"""PostgreSQL implementation of the incident store port: the store of several replicas (HA).

Selected by ``store.url: postgresql://…`` (password from ``store.password_file``); SQLite stays
the embedded default. Same schema versions as SQLite (``bot.store.postgres_schema``), same codec,
same dedupe (``bot.store.ingest.Batch`` works a delivery out in memory; only its statements are
Postgres's), same outbox rows and references, same lease and fence.

The driver is psycopg 3 through its native asyncio API and its pool: it ships type annotations
(``mypy --strict`` checks every call against it), ``executemany`` sends a batch's rows in one
pipeline, and one libpq underneath speaks every authentication and TLS option a site's Postgres
may ask for through the ordinary ``postgresql://`` URL.

Every write transaction takes one advisory lock (``_WRITE_LOCK``) first, so writes of every
replica are serialised as SQLite's ``BEGIN IMMEDIATE`` serialises processes on one file: an
incident number (``MAX(seq) + 1``) is never taken twice, two deliveries never race for one
node's incident, and events are numbered in commit order, so a reader of ``events_since`` never
skips an event that commits late with a lower number. pitcrew writes a few transactions per
alert; one lock costs little beside a round trip. A fenced write also locks the leadership row
``FOR SHARE`` in its transaction: a takeover's UPDATE waits until it commits, and after a
takeover the check finds another epoch and raises ``Deposed`` with nothing written. The lease's
own writes take no advisory lock (a renewal never waits behind a long ingest); their times are the
database's ``now()``, whatever the replicas' clocks say.
"""

from __future__ import annotations

import asyncio
import copy
import json
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, TypeVar

import psycopg
from psycopg.rows import DictRow, dict_row
from psycopg_pool import AsyncConnectionPool, PoolTimeout

from bot import logger
from bot.domain.alerts import AlertStatus, dedupe_key
from bot.domain.faults import Fault
from bot.domain.incident import State
from bot.domain.planner import PastIncident, Plan
from bot.store import codec
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
from bot.store.ingest import Batch, KeyState
from bot.store.lease import Deposed, Fence
from bot.store.outbox import item_from
from bot.store.postgres_schema import MIGRATIONS, VERSION_TABLE
from bot.store.reader import alert_cursor, alert_key, event_key
from bot.store.schema import SCHEMA_VERSION, TERMINAL_STATES

log = logger(__name__)
_T = TypeVar("_T")
Conn = psycopg.AsyncConnection[DictRow]

#: Advisory lock keys: every write transaction, and schema migration at start.
_WRITE_LOCK = 0x7069_7463
_MIGRATE_LOCK = 0x7069_746D
_ALERTS = (
    "SELECT a.*, d.deliveries, d.last_seen FROM alerts a"
    " JOIN alert_deliveries d ON d.fingerprint = a.fingerprint AND d.starts_at = a.starts_at"
)
_ALERT_ORDER = "ORDER BY a.first_seen, a.fingerprint, a.starts_at"
_BUMP_SEEN = (
    "UPDATE alert_deliveries SET last_seen = GREATEST(last_seen, %s), deliveries = deliveries + %s"
    " WHERE fingerprint = %s AND starts_at = %s"
)
_INSERT_EVENT = (
    "INSERT INTO events (incident_id, at, kind, step, outcome, attempt, actor, detail, data_json)"
    " VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s) RETURNING seq"
)
_INSERT_OUTBOX = (
    "INSERT INTO outbox (destination, incident_id, event_seq, kind, payload_json, created_at)"
    " VALUES (%s, %s, %s, %s, %s, %s)"
)


def _event_row(incident_id: str | None, event: NewEvent, at: datetime) -> tuple[Any, ...]:
    return (
        incident_id,
        codec.ts(at),
        event.kind,
        event.step,
        event.outcome,
        event.attempt,
        event.actor,
        event.detail,
        codec.dumps(dict(event.data)),
    )


def read_password(path: Path) -> str:
    """The password in ``store.password_file`` (its first line: a Kubernetes Secret's file)."""
    lines = path.read_text().splitlines()
    return lines[0] if lines else ""


@dataclass(slots=True)
class _Shared:
    """What a store and its fenced views have in common: the pool, opened after they are made."""

    pool: AsyncConnectionPool[Conn] | None = None
    #: How the pool connects (``release_lease`` connects the same way, on its own).
    kwargs: dict[str, Any] = field(default_factory=dict)


@dataclass(slots=True)
class _Tx:
    """One write transaction: its connection, and whether it routed an event to an outbox."""

    conn: Conn
    routed: bool = False

    async def run(self, sql: str, params: Sequence[Any] = ()) -> int:
        cursor = await self.conn.execute(sql, params)
        return cursor.rowcount

    async def many(self, sql: str, rows: Sequence[Sequence[Any]]) -> None:
        if rows:
            async with self.conn.cursor() as cursor:
                await cursor.executemany(sql, rows)

    async def one(self, sql: str, params: Sequence[Any] = ()) -> DictRow | None:
        cursor = await self.conn.execute(sql, params)
        return await cursor.fetchone()

    async def all(self, sql: str, params: Sequence[Any] = ()) -> list[DictRow]:
        cursor = await self.conn.execute(sql, params)
        return await cursor.fetchall()


def _bounded(limit: int) -> int:
    return max(1, min(limit, PAGE_MAX))


#: How long a pitcrew session may sit inside a transaction with no statement running. pitcrew
#: sends a transaction's statements back to back: only a frozen process waits this long.
IDLE_IN_TRANSACTION_MS = 5000


class PostgresStore:
    def __init__(
        self,
        url: str,
        *,
        password_file: Path | None = None,
        pool_size: int = 10,
        connect_timeout: float = 10.0,
        clock: Callable[[], datetime] | None = None,
    ) -> None:
        self.url = url
        self._password_file = password_file
        self._pool_size = pool_size
        self._connect_timeout = connect_timeout
        #: The lease's clock: ``None`` is the database's ``now()``; tests pass fake time.
        self._clock = clock
        self._fence: Fence | None = None
        #: Shared with every fenced view (``fenced`` copies this object, not the pool).
        self._shared = _Shared()
        self._routes: dict[str, tuple[str, ...]] = {}
        self._on_routed: list[Callable[[], None]] = []

    def route_events(
        self, kinds: frozenset[str], destination: str, *, wake: Callable[[], None] | None = None
    ) -> None:
        """As ``SqliteStore.route_events``: timeline events of ``kinds`` also go to ``destination``'s
        outbox in their own transaction; ``wake`` is called once such a write has committed."""
        for kind in kinds:
            self._routes[kind] = (*self._routes.get(kind, ()), destination)
        if wake is not None:
            self._on_routed.append(wake)

    def fenced(self, fence: Fence) -> PostgresStore:
        """This store (same pool and routes), every write checked against ``fence``."""
        view = copy.copy(self)
        view._fence = fence
        return view

    # ------------------------------------------------------------- connection
    async def open(self) -> None:
        kwargs: dict[str, Any] = {
            "autocommit": True,
            "row_factory": dict_row,
            "connect_timeout": max(1, int(self._connect_timeout)),
            # A process frozen inside a transaction (SIGSTOP, a paused VM) would hold the write
            # lock and the lease row FOR SHARE for as long as it is frozen, and no other replica
            # could write or take over: the server ends such a session and rolls it back.
            "options": f"-c timezone=UTC -c idle_in_transaction_session_timeout={IDLE_IN_TRANSACTION_MS}",
            "application_name": "pitcrew",
        }
        if self._password_file is not None:
            kwargs["password"] = read_password(self._password_file)
        self._shared.kwargs = kwargs
        pool: AsyncConnectionPool[Conn] = AsyncConnectionPool(
            self.url,
            connection_class=psycopg.AsyncConnection[DictRow],
            kwargs=kwargs,
            min_size=1,
            max_size=self._pool_size,
            timeout=self._connect_timeout,
            open=False,
            name="pitcrew-store",
        )
        try:
            await pool.open(wait=True, timeout=self._connect_timeout)
        except PoolTimeout as exc:
            await pool.close()
            raise StoreUnavailable(f"cannot connect to {self._where()}: {exc}") from exc
        self._shared.pool = pool
        try:
            await self._migrate()
        except BaseException:
            await self.close()
            raise

    def _where(self) -> str:
        info = psycopg.conninfo.conninfo_to_dict(self.url)
        return f"postgresql://{info.get('host', '')}:{info.get('port', 5432)}/{info.get('dbname', '')}"

    async def close(self) -> None:
        pool, self._shared.pool = self._shared.pool, None
        if pool is not None:
            await pool.close()

    @asynccontextmanager
    async def _conn(self) -> AsyncIterator[Conn]:
        pool = self._shared.pool
        if pool is None:
            raise StoreUnavailable("store is not open")
        try:
            async with pool.connection() as conn:
                yield conn
        except (PoolTimeout, psycopg.OperationalError) as exc:
            raise StoreUnavailable(f"{self._where()}: {exc}") from exc

    async def _migrate(self) -> None:
        async with self._conn() as conn, conn.transaction():
            await conn.execute("SELECT pg_advisory_xact_lock(%s)", (_MIGRATE_LOCK,))
            await conn.execute(VERSION_TABLE)
            row = await (await conn.execute("SELECT version FROM pitcrew_schema")).fetchone()
            if row is None:
                await conn.execute("INSERT INTO pitcrew_schema (version) VALUES (0)")
            version = int(row["version"]) if row is not None else 0
            if version > SCHEMA_VERSION:
                raise RuntimeError(
                    f"{self._where()} has schema {version}, newer than this pitcrew ({SCHEMA_VERSION})"
                )
            for number in range(version, SCHEMA_VERSION):
                async with conn.transaction():  # a savepoint: each migration whole or not at all
                    await conn.execute(MIGRATIONS[number])
                    await conn.execute("UPDATE pitcrew_schema SET version = %s", (number + 1,))
                log.info("store schema migrated", extra={"schema_version": number + 1})

    async def schema_version(self) -> int:
        row = await self._one("SELECT version FROM pitcrew_schema")
        return int(row["version"]) if row is not None else 0

    async def ping(self) -> bool:
        """Ready for writes: the database answers and is not read-only (a standby of a failover pair)."""
        try:
            row = await self._one("SELECT pg_is_in_recovery() AS standby")
        except Exception:  # readiness probes report, they do not raise
            return False
        return row is not None and not row["standby"]

    # ------------------------------------------------------------------ writes
    async def _write(self, unit: Callable[[_Tx], Awaitable[_T]], *, fence: bool = True) -> _T:
        """Run ``unit`` in one transaction under the write lock; on a fenced view, first check that
        the leadership row still carries this process's holder and epoch (``FOR SHARE``: a takeover
        waits for this commit). After the commit, wake the outbox if the unit routed an event."""
        view_fence = self._fence if fence else None
        token = view_fence.token() if view_fence is not None else None  # Deposed before any I/O
        try:
            async with self._conn() as conn, conn.transaction():
                tx = _Tx(conn)
                await tx.run("SELECT pg_advisory_xact_lock(%s)", (_WRITE_LOCK,))
                if token is not None and not await tx.one(
                    "SELECT 1 FROM leadership WHERE id = 1 AND holder = %s AND epoch = %s FOR SHARE", token
                ):
                    raise Deposed(f"{token[0]} no longer holds epoch {token[1]}: another process took over")
                value = await unit(tx)
        except Deposed as exc:
            if view_fence is not None:
                view_fence.deposed(str(exc))
            raise
        if tx.routed:
            for wake in self._on_routed:
                wake()
        return value

    async def _events(
        self, tx: _Tx, incident_id: str | None, events: Sequence[NewEvent], now: datetime
    ) -> int | None:
        """Append to the timeline and, for routed kinds, to the outbox; the last event's seq."""
        seq: int | None = None
        for event in events:
            row = await tx.one(_INSERT_EVENT, _event_row(incident_id, event, now))
            assert row is not None
            seq = int(row["seq"])
            destinations = self._routes.get(event.kind)
            if destinations:
                payload = {
                    "event": True,
                    "step": event.step,
                    "outcome": event.outcome,
                    "actor": event.actor,
                    "detail": event.detail,
                }
                document = codec.dumps(payload)
                await tx.many(
                    _INSERT_OUTBOX,
                    [(d, incident_id, seq, event.kind, document, codec.ts(now)) for d in destinations],
                )
                tx.routed = True
        return seq

    async def ingest(self, delivery: Delivery, now: datetime) -> IngestOutcome:
        """One transaction: look up the delivery's keys and the nodes' incidents, work the delivery
        out in memory (``Batch``, as SQLite does), write its rows (repeats only bump counters)."""
        keys = [dedupe_key(a.fingerprint, a.starts_at) for a in delivery.alerts]

        async def unit(tx: _Tx) -> IngestOutcome:
            known = await _known(tx, keys)
            opening = {
                a.node
                for a, k in zip(delivery.alerts, keys, strict=True)
                if k not in known and a.node is not None and a.fault is not None
            }
            active, faults_of = await _active_incidents(tx, opening) if opening else ({}, {})
            batch = Batch(known, active, faults_of)
            outcome = batch.add(delivery, keys, now)
            await _write_batch(tx, batch)
            return outcome

        return await self._write(unit, fence=False)

    async def count_repeats(
        self, alerts: Sequence[tuple[str, datetime, AlertStatus]], now: datetime
    ) -> int | None:
        """If every alert is already stored in the same status, count the delivery (one transaction)
        and return how many alerts it had; else ``None`` and nothing is counted."""
        keys = [dedupe_key(fingerprint, starts_at) for fingerprint, starts_at, _ in alerts]
        stamp = codec.ts(now)

        async def unit(tx: _Tx) -> int | None:
            known = await _known(tx, keys)
            for key, (_, _, status) in zip(keys, alerts, strict=True):
                state = known.get(key)
                if state is None or (state[0] == "firing" and status == "resolved"):
                    return None
            await tx.many(_BUMP_SEEN, [(stamp, 1, *key) for key in keys])
            return len(keys)

        return await self._write(unit, fence=False)

    async def record(self, incident_id: str | None, event: NewEvent, now: datetime) -> None:
        async def unit(tx: _Tx) -> None:
            await self._events(tx, incident_id, [event], now)

        await self._write(unit)

    async def save_plan(
        self, incident_id: str, plan: Plan, events: Sequence[NewEvent], now: datetime
    ) -> None:
        document = codec.dumps(codec.encode_plan(plan))

        async def unit(tx: _Tx) -> None:
            await tx.run(
                "UPDATE incidents SET plan_json = %s, playbook = %s, mode = %s, faults_changed = 0,"
                " updated_at = %s WHERE id = %s",
                (document, plan.playbook, plan.mode.value, codec.ts(now), incident_id),
            )
            await tx.many(_INSERT_EVENT, [_event_row(incident_id, e, now) for e in events])

        await self._write(unit)

    async def ack_faults(self, incident_id: str) -> None:
        async def unit(tx: _Tx) -> None:
            await tx.run("UPDATE incidents SET faults_changed = 0 WHERE id = %s", (incident_id,))

        await self._write(unit)

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
        """As ``SqliteStore.transition``: ``unless`` is decided inside the write."""
        stamp = codec.ts(now)

        async def unit(tx: _Tx) -> None:
            sets = ["state = %s", "updated_at = %s"]
            params: list[Any] = [state.value, stamp]
            if state.terminal:
                sets.append("closed_at = %s")
                params.append(stamp)
            if outcome is not None:
                sets.append("outcome = %s")
                params.append(outcome)
            if guarded:
                sets.append("guarded_at = COALESCE(guarded_at, %s)")
                params.append(stamp)
            where, params_where = "id = %s", [incident_id]
            if unless in {"new_fault", "firing"}:
                where += " AND faults_changed = 0"
            if unless == "firing":
                where += " AND NOT EXISTS (SELECT 1 FROM alerts WHERE incident_id = %s AND status = 'firing')"
                params_where.append(incident_id)
            changed = await tx.run(
                f"UPDATE incidents SET {', '.join(sets)} WHERE {where}",  # noqa: S608 - fixed fragments
                [*params, *params_where],
            )
            if event is not None and changed:
                await self._events(tx, incident_id, [event], now)

        await self._write(unit)
        record = await self.incident(incident_id)
        assert record is not None
        return record

    async def advance(self, incident_id: str, step_index: int, now: datetime) -> None:
        async def unit(tx: _Tx) -> None:
            await tx.run(
                "UPDATE incidents SET step_index = %s, updated_at = %s WHERE id = %s",
                (step_index, codec.ts(now), incident_id),
            )

        await self._write(unit)

    async def step_started(
        self, incident_id: str, step: str, attempt: int, now: datetime, *, acted: bool
    ) -> None:
        stamp = codec.ts(now)

        async def unit(tx: _Tx) -> None:
            await tx.run(
                "INSERT INTO steps (incident_id, step, status, attempts, started_at)"
                " VALUES (%s, %s, 'running', %s, %s)"
                " ON CONFLICT (incident_id, step) DO UPDATE SET status = 'running', attempts = excluded.attempts,"
                " started_at = CASE WHEN steps.status IN ('superseded', 'held') THEN excluded.started_at"
                " ELSE COALESCE(steps.started_at, excluded.started_at) END,"
                " result_json = CASE WHEN steps.status = 'superseded' THEN '{}' ELSE steps.result_json END,"
                " ended_at = NULL",
                (incident_id, step, attempt, stamp),
            )
            if acted:
                await tx.run("UPDATE incidents SET acted = 1 WHERE id = %s", (incident_id,))
            await tx.run(
                _INSERT_EVENT,
                _event_row(incident_id, NewEvent("step_started", step=step, attempt=attempt), now),
            )

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

        async def unit(tx: _Tx) -> None:
            await tx.run(
                "INSERT INTO steps (incident_id, step, status, attempts, started_at, ended_at, result_json)"
                " VALUES (%s, %s, %s, 0, NULL, %s, %s) ON CONFLICT (incident_id, step) DO UPDATE SET"
                " status = excluded.status, ended_at = excluded.ended_at, result_json = excluded.result_json",
                (incident_id, step, status, stamp, codec.dumps(dict(result or {}))),
            )
            await self._events(tx, incident_id, [event], now)

        await self._write(unit)

    async def request_rollback(
        self, incident_id: str, result: JsonObject, event: NewEvent, now: datetime
    ) -> bool:
        document = codec.dumps(dict(result))

        async def unit(tx: _Tx) -> bool:
            inserted = await tx.run(
                "INSERT INTO steps (incident_id, step, status, attempts, started_at, result_json)"
                " VALUES (%s, 'rollback', 'running', 0, %s, %s) ON CONFLICT (incident_id, step) DO NOTHING",
                (incident_id, codec.ts(now), document),
            )
            if inserted:
                await self._events(tx, incident_id, [event], now)
            return bool(inserted)

        return await self._write(unit)

    async def step_progress(self, incident_id: str, step: str, progress: JsonObject, now: datetime) -> None:
        document = codec.dumps(dict(progress))

        async def unit(tx: _Tx) -> None:
            await tx.run(
                "INSERT INTO steps (incident_id, step, status, attempts, started_at, result_json)"
                " VALUES (%s, %s, 'running', 0, %s, %s) ON CONFLICT (incident_id, step) DO UPDATE SET"
                " result_json = excluded.result_json",
                (incident_id, step, codec.ts(now), document),
            )

        await self._write(unit)

    async def request_approval(
        self, incident_id: str, step: str, approvers: Sequence[str], deadline: datetime, now: datetime
    ) -> ApprovalRecord:
        async def unit(tx: _Tx) -> None:
            await tx.run(
                "INSERT INTO approvals (incident_id, step, requested_at, deadline, approvers_json, status)"
                " VALUES (%s, %s, %s, %s, %s, 'pending') ON CONFLICT (incident_id, step) DO NOTHING",
                (incident_id, step, codec.ts(now), codec.ts(deadline), codec.dumps(list(approvers))),
            )

        await self._write(unit)
        record = await self.approval(incident_id)
        assert record is not None
        return record

    async def decide_approval(
        self, incident_id: str, status: ApprovalStatus, actor: str, now: datetime
    ) -> ApprovalRecord | None:
        async def unit(tx: _Tx) -> int:
            return await tx.run(
                "UPDATE approvals SET status = %s, decided_by = %s, decided_at = %s"
                " WHERE incident_id = %s AND status = 'pending'",
                (status, actor, codec.ts(now), incident_id),
            )

        changed = await self._write(unit)
        return await self.approval(incident_id) if changed else None

    async def set_switch(self, name: str, value: Mapping[str, Any] | None, actor: str, now: datetime) -> None:
        async def unit(tx: _Tx) -> None:
            await tx.run(
                "INSERT INTO switches (name, value_json, set_by, set_at) VALUES (%s, %s, %s, %s)"
                " ON CONFLICT (name) DO UPDATE SET value_json = excluded.value_json, set_by = excluded.set_by,"
                " set_at = excluded.set_at",
                (name, codec.dumps(dict(value)) if value is not None else None, actor, codec.ts(now)),
            )

        await self._write(unit)

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
        document = codec.dumps(dict(payload))

        async def unit(tx: _Tx) -> int:
            row = await tx.one(_INSERT_EVENT, _event_row(incident_id, event, now))
            assert row is not None
            seq = int(row["seq"])
            await tx.many(
                _INSERT_OUTBOX, [(d, incident_id, seq, kind, document, codec.ts(now)) for d in destinations]
            )
            return seq

        return await self._write(unit)

    async def outbox_pending(self, destination: str, limit: int = 100) -> list[OutboxItem]:
        rows = await self._rows(
            "SELECT * FROM outbox WHERE destination = %s AND delivered_at IS NULL ORDER BY id LIMIT %s",
            (destination, limit),
        )
        return [item_from(r) for r in rows]

    async def outbox_item(self, item_id: int) -> OutboxItem | None:
        row = await self._one("SELECT * FROM outbox WHERE id = %s", (item_id,))
        return item_from(row) if row else None

    async def outbox_attempt(self, item_id: int, now: datetime) -> None:
        await self._update("UPDATE outbox SET attempts = attempts + 1 WHERE id = %s", (item_id,))

    async def outbox_delivered(self, item_id: int, ref: str | None, now: datetime) -> None:
        await self._update(
            "UPDATE outbox SET delivered_at = %s, ref = %s, not_before = NULL, last_error = '' WHERE id = %s",
            (codec.ts(now), ref, item_id),
        )

    async def outbox_defer(self, item_id: int, not_before: datetime, error: str) -> None:
        await self._update(
            "UPDATE outbox SET not_before = %s, last_error = %s WHERE id = %s",
            (codec.ts(not_before), error[:500], item_id),
        )

    async def outbox_ref(self, destination: str, key: str) -> str | None:
        row = await self._one(
            "SELECT ref FROM outbox_refs WHERE destination = %s AND key = %s", (destination, key)
        )
        return str(row["ref"]) if row else None

    async def set_outbox_ref(self, destination: str, key: str, ref: str, now: datetime) -> None:
        await self._update(
            "INSERT INTO outbox_refs (destination, key, ref, updated_at) VALUES (%s, %s, %s, %s)"
            " ON CONFLICT (destination, key) DO UPDATE SET ref = excluded.ref, updated_at = excluded.updated_at",
            (destination, key, ref, codec.ts(now)),
        )

    async def incident_links(self, incident_id: str) -> dict[str, str]:
        rows = await self._rows(
            "SELECT destination, ref FROM outbox_refs WHERE key = %s", (link_key(incident_id),)
        )
        return {str(r["destination"]): str(r["ref"]) for r in rows}

    async def _update(self, sql: str, params: Sequence[Any]) -> None:
        async def unit(tx: _Tx) -> None:
            await tx.run(sql, params)

        await self._write(unit)

    # ------------------------------------------------------------------- reads
    async def _rows(self, sql: str, params: Sequence[Any] = ()) -> list[DictRow]:
        async with self._conn() as conn:
            cursor = await conn.execute(sql, params)
            return await cursor.fetchall()

    async def _one(self, sql: str, params: Sequence[Any] = ()) -> DictRow | None:
        async with self._conn() as conn:
            cursor = await conn.execute(sql, params)
            return await cursor.fetchone()

    async def _faults(self, conn: Conn, incident_ids: Sequence[str]) -> dict[str, tuple[Fault, ...]]:
        """Each incident's faults, one per fault key (its first occurrence), in order of first occurrence."""
        found: dict[str, list[Fault]] = {i: [] for i in incident_ids}
        if incident_ids:
            cursor = await conn.execute(
                "SELECT DISTINCT ON (incident_id, fault_key) incident_id, fault_key, fault_json, starts_at"
                " FROM alerts WHERE incident_id = ANY(%s) AND fault_json IS NOT NULL"
                " ORDER BY incident_id, fault_key, starts_at",
                (list(incident_ids),),
            )
            rows = sorted(await cursor.fetchall(), key=lambda r: (r["starts_at"], r["fault_key"]))
            for row in rows:
                found[row["incident_id"]].append(codec.fault_from(row["fault_json"]))
        return {i: tuple(faults) for i, faults in found.items()}

    async def incident(self, incident_id: str) -> IncidentRecord | None:
        async with self._conn() as conn, conn.transaction():
            row = await (
                await conn.execute("SELECT * FROM incidents WHERE id = %s", (incident_id,))
            ).fetchone()
            if row is None:
                return None
            return codec.incident_from(row, (await self._faults(conn, [incident_id]))[incident_id])

    async def incidents(
        self, *, active_only: bool = False, node: str | None = None, limit: int = 100
    ) -> list[IncidentRecord]:
        where: list[str] = []
        params: list[Any] = []
        if active_only:
            where.append(f"state NOT IN {TERMINAL_STATES}")
        if node is not None:
            where.append("node = %s")
            params.append(node)
        clause = f"WHERE {' AND '.join(where)}" if where else ""
        sql = f"SELECT * FROM incidents {clause} ORDER BY seq DESC LIMIT %s"  # noqa: S608 - fixed fragments
        async with self._conn() as conn, conn.transaction():
            rows = await (await conn.execute(sql, [*params, limit])).fetchall()
            faults = await self._faults(conn, [r["id"] for r in rows])
        return [codec.incident_from(r, faults[r["id"]]) for r in rows]

    async def active(self) -> list[tuple[str, State, datetime]]:
        rows = await self._rows(
            f"SELECT id, state, opened_at FROM incidents WHERE state NOT IN {TERMINAL_STATES} ORDER BY seq"  # noqa: S608
        )
        return [(r["id"], State(r["state"]), codec.dt(r["opened_at"]) or datetime.min) for r in rows]

    async def alerts_of(self, incident_id: str) -> list[AlertRecord]:
        rows = await self._rows(f"{_ALERTS} WHERE a.incident_id = %s {_ALERT_ORDER}", (incident_id,))
        return [codec.alert_from(r) for r in rows]

    async def alerts_page(
        self, incident_id: str, *, limit: int, after: str | None = None
    ) -> Page[AlertRecord]:
        limit = _bounded(limit)
        where, params = "incident_id = %s", [incident_id]
        if after is not None:
            where += " AND (first_seen, fingerprint, starts_at) > (%s, %s, %s)"
            params.extend(alert_key(after))  # BadCursor before anything is read
        sql = (
            "SELECT a.*, d.deliveries, d.last_seen FROM (SELECT fingerprint, starts_at FROM alerts"  # noqa: S608
            f" WHERE {where} ORDER BY first_seen, fingerprint, starts_at LIMIT %s) k"
            " JOIN alerts a ON a.fingerprint = k.fingerprint AND a.starts_at = k.starts_at"
            " JOIN alert_deliveries d ON d.fingerprint = a.fingerprint AND d.starts_at = a.starts_at"
            f" {_ALERT_ORDER}"
        )
        rows = await self._rows(sql, [*params, limit + 1])
        page = rows[:limit]
        last = page[-1] if len(rows) > limit else None
        return Page(
            tuple(codec.alert_from(r) for r in page),
            alert_cursor((last["first_seen"], last["fingerprint"], last["starts_at"])) if last else None,
        )

    async def alert(self, fingerprint: str, starts_at: datetime) -> AlertRecord | None:
        row = await self._one(
            f"{_ALERTS} WHERE a.fingerprint = %s AND a.starts_at = %s", dedupe_key(fingerprint, starts_at)
        )
        return codec.alert_from(row) if row else None

    async def events_of(self, incident_id: str) -> list[Event]:
        rows = await self._rows("SELECT * FROM events WHERE incident_id = %s ORDER BY seq", (incident_id,))
        return [codec.event_from(r) for r in rows]

    async def events_page(self, incident_id: str, *, limit: int, after: str | None = None) -> Page[Event]:
        limit, since = _bounded(limit), event_key(after) if after is not None else 0
        rows = await self._rows(
            "SELECT * FROM events WHERE incident_id = %s AND seq > %s ORDER BY seq LIMIT %s",
            (incident_id, since, limit + 1),
        )
        events = tuple(codec.event_from(r) for r in rows[:limit])
        return Page(events, str(events[-1].seq) if len(rows) > limit else None)

    async def events_since(self, seq: int, limit: int = 1000) -> list[Event]:
        rows = await self._rows("SELECT * FROM events WHERE seq > %s ORDER BY seq LIMIT %s", (seq, limit))
        return [codec.event_from(r) for r in rows]

    async def steps_of(self, incident_id: str) -> dict[str, StepRecord]:
        rows = await self._rows("SELECT * FROM steps WHERE incident_id = %s", (incident_id,))
        return {r["step"]: codec.step_from(r) for r in rows}

    async def approval(self, incident_id: str) -> ApprovalRecord | None:
        row = await self._one(
            "SELECT * FROM approvals WHERE incident_id = %s ORDER BY requested_at DESC LIMIT 1",
            (incident_id,),
        )
        return codec.approval_from(row) if row else None

    async def switch(self, name: str) -> Mapping[str, Any] | None:
        row = await self._one("SELECT value_json, set_by, set_at FROM switches WHERE name = %s", (name,))
        if row is None or row["value_json"] is None:
            return None
        value: dict[str, Any] = json.loads(row["value_json"])
        return {**value, "set_by": row["set_by"], "set_at": row["set_at"]}

    async def history(self, node: str, since: datetime, exclude: str | None = None) -> list[PastIncident]:
        rows = await self._rows(
            "SELECT id, playbook, opened_at, acted FROM incidents WHERE node = %s AND opened_at >= %s"
            " AND id != %s AND playbook IS NOT NULL ORDER BY seq",
            (node, codec.ts(since), exclude or ""),
        )
        return [
            PastIncident(r["id"], r["playbook"], codec.dt(r["opened_at"]) or since, bool(r["acted"]))
            for r in rows
        ]

    async def nodes_in_remediation(self, since: datetime, exclude_node: str | None = None) -> frozenset[str]:
        # As on SQLite: an active incident holds its place from admission; an ended one keeps it
        # only if pitcrew changed something for it (an "action" in its audit log).
        rows = await self._rows(
            "SELECT DISTINCT node FROM incidents i WHERE guarded_at IS NOT NULL AND guarded_at >= %s AND node != %s"  # noqa: S608 - a constant
            f" AND (state NOT IN {TERMINAL_STATES}"
            " OR EXISTS (SELECT 1 FROM events e WHERE e.incident_id = i.id AND e.kind = %s))",
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
        """The lease clock as an SQL expression and its parameters: the database's ``now()``."""
        if self._clock is None:
            return "now()", []
        return "%s::timestamptz", [self._clock()]

    async def _lease_row(
        self, run: Callable[[str, Sequence[Any]], Awaitable[DictRow | None]]
    ) -> Lease | None:
        now, params = self._now()
        row = await run(
            f"SELECT holder, epoch, acquired_at, renewed_at, expires_at, {now} AS now FROM leadership WHERE id = 1",  # noqa: S608
            params,
        )
        if row is None:
            return None
        return Lease(
            holder=row["holder"],
            epoch=int(row["epoch"]),
            acquired_at=row["acquired_at"].astimezone(UTC),
            renewed_at=row["renewed_at"].astimezone(UTC),
            expires_at=row["expires_at"].astimezone(UTC),
            now=row["now"].astimezone(UTC),
        )

    async def lease(self) -> Lease | None:
        return await self._lease_row(self._one)

    async def _lease_write(self, unit: Callable[[_Tx], Awaitable[_T]]) -> _T:
        """The lease's own writes: never fenced, no write lock (a renewal never waits on ingest)."""
        async with self._conn() as conn, conn.transaction():
            return await unit(_Tx(conn))

    async def acquire_lease(self, holder: str, ttl: timedelta) -> Lease:
        now, params = self._now()

        async def unit(tx: _Tx) -> Lease:
            await tx.run(
                "INSERT INTO leadership (id, holder, epoch, acquired_at, renewed_at, expires_at)"  # noqa: S608
                f" SELECT 1, %s, 1, n.t, n.t, n.t + make_interval(secs => %s) FROM (SELECT {now} AS t) n"
                " ON CONFLICT (id) DO UPDATE SET holder = excluded.holder, epoch = leadership.epoch + 1,"
                " acquired_at = excluded.acquired_at, renewed_at = excluded.renewed_at,"
                " expires_at = excluded.expires_at"
                " WHERE leadership.expires_at <= excluded.acquired_at OR leadership.holder = excluded.holder",
                [holder, ttl.total_seconds(), *params],
            )
            lease = await self._lease_row(tx.one)
            assert lease is not None
            return lease

        return await self._lease_write(unit)

    async def renew_lease(self, holder: str, epoch: int, ttl: timedelta) -> Lease | None:
        now, params = self._now()

        async def unit(tx: _Tx) -> Lease | None:
            renewed = await tx.run(
                "UPDATE leadership SET renewed_at = n.t, expires_at = n.t + make_interval(secs => %s)"  # noqa: S608
                f" FROM (SELECT {now} AS t) n WHERE id = 1 AND holder = %s AND epoch = %s",
                [ttl.total_seconds(), *params, holder, epoch],
            )
            return await self._lease_row(tx.one) if renewed else None

        return await self._lease_write(unit)

    async def release_lease(self, holder: str, epoch: int) -> None:
        """End the term now (graceful shutdown), on a connection of its own: at SIGTERM
        ``asyncio.run`` cancels every task, the pool's background workers too, and the release
        must not depend on them."""
        if self._shared.pool is None:
            raise StoreUnavailable("store is not open")
        now, params = self._now()
        try:
            async with asyncio.timeout(self._connect_timeout):
                conn = await psycopg.AsyncConnection.connect(self.url, **self._shared.kwargs)
                async with conn:
                    await conn.execute(
                        f"UPDATE leadership SET expires_at = LEAST(expires_at, {now})"  # noqa: S608
                        " WHERE id = 1 AND holder = %s AND epoch = %s",
                        [*params, holder, epoch],
                    )
        except (TimeoutError, psycopg.OperationalError) as exc:
            raise StoreUnavailable(f"{self._where()}: {exc}") from exc


# ----------------------------------------------------------------- ingest SQL
async def _known(tx: _Tx, keys: Sequence[tuple[str, str]]) -> dict[tuple[str, str], KeyState]:
    """Stored state of these keys (looked up by fingerprint, the primary key's prefix)."""
    if not keys:
        return {}
    wanted = set(keys)
    rows = await tx.all(
        "SELECT fingerprint, starts_at, status, incident_id FROM alerts WHERE fingerprint = ANY(%s)",
        (sorted({fingerprint for fingerprint, _ in wanted}),),
    )
    found: dict[tuple[str, str], KeyState] = {}
    for r in rows:
        key = (r["fingerprint"], r["starts_at"])
        if key in wanted:
            found[key] = (r["status"], r["incident_id"])
    return found


async def _active_incidents(
    tx: _Tx, nodes: set[str]
) -> tuple[dict[str, tuple[str, str]], dict[str, set[str]]]:
    found: dict[str, tuple[str, str]] = {}
    faults: dict[str, set[str]] = {}
    rows = await tx.all(
        "SELECT DISTINCT i.node, i.id, i.state, a.fault_key FROM incidents i"  # noqa: S608
        " LEFT JOIN alerts a ON a.incident_id = i.id"
        f" WHERE i.node = ANY(%s) AND i.state NOT IN {TERMINAL_STATES}",
        (sorted(nodes),),
    )
    for r in rows:
        found[r["node"]] = (r["id"], r["state"])
        keys = faults.setdefault(r["id"], set())
        if r["fault_key"] is not None:
            keys.add(r["fault_key"])
    return found, faults


async def _write_batch(tx: _Tx, batch: Batch) -> None:
    """The rows ``Batch`` worked out, as ``Batch.write`` writes them on SQLite."""
    names: dict[str, str] = {}
    if batch.incidents:
        row = await tx.one("SELECT COALESCE(MAX(seq), 0) + 1 AS next FROM incidents")
        first = int(row["next"]) if row else 1
        rows = []
        for offset, (placeholder, node, stamp, starts, group_key) in enumerate(batch.incidents):
            seq = first + offset
            names[placeholder] = f"pc-{seq:05d}"
            rows.append((names[placeholder], seq, node, State.OPEN.value, stamp, stamp, starts, group_key))
        await tx.many(
            "INSERT INTO incidents (id, seq, node, state, opened_at, updated_at, first_alert_at, group_key)"
            " VALUES (%s, %s, %s, %s, %s, %s, %s, %s)",
            rows,
        )
        batch.rename(names)
    if batch.inserts:
        await tx.many(
            "INSERT INTO alerts (fingerprint, starts_at, ends_at, status, alertname, node, incident_id,"
            " fault_key, fault_json, labels_json, annotations_json, group_key, first_seen)"
            " VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s)",
            [(*row[:6], names.get(row[6], row[6]), *row[7:-1]) for row in batch.inserts],
        )
        await tx.many(
            "INSERT INTO alert_deliveries (fingerprint, starts_at, deliveries, last_seen) VALUES (%s, %s, 1, %s)",
            [(row[0], row[1], row[-1]) for row in batch.inserts],
        )
    if batch.seen:
        await tx.many(_BUMP_SEEN, batch.seen)
    if batch.resolves:
        await tx.many(
            "UPDATE alerts SET status = 'resolved', ends_at = %s WHERE fingerprint = %s AND starts_at = %s",
            [(ends, fingerprint, starts) for ends, _, fingerprint, starts in batch.resolves],
        )
        await tx.many(
            _BUMP_SEEN, [(stamp, 1, fingerprint, starts) for _, stamp, fingerprint, starts in batch.resolves]
        )
    if batch.changed:
        await tx.many("UPDATE incidents SET faults_changed = 1, updated_at = %s WHERE id = %s", batch.changed)
    if batch.events:
        await tx.many(
            _INSERT_EVENT.removesuffix(" RETURNING seq"),
            [_event_row(names.get(i, i) if i else i, e, at) for i, e, at in batch.events],
        )
