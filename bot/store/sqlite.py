"""SQLite implementation of the incident store (WAL, versioned schema, group commit).

One writer connection owns every write: units of work queue up and the writer runs as
many as are waiting in one transaction (each in its own savepoint, so one failing unit
does not sink the others), then commits once. Callers get their result only after the
commit: an alert acknowledged with 200 is on disk. Reads use a second connection and never
wait behind writes (WAL).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import sqlite3
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from pathlib import Path
from typing import Any, TypeVar

import aiosqlite

from bot.domain.faults import Fault
from bot.domain.incident import State
from bot.domain.planner import PastIncident
from bot.store import codec
from bot.store.base import (
    AlertRecord,
    ApprovalRecord,
    Delivery,
    Event,
    IncidentRecord,
    IngestOutcome,
    NewEvent,
    StepRecord,
    StoreUnavailable,
)
from bot.store.ingest import KeyState, bump_seen, ingest, insert_events
from bot.store.schema import MIGRATIONS, SCHEMA_VERSION, TERMINAL_STATES

log = logging.getLogger(__name__)
_ALERTS = (
    "SELECT a.*, d.deliveries, d.last_seen FROM alerts a"
    " JOIN alert_deliveries d ON d.fingerprint = a.fingerprint AND d.starts_at = a.starts_at"
)
_CHECKPOINT_EVERY = 2.0  # seconds
_FLUSH_EVERY = 1.0  # seconds: repeat-delivery counters reach the disk at least this often
T = TypeVar("T")
Unit = Callable[[aiosqlite.Connection], Awaitable[Any]]


@dataclass(frozen=True, slots=True)
class IngestJob:
    """One webhook delivery to persist; consecutive jobs in a batch are ingested together."""

    delivery: Delivery
    now: datetime


Item = tuple[Unit | IngestJob, "asyncio.Future[Any]"]
Result = tuple["asyncio.Future[Any]", Any, BaseException | None]


def _groups(batch: list[Item]) -> list[list[Item]]:
    """Queue order kept; runs of consecutive ingest jobs become one group."""
    groups: list[list[Item]] = []
    for item in batch:
        if groups and isinstance(item[0], IngestJob) and isinstance(groups[-1][0][0], IngestJob):
            groups[-1].append(item)
        else:
            groups.append([item])
    return groups


async def _run_group(
    db: aiosqlite.Connection, group: list[Item], keys: Mapping[tuple[str, str], KeyState]
) -> list[Result]:
    first = group[0][0]
    if isinstance(first, IngestJob):
        jobs = [job for job, _ in group if isinstance(job, IngestJob)]
        outcomes = await ingest(db, [(job.delivery, job.now) for job in jobs], keys)
        return [(future, outcome, None) for (_, future), outcome in zip(group, outcomes, strict=True)]
    return [(group[0][1], await first(db), None)]


class SqliteStore:
    def __init__(self, path: Path, *, synchronous: str = "full", units_per_batch: int = 4) -> None:
        self.path = path
        self._synchronous = synchronous.upper()
        self._units_per_batch = units_per_batch  # engine writes per transaction: bounds a delivery's wait
        self._writer: aiosqlite.Connection | None = None
        # Reads run on the event loop's own thread: in WAL mode a reader never waits for the
        # writer, and a read of a few rows costs microseconds, less than a hop to a worker thread.
        self._reader: sqlite3.Connection | None = None
        self._queue: asyncio.Queue[Item] = asyncio.Queue()
        self._task: asyncio.Task[None] | None = None
        # Committed alert keys → (status, incident): Alertmanager redelivers whole groups every
        # repeat_interval, and a pure repeat needs no write beyond a delivery counter.
        self._keys: OrderedDict[tuple[str, str], KeyState] = OrderedDict()
        self._keys_max = 200_000
        self._seen: dict[tuple[str, str], tuple[str, int]] = {}
        self._flushing: dict[tuple[str, str], tuple[str, int]] = {}
        self._closing = False
        self._checkpointer: aiosqlite.Connection | None = None
        self._checkpoints: asyncio.Task[None] | None = None

    # ----------------------------------------------------------------- lifecycle
    async def open(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._writer = await aiosqlite.connect(self.path, isolation_level=None)
        self._writer.row_factory = aiosqlite.Row
        for pragma in (
            "journal_mode=WAL",
            f"synchronous={self._synchronous}",
            "foreign_keys=ON",
            "busy_timeout=10000",
            # Checkpoints run on their own connection (below): a commit never pays for one.
            "wal_autocheckpoint=0",
        ):
            await self._writer.execute(f"PRAGMA {pragma}")
        await self._migrate(self._writer)
        self._reader = sqlite3.connect(self.path, isolation_level=None)
        self._reader.row_factory = sqlite3.Row
        self._reader.execute("PRAGMA query_only=ON")
        self._checkpointer = await aiosqlite.connect(self.path, isolation_level=None)
        await self._checkpointer.execute("PRAGMA busy_timeout=10000")
        self._task = asyncio.create_task(self._write_loop(), name="pitcrew-store-writer")
        self._checkpoints = asyncio.create_task(self._checkpoint_loop(), name="pitcrew-store-checkpoint")

    async def close(self) -> None:
        if self._task is not None:
            self._closing = True
            if self._seen:
                await self._write(lambda db: asyncio.sleep(0))  # the writer flushes pending repeats first
            await self._queue.join()
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        if self._checkpoints is not None:
            self._checkpoints.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._checkpoints
            self._checkpoints = None
        if self._checkpointer is not None:
            with contextlib.suppress(sqlite3.Error):
                await self._checkpointer.execute("PRAGMA wal_checkpoint(TRUNCATE)")
            await self._checkpointer.close()
            self._checkpointer = None
        if self._reader is not None:
            self._reader.close()
        if self._writer is not None:
            await self._writer.close()
        self._reader = self._writer = None

    async def _checkpoint_loop(self) -> None:
        """Fold the WAL back into the database now and then, beside the writer, never in its way."""
        assert self._checkpointer is not None
        while True:
            await asyncio.sleep(_CHECKPOINT_EVERY)
            try:
                await self._checkpointer.execute("PRAGMA wal_checkpoint(PASSIVE)")
            except sqlite3.Error:
                log.warning("WAL checkpoint failed; will retry", exc_info=True)

    async def ping(self) -> bool:
        try:
            await self._one("SELECT 1")
        except Exception:  # readiness probes report, they do not raise
            return False
        return self._task is not None and not self._task.done()

    async def _migrate(self, db: aiosqlite.Connection) -> None:
        async with db.execute("PRAGMA user_version") as cursor:
            row = await cursor.fetchone()
        version = int(row[0]) if row else 0
        if version > SCHEMA_VERSION:
            raise RuntimeError(
                f"{self.path} has schema {version}, newer than this pitcrew ({SCHEMA_VERSION})"
            )
        for number in range(version, SCHEMA_VERSION):
            # executescript commits any open transaction first, so the script carries its own.
            try:
                await db.executescript(
                    f"BEGIN IMMEDIATE; {MIGRATIONS[number]}; PRAGMA user_version = {number + 1}; COMMIT;"
                )
            except Exception:
                with contextlib.suppress(Exception):
                    await db.execute("ROLLBACK")
                raise
            log.info("store schema migrated", extra={"schema_version": number + 1})

    # ------------------------------------------------------------ group commit
    async def _write(self, unit: Unit | IngestJob) -> Any:
        if self._task is None or self._task.done():
            raise StoreUnavailable("store is not open")
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        await self._queue.put((unit, future))
        return await future

    async def _write_loop(self) -> None:
        assert self._writer is not None
        db = self._writer
        flushed = time.monotonic()
        while True:
            # Repeat-delivery counters go to disk on their own clock, never in a delivery's
            # transaction: a burst of redeliveries must not slow down the one new alert.
            if self._seen and (time.monotonic() - flushed >= _FLUSH_EVERY or self._closing):
                await self._flush_only(db)
                flushed = time.monotonic()
            try:
                first = await asyncio.wait_for(self._queue.get(), timeout=_FLUSH_EVERY)
            except TimeoutError:
                continue
            batch = [first]
            units = 0 if isinstance(first[0], IngestJob) else 1
            # Deliveries first and all of them (they are cheap together: one statement per
            # table); engine writes at most a few per batch, so a webhook never waits long.
            while not self._queue.empty() and units < self._units_per_batch:
                item = self._queue.get_nowait()
                units += not isinstance(item[0], IngestJob)
                batch.append(item)
            batch.sort(key=lambda item: not isinstance(item[0], IngestJob))
            try:
                results = await self._run_batch(db, batch, {})
            except Exception as exc:
                log.exception("store write batch failed", extra={"units": len(batch)})
                failure = StoreUnavailable(f"write failed: {exc}")
                results = [(future, None, failure) for _, future in batch]
            for future, value, error in results:
                if not future.done():
                    if error is None:
                        future.set_result(value)
                    else:
                        future.set_exception(error)
            for _ in batch:
                self._queue.task_done()

    async def _run_batch(
        self, db: aiosqlite.Connection, batch: list[Item], seen: dict[Any, Any]
    ) -> list[Result]:
        """All units in one transaction; if any fails, roll back and run each alone.

        The common case (nothing fails) costs one BEGIN and one COMMIT for the whole batch;
        a failing unit only fails itself.
        """
        results: list[Result] = []
        await db.execute("BEGIN IMMEDIATE")
        try:
            if seen:
                await bump_seen(db, [(stamp, n, fp, starts) for (fp, starts), (stamp, n) in seen.items()])
            for group in _groups(batch):
                results.extend(await _run_group(db, group, self._keys))
            await db.execute("COMMIT")
            return results
        except sqlite3.OperationalError:
            with contextlib.suppress(Exception):
                await db.execute("ROLLBACK")
            raise  # the database itself is in trouble: every caller gets StoreUnavailable
        except Exception as exc:
            with contextlib.suppress(Exception):
                await db.execute("ROLLBACK")
            if len(batch) == 1 and not seen:
                return [(batch[0][1], None, exc)]  # the unit's own error, e.g. a constraint
        if seen:
            await self._run_batch(db, [], seen)
        results = []
        for item in batch:
            results.extend(await self._run_batch(db, [item], {}))
        return results

    async def _flush_only(self, db: aiosqlite.Connection) -> None:
        seen = self._take_seen()
        try:
            await self._run_batch(db, [], seen)
        except Exception:
            log.exception("could not record repeat deliveries; will retry")
            self._return_seen(seen)
        finally:
            self._flushing = {}

    def _take_seen(self) -> dict[tuple[str, str], tuple[str, int]]:
        """Hand pending repeat counts to a write; readers keep seeing them until it commits."""
        seen, self._seen = self._seen, {}
        self._flushing = seen
        return seen

    def _return_seen(self, seen: dict[tuple[str, str], tuple[str, int]]) -> None:
        for key, (stamp, count) in seen.items():  # not lost: retried with the next write
            old = self._seen.get(key, (stamp, 0))
            self._seen[key] = (max(old[0], stamp), old[1] + count)

    # ------------------------------------------------------------------- reads
    async def _rows(self, sql: str, params: Sequence[Any] = ()) -> list[sqlite3.Row]:
        if self._reader is None:
            raise StoreUnavailable("store is not open")
        return self._reader.execute(sql, params).fetchall()

    async def _one(self, sql: str, params: Sequence[Any] = ()) -> sqlite3.Row | None:
        rows = await self._rows(sql, params)
        return rows[0] if rows else None

    async def _faults(self, incident_ids: Sequence[str]) -> dict[str, tuple[Fault, ...]]:
        found: dict[str, dict[str, Fault]] = {i: {} for i in incident_ids}
        if incident_ids:
            marks = ",".join("?" for _ in incident_ids)
            for row in await self._rows(
                f"SELECT incident_id, fault_key, fault_json FROM alerts WHERE incident_id IN ({marks})"  # noqa: S608
                " AND fault_json IS NOT NULL ORDER BY starts_at",
                list(incident_ids),
            ):
                found[row["incident_id"]].setdefault(row["fault_key"], codec.fault_from(row["fault_json"]))
        return {i: tuple(faults.values()) for i, faults in found.items()}

    async def incident(self, incident_id: str) -> IncidentRecord | None:
        row = await self._one("SELECT * FROM incidents WHERE id = ?", (incident_id,))
        if row is None:
            return None
        return codec.incident_from(row, (await self._faults([incident_id]))[incident_id])

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
        query = f"SELECT * FROM incidents {clause} ORDER BY seq DESC LIMIT ?"  # noqa: S608 - fixed fragments
        rows = await self._rows(query, [*params, limit])
        faults = await self._faults([r["id"] for r in rows])
        return [codec.incident_from(r, faults[r["id"]]) for r in rows]

    async def active(self) -> list[tuple[str, State, datetime]]:
        query = (
            f"SELECT id, state, opened_at FROM incidents WHERE state NOT IN {TERMINAL_STATES} ORDER BY seq"  # noqa: S608
        )
        rows = await self._rows(query)
        return [(r["id"], State(r["state"]), codec.dt(r["opened_at"]) or datetime.min) for r in rows]

    async def alerts_of(self, incident_id: str) -> list[AlertRecord]:
        rows = await self._rows(f"{_ALERTS} WHERE a.incident_id = ? ORDER BY a.first_seen", (incident_id,))
        return [self._with_pending(codec.alert_from(r)) for r in rows]

    def _with_pending(self, alert: AlertRecord) -> AlertRecord:
        """Include repeat deliveries counted in memory and not yet committed."""
        key = (alert.fingerprint, codec.ts(alert.starts_at) or "")
        pending = [p for p in (self._seen.get(key), self._flushing.get(key)) if p is not None]
        if not pending:
            return alert
        last = max([alert.last_seen, *(codec.dt(stamp) or alert.last_seen for stamp, _ in pending)])
        return replace(alert, deliveries=alert.deliveries + sum(n for _, n in pending), last_seen=last)

    async def alert(self, fingerprint: str, starts_at: datetime) -> AlertRecord | None:
        row = await self._one(
            f"{_ALERTS} WHERE a.fingerprint = ? AND a.starts_at = ?", (fingerprint, codec.ts(starts_at))
        )
        return self._with_pending(codec.alert_from(row)) if row else None

    async def events_of(self, incident_id: str) -> list[Event]:
        rows = await self._rows("SELECT * FROM events WHERE incident_id = ? ORDER BY seq", (incident_id,))
        return [codec.event_from(r) for r in rows]

    async def events_since(self, seq: int, limit: int = 1000) -> list[Event]:
        rows = await self._rows("SELECT * FROM events WHERE seq > ? ORDER BY seq LIMIT ?", (seq, limit))
        return [codec.event_from(r) for r in rows]

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
        rows = await self._rows(
            "SELECT DISTINCT node FROM incidents WHERE guarded_at IS NOT NULL AND guarded_at >= ? AND node != ?",
            (codec.ts(since), exclude_node or ""),
        )
        return frozenset(r["node"] for r in rows)

    # ------------------------------------------------------------------ writes
    async def ingest(self, delivery: Delivery, now: datetime) -> IngestOutcome:
        repeats = self.count_repeats([(a.fingerprint, a.starts_at, a.status) for a in delivery.alerts], now)
        if repeats is not None:
            return IngestOutcome(repeated_alerts=repeats)
        result: IngestOutcome = await self._write(IngestJob(delivery, now))
        for key, state in result.cache.items():  # committed: safe to remember
            self._keys[key] = state
            self._keys.move_to_end(key)
        while len(self._keys) > self._keys_max:
            self._keys.popitem(last=False)
        return result

    def count_repeats(self, alerts: Sequence[tuple[str, datetime, str]], now: datetime) -> int | None:
        """If every alert is already stored in the same status, count the delivery and return how many
        alerts it had; else ``None`` and nothing is counted (the caller ingests it in full)."""
        if self._task is None or self._task.done():
            raise StoreUnavailable("store is not open")
        keys = []
        for fingerprint, starts_at, status in alerts:
            key = (fingerprint, starts_at.isoformat(timespec="microseconds"))
            state = self._keys.get(key)
            if state is None or (state[0] == "firing" and status == "resolved"):
                return None
            keys.append(key)
        stamp = codec.ts(now) or ""
        for key in keys:
            old = self._seen.get(key, (stamp, 0))
            self._seen[key] = (max(old[0], stamp), old[1] + 1)
        return len(keys)

    async def record(self, incident_id: str | None, event: NewEvent, now: datetime) -> None:
        await self._write(lambda db: insert_events(db, [(incident_id, event)], now))

    async def save_plan(
        self,
        incident_id: str,
        plan: Mapping[str, Any],
        playbook: str,
        mode: str,
        events: Sequence[NewEvent],
        now: datetime,
    ) -> None:
        async def unit(db: aiosqlite.Connection) -> None:
            await db.execute(
                "UPDATE incidents SET plan_json = ?, playbook = ?, mode = ?, faults_changed = 0, updated_at = ?"
                " WHERE id = ?",
                (codec.dumps(dict(plan)), playbook, mode, codec.ts(now), incident_id),
            )
            await insert_events(db, [(incident_id, e) for e in events], now)

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

        async def unit(db: aiosqlite.Connection) -> None:
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
            cursor = await db.execute(
                f"UPDATE incidents SET {', '.join(sets)} WHERE {where}",  # noqa: S608 - fixed fragments
                [*params, *params_where],
            )
            if event is not None and cursor.rowcount:
                await insert_events(db, [(incident_id, event)], now)

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

        async def unit(db: aiosqlite.Connection) -> None:
            await db.execute(
                "INSERT INTO steps (incident_id, step, status, attempts, started_at) VALUES (?, ?, 'running', ?, ?)"
                " ON CONFLICT (incident_id, step) DO UPDATE SET status = 'running', attempts = excluded.attempts,"
                " started_at = CASE WHEN steps.status = 'superseded' THEN excluded.started_at"
                " ELSE COALESCE(steps.started_at, excluded.started_at) END,"
                " result_json = CASE WHEN steps.status = 'superseded' THEN '{}' ELSE steps.result_json END,"
                " ended_at = NULL",
                (incident_id, step, attempt, stamp),
            )
            if acted:
                await db.execute("UPDATE incidents SET acted = 1 WHERE id = ?", (incident_id,))
            await insert_events(
                db, [(incident_id, NewEvent("step_started", step=step, attempt=attempt))], now
            )

        await self._write(unit)

    async def step_finished(
        self,
        incident_id: str,
        step: str,
        status: str,
        now: datetime,
        *,
        result: Mapping[str, Any] | None = None,
        event: NewEvent,
    ) -> None:
        stamp = codec.ts(now)

        async def unit(db: aiosqlite.Connection) -> None:
            await db.execute(
                "INSERT INTO steps (incident_id, step, status, attempts, started_at, ended_at, result_json)"
                " VALUES (?, ?, ?, 0, NULL, ?, ?) ON CONFLICT (incident_id, step) DO UPDATE SET"
                " status = excluded.status, ended_at = excluded.ended_at, result_json = excluded.result_json",
                (incident_id, step, status, stamp, codec.dumps(dict(result or {}))),
            )
            await insert_events(db, [(incident_id, event)], now)

        await self._write(unit)

    async def step_progress(
        self, incident_id: str, step: str, progress: Mapping[str, Any], now: datetime
    ) -> None:
        async def unit(db: aiosqlite.Connection) -> None:
            async with db.execute(
                "SELECT result_json FROM steps WHERE incident_id = ? AND step = ?", (incident_id, step)
            ) as cursor:
                row = await cursor.fetchone()
            merged = {**(json.loads(row[0]) if row else {}), **progress}
            await db.execute(
                "INSERT INTO steps (incident_id, step, status, attempts, started_at, result_json)"
                " VALUES (?, ?, 'running', 0, ?, ?) ON CONFLICT (incident_id, step) DO UPDATE SET"
                " result_json = excluded.result_json",
                (incident_id, step, codec.ts(now), codec.dumps(merged)),
            )

        await self._write(unit)

    async def request_approval(
        self, incident_id: str, step: str, approvers: Sequence[str], deadline: datetime, now: datetime
    ) -> ApprovalRecord:
        async def unit(db: aiosqlite.Connection) -> None:
            await db.execute(
                "INSERT INTO approvals (incident_id, step, requested_at, deadline, approvers_json, status)"
                " VALUES (?, ?, ?, ?, ?, 'pending') ON CONFLICT (incident_id, step) DO NOTHING",
                (incident_id, step, codec.ts(now), codec.ts(deadline), codec.dumps(list(approvers))),
            )

        await self._write(unit)
        record = await self.approval(incident_id)
        assert record is not None
        return record

    async def decide_approval(
        self, incident_id: str, status: str, actor: str, now: datetime
    ) -> ApprovalRecord | None:
        async def unit(db: aiosqlite.Connection) -> int:
            cursor = await db.execute(
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
