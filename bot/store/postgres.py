"""PostgreSQL implementation of the incident store port: the store of several replicas (HA).

Selected by ``store.url: postgresql://…`` (password from ``store.password_file``); SQLite stays
the embedded default. The schema, every query and every method of the port are SQLite's too
(``bot.store.schema``, ``queries``, ``ingest``, ``outbox``, ``sqlstore``), rendered in Postgres's
dialect by ``bot.store.sql``; this module is only how they run here: a pool, one transaction per
write under the write lock, and the migration bookkeeping.

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
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import psycopg
from psycopg.rows import DictRow, dict_row
from psycopg_pool import AsyncConnectionPool, PoolTimeout

from bot import logger
from bot.domain.alerts import AlertStatus, dedupe_key
from bot.store import codec, queries
from bot.store.base import Delivery, IngestOutcome, StoreUnavailable
from bot.store.ingest import bump_seen, ingest, known_keys
from bot.store.schema import SCHEMA_VERSION, migrations
from bot.store.sql import POSTGRES, Driving, Op, T, one, single
from bot.store.sqlstore import SqlStore

log = logger(__name__)
Conn = psycopg.AsyncConnection[DictRow]

#: Advisory lock keys: every write transaction, and schema migration at start.
_WRITE_LOCK = 0x7069_7463
_MIGRATE_LOCK = 0x7069_746D
_MIGRATIONS = migrations(POSTGRES)
#: How long a pitcrew session may sit inside a transaction with no statement running. pitcrew
#: sends a transaction's statements back to back: only a frozen process waits this long.
IDLE_IN_TRANSACTION_MS = 5000
#: How long ``/readyz`` waits for Postgres before answering "not ready": under the Deployment's
#: readinessProbe ``timeoutSeconds`` (3), so a probe sees a 503, never its own timeout.
PING_TIMEOUT = 2.0


async def _drive(conn: Conn, op: Op[T]) -> Driving[T]:
    """Drive ``op`` over a Postgres connection (``bot.store.sql.run_sync`` is SQLite's)."""
    driving = Driving(op, POSTGRES)
    for sql, params, stmt in driving:
        if stmt.kind == "many":
            if stmt.params:
                async with conn.cursor() as cursor:
                    await cursor.executemany(sql, stmt.params)
            continue
        cursor = await conn.execute(sql, params)
        if stmt.kind == "run":
            driving.answer = cursor.rowcount
        else:
            driving.answer = await (cursor.fetchall() if stmt.kind == "all" else cursor.fetchone())
    return driving


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


class PostgresStore(SqlStore):
    dialect = POSTGRES

    def __init__(
        self,
        url: str,
        *,
        password_file: Path | None = None,
        pool_size: int = 10,
        connect_timeout: float = 10.0,
        clock: Callable[[], datetime] | None = None,
    ) -> None:
        super().__init__(clock)
        self.url = url
        self._password_file = password_file
        self._pool_size = pool_size
        self._connect_timeout = connect_timeout
        #: Shared with every fenced view (``fenced`` copies this object, not the pool).
        self._shared = _Shared()

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
            await conn.execute("CREATE TABLE IF NOT EXISTS pitcrew_schema (version INTEGER NOT NULL)")
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
                    await conn.execute(_MIGRATIONS[number])
                    await conn.execute("UPDATE pitcrew_schema SET version = %s", (number + 1,))
                log.info("store schema migrated", extra={"schema_version": number + 1})

    async def schema_version(self) -> int:
        row = await self._read(single(one("SELECT version FROM pitcrew_schema")))
        return int(row["version"]) if row is not None else 0

    async def ping(self) -> bool:
        """Ready for writes: the database answers within ``PING_TIMEOUT`` and is not read-only (a
        standby of a failover pair). While Postgres is away the pool would wait its whole connect
        timeout, past the readiness probe's own: the probe is answered "not ready" in time instead."""
        try:
            async with asyncio.timeout(PING_TIMEOUT):
                row = await self._read(single(one("SELECT pg_is_in_recovery() AS standby")))
        except Exception:  # readiness probes report, they do not raise
            return False
        return row is not None and not row["standby"]

    # ------------------------------------------------------------------ drivers
    async def _read(self, op: Op[T]) -> T:
        async with self._conn() as conn, conn.transaction():  # one snapshot for a read of several queries
            return (await _drive(conn, op)).result

    async def _transact(self, make: Callable[[], Op[T]]) -> tuple[T, bool]:
        """One transaction under the write lock (see the module's docstring)."""
        async with self._conn() as conn, conn.transaction():
            await conn.execute("SELECT pg_advisory_xact_lock(%s)", (_WRITE_LOCK,))
            driven = await _drive(conn, make())
        return driven.result, driven.wakes

    async def _lease_write(self, make: Callable[[], Op[T]]) -> T:
        """The lease's own writes: no write lock (a renewal never waits on ingest)."""
        async with self._conn() as conn, conn.transaction():
            return (await _drive(conn, make())).result

    async def release_lease(self, holder: str, epoch: int) -> None:
        """End the term now (graceful shutdown), on a connection of its own: at SIGTERM
        ``asyncio.run`` cancels every task, the pool's background workers too, and the release
        must not depend on them."""
        if self._shared.pool is None:
            raise StoreUnavailable("store is not open")
        op = single(queries.release_lease(self.dialect, self._now(), holder, epoch))
        try:
            async with asyncio.timeout(self._connect_timeout):
                conn = await psycopg.AsyncConnection.connect(self.url, **self._shared.kwargs)
                async with conn:
                    await _drive(conn, op)
        except (TimeoutError, psycopg.OperationalError) as exc:
            raise StoreUnavailable(f"{self._where()}: {exc}") from exc

    # ------------------------------------------------------------------ ingest
    async def ingest(self, delivery: Delivery, now: datetime) -> IngestOutcome:
        """One transaction: the delivery worked out and written as SQLite's writer does it."""
        [outcome] = await self._write(lambda: ingest([(delivery, now)], {}), fence=False)
        return outcome

    async def count_repeats(
        self, alerts: Sequence[tuple[str, datetime, AlertStatus]], now: datetime
    ) -> int | None:
        """If every alert is already stored in the same status, count the delivery (one transaction)
        and return how many alerts it had; else ``None`` and nothing is counted."""
        keys = [dedupe_key(fingerprint, starts_at) for fingerprint, starts_at, _ in alerts]
        stamp = codec.ts(now)

        def op() -> Op[int | None]:
            known = yield from known_keys(keys)
            for key, (_, _, status) in zip(keys, alerts, strict=True):
                state = known.get(key)
                if state is None or (state[0] == "firing" and status == "resolved"):
                    return None
            yield bump_seen([(stamp, 1, *key) for key in keys])
            return len(keys)

        return await self._write(op, fence=False)
