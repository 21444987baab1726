"""PostgreSQL implementation of the incident store port: the store of several replicas (HA).

Selected by ``store.url: postgresql://…`` (password from ``store.password_file``); SQLite stays
the embedded default. The schema, every query and every method of the port are SQLite's too
(``bot.store.schema``, ``queries``, ``ingest``, ``outbox``, ``sqlstore``), rendered in Postgres's
dialect by ``bot.store.sql``; this module is only how they run here: a pool; the writes under the
write lock, many to a transaction as SQLite's writer commits them (webhook deliveries, every one
waiting: ``bot.store.group_commit``; the engine's writes, up to ``ENGINE_WRITES``:
``_Writes.write``), on the connections where they commit, one transaction at a time but for the
next, begun while one commits, each a task on the event loop (``_Writes``: deliveries before the
engine's writes, each transaction in as few messages as its answers allow); and the migration
bookkeeping.

The driver is psycopg 3 through its native asyncio API and its pool: it ships type annotations
(``mypy --strict`` checks every call against it), and one libpq underneath speaks every
authentication and TLS option a site's Postgres may ask for through the ordinary
``postgresql://`` URL. A batch of rows (``many``) goes as simple queries (``_batch``,
``_transaction``), never as psycopg's pipelined ``executemany``: see ``_batch`` for why.

Every write transaction but retention's (``_prune_transact``), the lease's and a flush's of
repeat counts (``_count``) takes one advisory lock (``_WRITE_LOCK``) first, waiting for it as
long as pitcrew allows (``WRITE_LOCK_WAIT_MS``), not as long as a site's ``statement_timeout``,
``lock_timeout`` or (PostgreSQL 17 and later) ``transaction_timeout`` would, so writes of every replica are serialised as SQLite's ``BEGIN
IMMEDIATE`` serialises processes on one file: an incident number (``MAX(seq) + 1``) is never
taken twice, two deliveries never race for one node's incident, and events are numbered in
commit order, so a reader of ``events_since`` never skips an event that commits late with a
lower number. pitcrew writes a few transactions per alert, and deliveries take it once a batch;
a batch of repeat deliveries only counts, under the lock's shared mode, and the counts of repeats
answered from memory (``count_repeats``) commit beside every other write. A fenced write also
locks the leadership row ``FOR SHARE`` in its transaction: a takeover's UPDATE waits until it
commits, and after a takeover the check finds another epoch and raises ``Deposed`` with nothing
written. The lease's own writes take no advisory lock (a renewal never waits behind a long
ingest); their times are the database's ``now()``, whatever the replicas' clocks say.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import contextvars
import json
import math
import time
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any, NoReturn

import psycopg
from psycopg.rows import DictRow, dict_row
from psycopg_pool import AsyncConnectionPool, PoolTimeout

from bot import logger
from bot.domain.alerts import AlertStatus, dedupe_key
from bot.store import queries, retention
from bot.store.base import (
    AlertRecord,
    Delivery,
    IncidentRecord,
    IngestOutcome,
    Inspection,
    ReplicationMode,
    StoreRefused,
    StoreUnavailable,
)
from bot.store.batch import ENGINE_WRITES, Answer, each_alone, settle
from bot.store.expect import Expectations
from bot.store.group_commit import GroupCommit, Result
from bot.store.ingest import Seen, bump_seen
from bot.store.repeats import RepeatMemory
from bot.store.schema import (
    SCHEMA_VERSION,
    TABLES,
    NewerSchema,
    compatible_from,
    foresee,
    migrations,
    opening,
)
from bot.store.sql import POSTGRES, REFUSED, Driving, Later, Op, Stmt, T, one, refused, single, together
from bot.store.sqlstore import SqlStore

log = logger(__name__)
Conn = psycopg.AsyncConnection[DictRow]

#: Advisory lock keys: every write transaction (and a migration, while it migrates), and schema
#: migration at start.
_WRITE_LOCK = 0x7069_7463
_MIGRATE_LOCK = 0x7069_746D
_MIGRATIONS = migrations(POSTGRES)
#: The migration at start, whatever the database's or the role's ``statement_timeout`` and
#: ``lock_timeout`` (a common guard on an application's role): a migration cut short by them, or a
#: replica's wait for another replica's migration, failed the start, and every replica's next start
#: the same way, a crash loop after an upgrade. What bounds a start is the Deployment's
#: ``startupProbe`` (a minute: ``/healthz`` is served once the store is open); a replica frozen
#: while migrating lets the lock go after the idle limit (``IDLE_IN_TRANSACTION_MS``).
_UNBOUNDED = "SET LOCAL statement_timeout = 0; SET LOCAL lock_timeout = 0"
#: PostgreSQL 17's ``transaction_timeout`` ends the whole session (FATAL) once a transaction has run
#: that long, a wait for a lock included: a site's value under pitcrew's wait for the write lock
#: dropped a replica's connection whenever the other held the lock, and every write on it failed.
#: Set to 0 in the transaction, its timer stops (its assign hook disables it inside a
#: transaction); back to ``DEFAULT`` it starts again from then. Servers before 17 refuse the
#: name, so it is sent only to 17 and later (``_newer``).
_NO_TRANSACTION_TIMEOUT = "SET LOCAL transaction_timeout = 0"
_TRANSACTION_TIMEOUT_FROM = 170000
#: How long a pitcrew session may sit inside a transaction with no statement running. pitcrew
#: sends a transaction's statements back to back: only a frozen process waits this long.
IDLE_IN_TRANSACTION_MS = 5000
#: How long a write waits for the write lock (ms), whatever the database's or the role's
#: ``statement_timeout`` and ``lock_timeout``: the wait is for another replica's transaction (a
#: storm's group of thousands of alerts holds the lock for a second and more), not a runaway
#: query, and under a site's limit of a few hundred ms one replica's every write failed while the
#: other stored a storm (``tests/integration/test_store_site_limits.py``). Under Alertmanager's
#: shortest deadline for a delivery (10 s, its ``notify.MinTimeout``), so a delivery is answered
#: (503, redelivered) before Alertmanager gives up on it; longer than the idle limit
#: (``IDLE_IN_TRANSACTION_MS``), so the lock of a replica frozen in its transaction is let go before
#: a write waiting for it gives up. Once the lock is held, the site's limits bound the rest again.
WRITE_LOCK_WAIT_MS = 8000
#: The first statements of every transaction pitcrew opens (``_TRANSACTION_SETTINGS``), the
#: transaction's own settings, not the session's:
#:
#: * READ COMMITTED, whatever the database's or the role's ``default_transaction_isolation``: the
#:   write lock relies on it. A transaction that waited for the lock must see what the one before
#:   it committed, and at REPEATABLE READ or SERIALIZABLE its snapshot was taken before the wait
#:   (at the lock's own statement): it would miss the alert the other stored and fail on it, or
#:   be cancelled as a serialization failure (``test_a_database_whose_transactions_default_to...``).
#: * The idle limit: how long it may wait between two statements.
#:
#: Settings for the session (the ``options`` startup parameter) do not pass a connection pooler:
#: PgBouncer refuses the connection ("unsupported startup parameter: options"; from 1.20 it takes
#: only the ``-c`` settings it tracks), and with ``options`` in its ``ignore_startup_parameters`` it
#: drops them silently — and in its transaction mode a session's settings would reach other
#: clients anyway.
_TRANSACTION_SETTINGS = (
    "SET TRANSACTION ISOLATION LEVEL READ COMMITTED;"
    f" SET LOCAL idle_in_transaction_session_timeout = {IDLE_IN_TRANSACTION_MS}"
)
#: How long ``/readyz`` waits for Postgres before answering "not ready": under the Deployment's
#: readinessProbe ``timeoutSeconds`` (3), so a probe sees a 503, never its own timeout.
PING_TIMEOUT = 2.0
#: Repeat deliveries are answered from memory (``bot.store.repeats``) only while the database has
#: committed a write of this replica within this many seconds; else they wait for the database,
#: so a replica cut off from it answers 503 within a second.
FRESH = 1.0
#: How often the counts of repeats answered from memory are committed: well within ``FRESH``, so a
#: replica taking only repeats (a standby, a steady state) stays fresh by these commits alone.
FLUSH_EVERY = FRESH / 3
#: Counters committed by one transaction of a flush (``PostgresStore._count``): a flush of a busy
#: second's repeats is 1,500 counters under ``bench/ingest.py``, and a delivery that counts one of
#: them waits for the chunk that holds it to commit, not for the whole flush.
FLUSH_ROWS = 250
#: libpq's TCP settings, each unless the URL sets it. When the node under Postgres dies, or a link
#: on the way goes down, nothing comes back (no reset, no close): a connection waiting for an
#: answer waited until the kernel gave up retransmitting (``tcp_retries2``: about 15 minutes),
#: and every write of the replica, webhooks included, waited behind it. Now a message the peer
#: does not acknowledge within ``tcp_user_timeout`` (ms), or an unused connection whose peer does
#: not answer keepalives, fails, and the next write connects again (to a failover's new primary).
#: A long statement or a lock wait is not cut short: the server's kernel acknowledges meanwhile.
TCP = {
    "keepalives": "1",
    "keepalives_idle": "10",
    "keepalives_interval": "5",
    "keepalives_count": "3",
    "tcp_user_timeout": "10000",
}
#: The server ended this one session, not every one: a site's ``transaction_timeout``
#: (PostgreSQL 17's), or the idle limit of a transaction. Errors of class 25, not
#: ``OperationalError``: they escaped as they were (a webhook answered 500).
_SESSION_ENDED = (psycopg.errors.TransactionTimeout, psycopg.errors.IdleInTransactionSessionTimeout)
#: What makes the store unavailable (a 503 to a webhook, a write to try again later), and the
#: connection it came on given up: the database is gone, or takes no writes (a standby, or a
#: primary demoted by a failover, answers "read-only transaction": connecting again reaches the
#: new primary through the Service, or the URL's hosts with ``target_session_attrs=read-write``),
#: or it ended the session (``_SESSION_ENDED``).
_UNAVAILABLE = (psycopg.OperationalError, psycopg.errors.ReadOnlySqlTransaction, *_SESSION_ENDED)
#: A connection left unused this long (seconds) is checked, one empty query, before it is used: the
#: server's ``idle_session_timeout``, a pooler's idle limit, a failover or a load balancer's idle
#: timer may have ended it meanwhile, and the first statement on it would fail (a webhook answered
#: 503, an engine read or write to retry) after every quiet spell. Busy connections are never
#: checked; a quiet store pays a round trip now and then. A server whose ``idle_session_timeout``
#: is shorter has its connections checked after half of it (read at open: ``_Idle.heed``).
CHECK_AFTER = 1.0
#: Connections taken from the pool, each found ended, before a read gives up (``_live``).
_LIVE_ATTEMPTS = 3
#: The server's own idle limit for pitcrew's sessions, in ms (0: none; no row before PostgreSQL 14).
_IDLE_SESSION_LIMIT = "SELECT setting FROM pg_settings WHERE name = 'idle_session_timeout'"


#: Whether the server takes this role's writes: not a standby, nor read-only for it.
_WRITABLE = "pg_is_in_recovery() AS standby, current_setting('transaction_read_only') = 'on' AS read_only"
#: The readiness probe's one query: a primary (not in recovery) that takes this role's writes (a
#: database or role may make its transactions read-only: ``default_transaction_read_only``), and
#: how its commits are replicated.
#: ``pg_stat_replication`` shows every user its rows (the details only to the privileged): each is
#: a standby streaming from this server (or a base backup being taken).
_PING = (
    f"SELECT {_WRITABLE},"  # noqa: S608 - constants only
    " current_setting('synchronous_commit') AS commit,"
    " current_setting('synchronous_standby_names') AS names,"
    " (SELECT count(*) FROM pg_stat_replication) AS standbys"
)
#: What ``inspect`` reads of the server, besides ``_PING``: its version, where pitcrew's tables go
#: (the first schema on the search_path) and whether this role may create them there, and which of
#: pitcrew's bookkeeping tables are there already.
_INSPECT = (
    "SELECT current_setting('server_version_num')::int AS version_num,"
    " current_setting('server_version') AS version, current_schema() AS schema,"
    " current_setting('server_encoding') AS encoding,"
    " coalesce(has_schema_privilege(current_schema(), 'CREATE'), false) AS may_create,"
    " to_regclass('pitcrew_schema') IS NOT NULL AS has_schema,"
    " coalesce(has_table_privilege(to_regclass('pitcrew_schema'), 'SELECT'), false) AS schema_readable,"
    " coalesce(has_table_privilege(to_regclass('leadership'), 'SELECT'), false) AS leadership_readable"
)
#: The database's encoding: pitcrew stores any Unicode text (alert labels and annotations, what
#: the far sides answer, people's names), which only UTF8 holds. A database takes the encoding of
#: its template, or of the locale ``initdb`` ran in: ``SQL_ASCII`` in a C or POSIX locale (a
#: container without ``LANG``), where text comes back as bytes and the first read of the incidents
#: failed; ``LATIN1`` on old installs, where the first event with a character outside Latin-1 did.
#: Read first at open, with whether the server takes writes: a store whose tables are current
#: writes nothing at open, and would open on a standby (or for a read-only role) to fail its first
#: write.
_AT_OPEN = f"SELECT current_setting('server_encoding') AS encoding, {_WRITABLE}"
_WHO_LEADS = "SELECT holder, epoch, expires_at > now() AS live FROM leadership WHERE id = 1"
#: What this role may not do that the store does, on those of its tables that are there: every
#: statement on each, but no update of the timeline (``events``): read, added to, and deleted from
#: by retention, of what alerts said only (the database's guard keeps the audit log, migration 7);
#: and running the function its writes' checks call, if it is there.
_NOT_ALLOWED = (
    "SELECT c.relname AS name, p.privilege FROM pg_class c,"
    " unnest(ARRAY['SELECT', 'INSERT', 'UPDATE', 'DELETE']) AS p(privilege)"
    " WHERE c.relnamespace = current_schema()::regnamespace AND c.relkind IN ('r', 'p')"
    " AND c.relname = ANY(%s) AND NOT (c.relname = 'events' AND p.privilege = 'UPDATE')"
    " AND NOT has_table_privilege(c.oid, p.privilege)"
    # A write's check calls pitcrew_check (migration 8): PUBLIC may run a new function, unless the
    # site's default privileges say otherwise.
    " UNION ALL SELECT f.proname, 'EXECUTE' FROM pg_proc f"
    " WHERE f.pronamespace = current_schema()::regnamespace AND f.proname = 'pitcrew_check'"
    " AND NOT has_function_privilege(f.oid, 'EXECUTE') ORDER BY name, privilege"
)
#: The oldest server the store runs on (``server_version_num``): 12.
MIN_SERVER_VERSION = 120000
#: ``synchronous_commit`` values that wait for a synchronous standby (when one is named).
_WAITS_FOR_STANDBY = frozenset({"on", "remote_write", "remote_apply"})


@dataclass(frozen=True, slots=True)
class Replication:
    """How the server's commits reach its standbys, as ``pitcrew``'s own sessions see it.

    ``mode``: ``none`` (no standby streams from it: the commit is on this server's storage alone,
    which a managed service may replicate below Postgres); ``synchronous`` (a commit returns once a
    standby named in ``synchronous_standby_names`` has it: a failover to that standby loses
    nothing acknowledged); ``asynchronous`` (standbys stream, but a commit returns before any has
    it: a failover may lose the last acknowledged deliveries and recorded steps, so an incident may
    be forgotten or a destructive step done again)."""

    mode: ReplicationMode
    standbys: int
    commit: str

    @classmethod
    def of(cls, commit: str, names: str, standbys: int) -> Replication:
        if standbys == 0:
            return cls("none", 0, commit)
        waits = bool(names.strip()) and commit in _WAITS_FOR_STANDBY
        return cls("synchronous" if waits else "asynchronous", standbys, commit)

    def said(self) -> str:
        """For people (``check-config --live``): how the server keeps what pitcrew acknowledged."""
        if self.mode == "none":
            said = "no standby streams from it"
        elif self.mode == "synchronous":
            said = f"{self.standbys} standby(s), commits wait for a synchronous one"
        else:
            said = (
                f"{self.standbys} standby(s), asynchronous: a failover may lose what pitcrew acknowledged"
                " (make one synchronous: synchronous_standby_names;"
                " CloudNativePG: .spec.postgresql.synchronous)"
            )
        if self.commit == "off":
            said += (
                "; synchronous_commit off: a commit returns before it is on disk, and a crash of the"
                " server may lose the last writes pitcrew acknowledged"
            )
        return said


def _replication(row: DictRow) -> Replication:
    """What ``_PING`` read of the replication."""
    return Replication.of(str(row["commit"]), str(row["names"]), int(row["standbys"]))


class WrongEncoding(StoreRefused):
    """The database is not in UTF8 (``_AT_OPEN``): it cannot hold what pitcrew stores."""


def _wrong_encoding(where: str, encoding: str) -> str:
    return (
        f"{where} is in encoding {encoding}, and pitcrew stores any Unicode text (alert labels, what "
        "Slurm, Kubernetes and Slack answer, people's names): give it a database in UTF8 "
        "(CREATE DATABASE ... ENCODING 'UTF8' TEMPLATE template0)"
    )


class NotPermitted(StoreRefused):
    """The database refuses this role what opening the store does (``_NOT_PERMITTED``)."""


#: What the database answers a role that may not create pitcrew's tables where they go, or use
#: them once there: the set-up most likely to go wrong (PostgreSQL 15 lets only the database's
#: owner create in ``public``). Trying again will not help; the start stopped with a traceback.
_NOT_PERMITTED = (psycopg.errors.InsufficientPrivilege, psycopg.errors.InvalidSchemaName)


def _not_permitted(where: str, exc: Exception) -> str:
    said = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    return (
        f"{where}: {said}: pitcrew creates and migrates its tables at start, then uses them; make "
        "its role the database's owner, or GRANT CREATE ON SCHEMA and the tables' privileges to it "
        "(pitcrew check-config --live names each one it lacks)"
    )


class _ServerLost(StoreUnavailable):
    """The store is unavailable because its server is: gone from under a connection (a restart, a
    failover, its node lost), or taking no writes (a standby, a demoted primary)."""


def _is_lost(conn: psycopg.BaseConnection[Any], exc: Exception) -> bool:
    """Whether ``exc`` on ``conn`` means the server is lost to every connection, not only this one
    statement's failure (a cancelled query, a lock timeout: also ``OperationalError``) or the end
    of this one session (``_SESSION_ENDED``)."""
    if isinstance(exc, _SESSION_ENDED):
        return False
    return conn.broken or isinstance(exc, psycopg.errors.ReadOnlySqlTransaction)


class _Idle:
    """When each connection was last used (``used``, as it goes back to the pool; a new one, from
    the pool's ``configure`` callback ``made``, as never), and whether one has been unused for ``after``
    (``stale``: checked before use, by ``PostgresStore._live`` and by the writes (``_Writes``) for
    their own connection)."""

    def __init__(self, after: float = CHECK_AFTER) -> None:
        self._since: weakref.WeakKeyDictionary[object, float] = weakref.WeakKeyDictionary()
        #: Unused this long (seconds), a connection is checked before use.
        self.after = after

    def heed(self, limit_ms: int) -> None:
        """The server ends a session idle for ``limit_ms`` (its ``idle_session_timeout``; 0:
        never): a connection is checked after half of that when it is shorter than ``CHECK_AFTER``,
        or one made or used between the two would fail its next use."""
        if limit_ms > 0:
            self.after = min(CHECK_AFTER, limit_ms / 2000)

    def used(self, conn: object) -> None:
        self._since[conn] = time.monotonic()

    def stale(self, conn: object) -> bool:
        return time.monotonic() - self._since.get(conn, math.inf) >= self.after

    async def made(self, conn: Conn) -> None:
        """A new connection is checked at its first use, as a stale one is: the server may have ended
        it between its making and this callback, which the pool runs only when the event loop comes
        round (a restart or a failover ending every session while the loop was busy). Stamped as
        used now, it was taken unchecked within ``after`` and failed that use (a contract case,
        once in CI). One empty query per new connection."""
        self._since[conn] = -math.inf


#: Statements of one batch per message: a batch of more rows is several messages, each answered.
BATCH_STATEMENTS = 500


def _batch(
    mogrifier: psycopg.ClientCursor[Any] | psycopg.AsyncClientCursor[Any],
    sql: str,
    rows: Sequence[Sequence[Any]],
) -> Iterator[str]:
    """``sql`` once per row of ``rows``, as messages of up to ``BATCH_STATEMENTS`` statements
    (the values quoted by psycopg's own client-side binding), each sent as one simple query.

    Not psycopg's ``executemany``: that pipelines the rows, one Bind/Execute at a time, and sends
    the Sync only after the last. A process frozen before its Sync (SIGSTOP, a paused VM, a stall
    while the statement waited for a lock) leaves its session waiting for the next message
    *without* the idle-in-transaction limit, which the server arms only when it answers a Sync:
    the session held the write lock and the lease row ``FOR SHARE`` for as long as the process
    stayed frozen, and no standby could take over (``tests/integration/test_store_frozen.py``
    shows it on the old driver). A simple query is
    answered as a whole, so the limit holds between any two messages of a transaction."""
    for start in range(0, len(rows), BATCH_STATEMENTS):
        yield ";\n".join(mogrifier.mogrify(sql, row) for row in rows[start : start + BATCH_STATEMENTS])


def _bulk(mogrifier: psycopg.ClientCursor[Any] | psycopg.AsyncClientCursor[Any], stmt: Stmt) -> str:
    """A ``many`` statement's rows as its ``bulk`` statement, the rows one JSON array parameter,
    bound as ``_batch`` binds rows. JSON, not an array parameter a column: psycopg quotes an
    array's every element in Python, 3-4 ms on the event loop for a flush's chunk of 250 counters
    under ``bench/ingest.py``'s saturated stream, where the JSON text is made in C and quoted as
    one string."""
    assert stmt.bulk is not None
    return mogrifier.mogrify(POSTGRES.render(stmt.bulk), (json.dumps(stmt.params, separators=(",", ":")),))


async def _drive(conn: Conn, op: Op[T]) -> Driving[T]:
    """Drive ``op`` over a Postgres connection (``bot.store.sql.run_sync`` is SQLite's). A ``later``
    statement (``bot.store.sql.reads``) goes in one message with the statement after it, each
    bound by psycopg's client-side quoting as ``_transaction`` binds them: one round trip, where
    each was one; its answer is held until that message is answered."""
    driving = Driving(op, POSTGRES)
    laters: list[tuple[str, Stmt, Later]] = []
    for sql, params, stmt in driving:
        if stmt.later:
            held = Later()
            laters.append((psycopg.AsyncClientCursor(conn).mogrify(sql, params), stmt, held))
            driving.answer = held
            continue
        if laters:
            assert stmt.kind in ("one", "all", "run"), "a statement that answers closes the message"
            text = psycopg.AsyncClientCursor(conn).mogrify(sql, params)
            cursor = await conn.execute(";\n".join([*(t for t, _, _ in laters), text]))
            for place, (_, earlier, held) in enumerate(laters):
                await cursor.set_result(place)
                held.hold(await _answer(cursor, earlier))
            laters = []
            await cursor.set_result(-1)
            driving.answer = await _answer(cursor, stmt)
            continue
        if stmt.kind == "many":
            if stmt.bulk is not None:
                if stmt.params:
                    await conn.execute(_bulk(psycopg.AsyncClientCursor(conn), stmt))
                continue
            for batch in _batch(psycopg.AsyncClientCursor(conn), sql, stmt.params):
                await conn.execute(batch)
            continue
        cursor = await conn.execute(sql, params)
        if stmt.kind == "check":
            refused(stmt, await cursor.fetchone() is not None)
        else:
            driving.answer = await _answer(cursor, stmt)
    assert not laters, "a later statement is followed by one that answers"
    return driving


async def _answer(cursor: psycopg.AsyncCursor[DictRow], stmt: Stmt) -> Any:
    """What ``stmt`` is answered with (``bot.store.sql.Stmt``), read at the cursor's result."""
    if stmt.kind == "run":
        return cursor.rowcount
    return await (cursor.fetchall() if stmt.kind == "all" else cursor.fetchone())


async def _transaction(conn: Conn, op: Op[T], lock: str | None) -> Driving[T]:
    """``op`` in one transaction under ``lock`` (``None``: none, retention's and a flush's), on the
    writes' connection (``_Writes``) or a flush's of the pool (``PostgresStore._count``), in as few
    messages as its answers allow: ``BEGIN``, the transaction's settings
    (``_TRANSACTION_SETTINGS``: READ COMMITTED, the idle limit) and the lock go with the first
    statement, the rows of batches (``many``, ``put``: nothing to answer) and the conditions
    (``check``: a fenced write's lease check, which fails in the server if it finds no row:
    ``_Message``) with the statement after them, up to ``BATCH_STATEMENTS`` rows a message, and
    ``COMMIT`` with the last: the operation's last statement read (``last``, a ``single`` write) or
    its last rows. A transaction of one message has neither ``BEGIN`` nor ``COMMIT``: it is the
    server's implicit transaction, rolled back in the server at its first error
    (``_Message.send``). Each message is one simple query, its values bound by psycopg's
    client-side quoting as ``_batch`` binds rows; the answer read is its last statement's, or the
    one before ``COMMIT``. A statement that fails ends its message there, the rest unsent, and the
    transaction is rolled back.

    Why: every message is a round trip, and its answer is read when the event loop comes round
    again. A batch of deliveries was eight to ten messages (``BEGIN``, the lock, the lookups, a
    message a table, ``COMMIT``), each waiting for a loop busy with webhooks, and the write lock
    was held all that time; a fenced engine write was three (the lease check, its statement,
    ``COMMIT``) and is one.

    A process frozen after sending a message (SIGSTOP, a paused VM) holds nothing for long either
    way: a message that ends the transaction (its ``COMMIT``, or the whole of a transaction of one
    message) is run whole by the server, which commits and lets the write lock go (the delivery is
    acknowledged when the process wakes, or redelivered and deduplicated); any other leaves the
    session idle in its transaction, which the server ends after ``IDLE_IN_TRANSACTION_MS``
    (``tests/integration/test_store_frozen.py`` shows both)."""
    driving = Driving(op, POSTGRES)
    mogrifier = psycopg.AsyncClientCursor(conn)
    message = _Message(_TRANSACTION_SETTINGS)
    if lock is not None:
        message.add(_locking(lock, _newer(conn)))
    committed = False
    try:
        for sql, params, stmt in driving:
            if stmt.kind == "many" and stmt.bulk is not None:
                if stmt.params:
                    message.add(_bulk(mogrifier, stmt))
                continue
            if stmt.kind == "many":
                for row in stmt.params:
                    if message.rows == BATCH_STATEMENTS:
                        await message.send(conn)
                    message.add(mogrifier.mogrify(sql, row), row=True)
                continue
            if stmt.kind == "check":
                message.check(mogrifier.mogrify(sql, params), stmt)
                continue
            if stmt.later:
                driving.answer = message.later(mogrifier.mogrify(sql, params), stmt)
                continue
            message.add(mogrifier.mogrify(sql, params))
            committed = stmt.last
            cursor = await message.send(conn, commit=committed)
            driving.answer = await _answer(cursor, stmt)
        if not committed:
            await message.send(conn, commit=True)
    except BaseException:
        if not conn.closed and conn.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
            with contextlib.suppress(psycopg.Error):
                await conn.execute("ROLLBACK")
        raise
    return driving


#: How long the writes run one transaction at a time once their second connection could not be
#: made (a role's or database's connection limit, a pooler's): seconds, then it is tried again.
ALONE_FOR = 60.0


#: Set by the writes (``_Writes._begin``) for each work they run: what a transaction calls when it
#: sends its ``COMMIT`` (``_Message.send``), and the connection the work runs on.
_COMMITTING: contextvars.ContextVar[Callable[[], None] | None] = contextvars.ContextVar(
    "pitcrew_committing", default=None
)
_SLOT: contextvars.ContextVar[int] = contextvars.ContextVar("pitcrew_slot", default=0)


class _Message:
    """What a transaction has not sent yet, sent as one simple query (``send``): the statements
    (``parts``), how many rows of batches they hold, its ``check`` statements, numbered, and
    whether it is the transaction's first (``opening``)."""

    def __init__(self, first: str) -> None:
        self.parts = [first]
        self.rows = 0
        self.checks: list[Stmt] = []
        #: Its ``later`` statements: each one's answer, what it reads, and its place in ``parts``.
        self.laters: list[tuple[Later, Stmt, int]] = []
        self.opening = True

    def add(self, text: str, *, row: bool = False) -> None:
        self.parts.append(text)
        self.rows += row

    def check(self, text: str, stmt: Stmt) -> None:
        """A ``check`` (``text``, its values bound) as a statement that fails if it finds no row,
        with ``REFUSED`` and its number: nothing after it in its message runs, and the transaction
        can never commit, so ``COMMIT`` may go in the same message and its answer is never read.
        A call of the schema's ``pitcrew_check`` (migration 8, PL/pgSQL), planned as any statement.
        It was an anonymous block (``DO``), so no function was needed in the schema; but PL/pgSQL
        compiles a block at each run, and it ran under the write lock: in the server 0.64 ms at the
        median for a batch's expectation (0.14 ms of it the query), measured with
        ``pg_stat_statements`` under ``bench/ingest.py``'s saturated stream; the call is the
        query's time and its plan's (0.13 and 0.25 ms). Two pairs of runs of that stream (20,000
        deliveries, one replica), alternated: stored deliveries' median 7.3 and 7.2 ms against 8.4
        and 8.2, the stream's p99 9.8 and 9.5 against 10.7 and 10.9."""
        number = len(self.checks)
        self.checks.append(stmt)
        self.add(f"SELECT pitcrew_check(EXISTS ({text}), {number})")

    def later(self, text: str, stmt: Stmt) -> Later:
        """A ``later`` statement (``text``, its values bound), read when the message is answered
        (``send``): its answer, ready then."""
        held = Later()
        self.laters.append((held, stmt, len(self.parts)))
        self.add(text)
        return held

    async def send(self, conn: Conn, *, commit: bool = False) -> psycopg.AsyncCursor[DictRow]:
        """Send the message, ``commit``: as the transaction's last; the cursor at its last
        statement's answer (``COMMIT``'s is never read). A ``check`` that found no row raises what
        it refuses with.

        A transaction of one message (the first, and the last) has no ``BEGIN`` and no ``COMMIT``:
        it is the server's implicit transaction of a simple query of several statements, committed
        at its end, or rolled back at once at its first error, a ``check`` that refuses or a
        statement that fails. With ``BEGIN``, such a transaction stayed open after the error,
        holding the write lock, until the event loop came round to read the error and send
        ``ROLLBACK``: a batch whose expectation did not hold (``bot.store.expect``), or a deposed
        leader's write, held every replica's writes back for that long. Any other first message
        begins the transaction (``BEGIN``), and the last commits it. The transaction's settings
        and the lock are the same statements either way: ``SET LOCAL`` and
        ``pg_advisory_xact_lock`` hold until the implicit transaction ends, as in a block."""
        checks, self.checks = self.checks, []
        laters, self.laters = self.laters, []
        parts, count = self.parts, len(self.parts)
        if self.opening and not commit:
            parts = ["BEGIN", *parts]
        elif commit and not self.opening:
            parts = [*parts, "COMMIT"]
        committing = _COMMITTING.get() if commit else None
        if committing is not None:  # the next write may begin (``_Writes._kick``)
            committing()
        try:
            cursor = await conn.execute(";\n".join(parts))
        except psycopg.Error as exc:
            said = exc.diag.message_primary or ""
            if exc.diag.sqlstate != REFUSED or not said.startswith("pitcrew check "):
                raise
            refused(checks[int(said.removeprefix("pitcrew check "))], False)
            raise  # not reached: refused raises
        finally:
            self.parts, self.rows, self.opening = [], 0, False
        closing = parts[-1] == "COMMIT" and len(parts) > 1  # its answer is never read
        # The parts after a later statement are one statement each: its answer counted from the end.
        for held, stmt, place in laters:
            await cursor.set_result(place - count - closing)
            held.hold(await _answer(cursor, stmt))
        return await cursor.set_result(-2 if closing else -1)


def _newer(conn: psycopg.BaseConnection[Any]) -> bool:
    """Whether ``conn``'s server has ``transaction_timeout`` (PostgreSQL 17 and later)."""
    return conn.info.server_version >= _TRANSACTION_TIMEOUT_FROM


def _locking(lock: str, newer: bool) -> str:
    """The statements that take the write lock (``lock``: its function, exclusive or shared),
    waiting for it as long as pitcrew allows (``WRITE_LOCK_WAIT_MS``) whatever the site's limits
    (``transaction_timeout`` too on a server that has it, ``newer``), and then give the
    transaction the site's limits back (``DEFAULT``: the role's or database's setting, or the
    server's; the transaction's timer starts again from there)."""
    stop, restart = (
        (f" {_NO_TRANSACTION_TIMEOUT};", " SET LOCAL transaction_timeout = DEFAULT;") if newer else ("", "")
    )
    return (
        f"SET LOCAL statement_timeout = 0; SET LOCAL lock_timeout = {int(WRITE_LOCK_WAIT_MS)};{stop}"
        f" SELECT {lock}({_WRITE_LOCK});{restart}"
        " SET LOCAL statement_timeout = DEFAULT; SET LOCAL lock_timeout = DEFAULT"
    )


class _Writes:
    """The connections every write under the write lock commits on (webhook deliveries, a batch at
    a time, and the engine's writes), one transaction at a time on each, each in a task of its own
    on the event loop, begun as soon as it may (``_kick``), as SQLite's writer runs its
    transactions one after the other in its thread. A transaction
    is a few messages (``_transaction``: a batch of deliveries two, or one when it expects what its
    lookup would answer, ``bot.store.expect``), so it waits for the loop once a
    message, and nothing else waits for it: its callers hand it over and hear back once. A
    connection is made on first use and again after the database dropped it.

    On the loop, not in a thread: a thread's every round trip gave up the interpreter and then
    waited for a loop busy with webhooks to give it back, up to the interpreter's switch interval
    (5 ms) each time, twice a message, with the write lock held, and every writer of every replica
    waited for it. Measured under ``bench/ingest.py``'s saturated stream on one replica: a
    ``SELECT 1`` round trip from a thread took 10.5 ms beside a busy main thread (0.09 alone), and
    a transaction's first message, 0.09 ms on the server, took 1 ms at the median in the thread
    and 5 ms at p90. Nor with the switch interval cut to 0.5 ms (the same messages on a blocking
    connection in a thread), measured on a machine of two CPUs: the stored deliveries' median
    44.4 ms against 45.4 on the loop over three rounds (saturated p99 59.8 against 64.8), and
    worse in two of three single rounds after; PostgreSQL's own log put most of a transaction's
    time in the server there.

    Webhook deliveries go first (``put``, ``_Lanes``): the next batch of deliveries is taken
    before the engine's writes queued earlier, so an acknowledgement waits for at most the
    transaction under way (and one committing, below), not for every write an incident's flow
    queued. The engine is not starved: no more than ``DELIVERIES_IN_A_ROW`` (two) batches of
    deliveries run in a row while an engine write waits, so one waits for at most two batches.
    The engine's writes waiting when their turn comes go in one transaction (``write``, up to
    ``ENGINE_WRITES``), as the deliveries do.

    Once the transaction under way has sent its ``COMMIT``, the next write (waiting, or the
    first to come before that commit is answered) begins at once on a second connection
    (``_kick``): its first message waits in the server for the write lock, which that commit
    lets go, instead of being sent only after the loop has come round to read the commit's
    answer. Never more than two transactions at once, the older one only waiting for its commit,
    and the write lock still runs them one after the other; two that overlap were both
    unanswered, so either order is one their callers could have seen. So an acknowledgement
    waits for at most the transaction under way and one committing. Where the second
    connection cannot be made (a role's, a database's or a pooler's connection limit sized for
    one), that write runs on the first after the one committing, and nothing overlaps for
    ``ALONE_FOR`` (``_second``): a site's limit costs the overlap, never a write. Measured under
    ``bench/ingest.py``'s warm-up and first saturated stream on one replica, eight pairs
    alternated with one at a time: p99 12.3 ms against 14.0 (the medians), lower in six pairs;
    the run's noise is as large (11 to 16 ms for the same code)."""

    def __init__(
        self,
        url: str,
        kwargs: Callable[[], dict[str, Any]],
        where: str,
        *,
        locked: bool = True,
        lost: Callable[[], Awaitable[None]] | None = None,
        check_after: float = CHECK_AFTER,
    ) -> None:
        """``kwargs``: how a connection is made, asked at each (``PostgresStore._connecting``).
        ``locked``: every transaction under the write lock (or its shared mode); else none
        (retention's, ``PostgresStore._prune_transact``). ``lost``: awaited when a write found the
        server gone or taking no writes, before the write's caller hears of it: the pool's
        connections went with it (``PostgresStore._server_lost``). ``check_after``: the pool's
        (``_Idle.after``). Made on the event loop, whose task drives the transactions."""
        self._url, self._kwargs, self._where, self._locked = url, kwargs, where, locked
        self._lost = lost
        self._lanes = _Lanes()
        self._name = "pitcrew-store-write" if locked else "pitcrew-store-prune"
        #: The transactions begun and not ended (``_begin``), at most two: one under way, and one
        #: that has sent its ``COMMIT`` (``_kick``).
        self._running: set[_Turn] = set()
        #: The one of them that has not sent its ``COMMIT`` yet, if any.
        self._under_way: _Turn | None = None
        #: Set once closed, every work put has run and every transaction has ended (``close``).
        self._drained = asyncio.Event()
        self._closing: asyncio.Task[None] | None = None
        #: One connection a transaction at once: two under the write lock, one for retention.
        self._conns: list[Conn | None] = [None, None] if locked else [None]
        #: Held by the transaction on each connection (``_run``).
        self._busy = [asyncio.Lock() for _ in self._conns]
        #: Until when (monotonic) nothing overlaps: the second connection could not be made.
        self._alone_until = -math.inf
        self._idle = _Idle(check_after)
        self._closed = False
        #: The engine's writes waiting for their group's transaction (``write``), and whether a
        #: turn for them is put.
        self._engine: collections.deque[_EngineWrite] = collections.deque()
        self._engine_put = False
        #: Groups that failed, being answered (``_answer_failed``).
        self._failing: set[asyncio.Task[None]] = set()
        #: When a write of this replica last committed (monotonic: ``heard``); -inf after one failed.
        self.committed_at = float("-inf")

    async def drive(
        self,
        op: Op[T],
        *,
        exclusive: bool = True,
        first: bool = False,
    ) -> Driving[T]:
        """``op`` in one transaction under the write lock, or its shared mode (a batch of repeat
        deliveries run alone); ``first``: before the writes waiting that are not (a
        delivery run alone after its batch failed, ``alone``). A caller cancelled before its
        transaction began leaves it undone; once begun, it commits or fails without the caller."""
        if self._closed:
            raise StoreUnavailable("store is not open")
        return await self._queue(op, exclusive, first)

    async def _queue(self, op: Op[T], exclusive: bool, first: bool) -> Driving[T]:
        """``drive``, also once closed: a write of a failed group run alone (``_alone_write``),
        which closing waits for."""
        done: asyncio.Future[Driving[T]] = asyncio.get_running_loop().create_future()

        async def work() -> None:
            if done.done():  # its caller went before its turn
                return
            try:
                driven = await self._run(op, exclusive)
            except Exception as exc:  # handed to the caller, which raises it
                if not done.done():
                    done.set_exception(exc)
                return
            except BaseException:  # the transaction's task is cancelled: so is its caller's wait
                done.cancel()
                raise
            if not done.done():
                done.set_result(driven)

        self._put(work, first=first)
        try:
            return await done
        except _ServerLost as exc:
            await self.failed(exc)
            raise

    async def write(self, make: Callable[[], Op[T]]) -> tuple[T, bool]:
        """An engine write (``make``: its operation, made afresh each time it runs), committed with
        the engine's other writes waiting when its turn comes, up to ``ENGINE_WRITES`` in one
        transaction (``together``), as SQLite's writer commits them: its result and whether it
        routed an event, once committed. If that transaction fails on one of them, each runs again
        alone (``bot.store.batch.each_alone``) and hears its own outcome; the database's failure is
        every one's. A caller cancelled before its turn leaves it undone.

        Why: each write of the engine was a transaction under the write lock. A burst of incidents
        ending at once (``bench/ingest.py``'s stream closes a dozen in its first half-second, five
        writes each) queued 75 transactions, each taking its turn after two batches of deliveries
        (``_Lanes``), so a delivery met one in every third turn for as long as the burst lasted.
        Measured under that stream (5,000 deliveries, one replica, three pairs of runs alternated):
        the burst's engine writes waited 13-19 ms at the median against 72-82, and it lasted
        0.37 s against 0.62; the stream's p99 13.8 ms against 14.7 (medians), 3,400 deliveries a
        second against 2,740, the stored deliveries' p50 7.0 ms against 9.2. On two replicas (the
        engine on one) no difference beyond the noise: p99 12.2 against 11.8 ms."""
        if self._closed:
            raise StoreUnavailable("store is not open")
        waiting = _EngineWrite(make, asyncio.get_running_loop().create_future())
        self._engine.append(waiting)
        if not self._engine_put:
            self._engine_put = True
            self._put(self._engine_turn, first=False)
        result: tuple[T, bool] = await waiting.done
        return result

    async def _engine_turn(self) -> None:
        """By the writes (a transaction's task): the engine's writes waiting now (up to
        ``ENGINE_WRITES``) in one transaction; what is left gets a turn of its own, after the
        deliveries' (``_Lanes``)."""
        group: list[_EngineWrite] = []
        while self._engine and len(group) < ENGINE_WRITES:
            waiting = self._engine.popleft()
            if not waiting.done.done():  # its caller went before its turn
                group.append(waiting)
        self._engine_put = bool(self._engine)
        if self._engine_put:
            self._put(self._engine_turn, first=False)
        if not group:
            return
        try:
            driven = await self._run(together([waiting.make() for waiting in group]), True)
        except BaseException as exc:  # heard by its callers, never the end of the transaction's task
            task = asyncio.get_running_loop().create_task(self._answer_failed(group, exc))
            self._failing.add(task)
            task.add_done_callback(self._failing.discard)
            if not isinstance(exc, Exception):
                raise
            return
        settle([waiting.done for waiting in group], driven.result)

    async def _answer_failed(self, group: Sequence[_EngineWrite], exc: BaseException) -> None:
        """A group that did not commit: the database's failure (``StoreUnavailable``) is every
        caller's, heard once the store has done what it asks (``failed``); any other is one of the
        writes' (a fenced write of a deposed leader, a row the database refuses), so each runs
        alone, before the engine's writes waiting, unless it was alone already."""
        outcomes: list[Any]
        if isinstance(exc, StoreUnavailable) or not isinstance(exc, Exception) or len(group) == 1:
            await self.failed(exc)
            outcomes = [exc] * len(group)
        else:
            log.warning(
                "the engine's writes failed together; each runs alone",
                extra={"writes": len(group), "error": str(exc)},
            )
            outcomes = list(await each_alone([waiting.make for waiting in group], self._alone_write))
        settle([waiting.done for waiting in group], outcomes)

    async def _alone_write(
        self, part: Sequence[Callable[[], Op[Any]]], answer: Answer | None
    ) -> list[tuple[Any, bool]]:
        [make] = part
        driven = await self._queue(make(), True, True)
        return [(driven.result, driven.wakes)]

    # The group commit's view of the writes (``bot.store.group_commit.Writes``).
    def put(self, work: Callable[[], Awaitable[None]]) -> None:
        """``work`` run by the writes, in the deliveries' lane (a turn of the group commit)."""
        if self._closed:
            raise StoreUnavailable("store is not open")
        self._put(work, first=True)

    async def transact(self, op: Op[list[Result]], exclusive: bool) -> list[Result]:
        """By the writes (a transaction's task, from ``put``'s work): ``op`` in one transaction,
        committed."""
        return (await self._run(op, exclusive)).result

    async def failed(self, exc: BaseException) -> None:
        """When a write failed (``drive``'s, or a batch that ``transact`` failed), before its
        caller hears: a lost server's pool connections go too (``lost``)."""
        if isinstance(exc, _ServerLost) and self._lost is not None:
            await self._lost()

    async def alone(self, op: Op[list[Result]], exclusive: bool) -> list[Result]:
        """A delivery of a failed batch, run alone, before the engine's writes waiting."""
        return (await self.drive(op, exclusive=exclusive, first=True)).result

    def _put(self, work: Callable[[], Awaitable[None]], *, first: bool) -> None:
        self._lanes.put(work, first=first)
        self._kick()

    def _kick(self) -> None:
        """Begin the next work (``_Lanes.take``) if one waits and may begin now: when nothing
        runs, or when the one transaction running has sent its ``COMMIT`` (it only waits for its
        answer), on the other connection. Never while one is under way (not yet at its
        ``COMMIT``), never a third, and nothing overlaps where nothing would order the two
        (retention's writes, not ``locked``) or the second connection could not be made
        (``_alone_until``). Called where that may change, at once: a work put, a ``COMMIT`` sent
        (``_committed``), a transaction ended (``_ended``). So a work waits for no turn of the
        event loop but its own task's start. Before, a task of the writes' own woke for it first,
        one more turn of a loop that webhooks keep busy (under ``bench/ingest.py``'s saturated
        stream a turn takes 0.34 ms at the median, 2.5 ms at p99). Three pairs of runs of that
        stream (20,000 deliveries, one replica), alternated: saturated p99 10.9, 10.7 and 10.3 ms
        against 11.4, 11.6 and 10.8; the stored deliveries' median lower in each, by 0.2-0.4 ms."""
        if self._under_way is not None:
            return
        if self._running and not (
            len(self._running) == 1 and self._locked and time.monotonic() >= self._alone_until
        ):
            return
        work = self._lanes.take()
        if work is None:
            if self._lanes.closed and not self._running:
                self._drained.set()
            return
        slot = 1 - next(iter(self._running)).slot if self._running else 0
        self._begin(work, slot)

    def _begin(self, work: Callable[[], Awaitable[None]], slot: int) -> None:
        """``work`` in a task of its own on connection ``slot``, under way until its transaction
        sends its ``COMMIT`` or it ends."""
        turn = _Turn(slot)
        self._under_way = turn
        self._running.add(turn)

        async def run() -> None:
            _COMMITTING.set(lambda: self._committed(turn))
            _SLOT.set(slot)
            try:
                await work()
            except Exception:  # a work hands its failure to its callers; this never ends the task
                log.exception("a write's work failed")
            finally:
                self._committed(turn)

        turn.task = asyncio.get_running_loop().create_task(run(), name=f"{self._name}-{slot}")
        turn.task.add_done_callback(lambda _: self._ended(turn))

    def _committed(self, turn: _Turn) -> None:
        """``turn``'s transaction has sent its ``COMMIT`` (``_Message.send``), or its work ended."""
        if self._under_way is turn:
            self._under_way = None
            self._kick()

    def _ended(self, turn: _Turn) -> None:
        self._running.discard(turn)
        self._kick()

    async def _run(self, op: Op[T], exclusive: bool) -> Driving[T]:
        lock = None  # retention's: no lock
        if self._locked:
            lock = "pg_advisory_xact_lock" if exclusive else "pg_advisory_xact_lock_shared"
        slot = _SLOT.get()
        if slot and self._conns[slot] is None:
            slot = await self._second()
        async with self._busy[slot]:
            return await self._run_on(slot, op, lock)

    async def _second(self) -> int:
        """The connection an overlapping transaction runs on: the second, made now, or, if it
        cannot be made (the role's, the database's or a pooler's connection limit reached), the
        first once the transaction on it has ended; nothing overlaps then for ``ALONE_FOR``."""
        try:
            self._conns[1] = await psycopg.AsyncConnection[DictRow].connect(self._url, **self._kwargs())
        except _UNAVAILABLE as exc:
            self._alone_until = time.monotonic() + ALONE_FOR
            log.warning(
                "the store's writes run one at a time: their second connection could not be made",
                extra={"error": str(exc), "seconds": ALONE_FOR},
            )
            return 0
        return 1

    async def _run_on(self, slot: int, op: Op[T], lock: str | None) -> Driving[T]:
        conn = None
        try:
            conn = self._conns[slot]
            if conn is not None and self._idle.stale(conn):
                try:  # still there after a quiet spell? (as ``PostgresStore._live`` checks)
                    await AsyncConnectionPool.check_connection(conn)
                except psycopg.OperationalError:
                    await self._drop(slot)
            conn = self._conns[slot]
            if conn is None or conn.closed:
                conn = await psycopg.AsyncConnection[DictRow].connect(self._url, **self._kwargs())
                self._conns[slot] = conn
            driven = await _transaction(conn, op, lock)
            self._idle.used(conn)
        except _UNAVAILABLE as exc:
            self.heard(committed=False)
            await self._drop(slot)
            # Not a refused connect: the pool's connections may be fine (the server out of
            # connection slots, say), and replacing them would fail them too.
            if conn is not None and _is_lost(conn, exc):
                raise _ServerLost(f"{self._where}: {exc}") from exc
            raise StoreUnavailable(f"{self._where}: {exc}") from exc
        self.heard(committed=True)
        return driven

    def heard(self, *, committed: bool) -> None:
        """This replica's write committed (here, or a flush's chunk on the pool:
        ``PostgresStore._count``), or the database failed it: ``committed_at``."""
        self.committed_at = time.monotonic() if committed else float("-inf")

    async def _drop(self, slot: int | None = None) -> None:
        """Close the connection ``slot`` (``None``: each)."""
        for index in range(len(self._conns)) if slot is None else (slot,):
            conn, self._conns[index] = self._conns[index], None
            if conn is not None:
                with contextlib.suppress(psycopg.Error):
                    await conn.close()

    async def close(self) -> None:
        """The writes already queued commit first; then the connections are closed."""
        if self._closing is None:
            self._closed = True
            self._lanes.close()
            self._kick()
            self._closing = asyncio.get_running_loop().create_task(self._close())
        await asyncio.shield(self._closing)

    async def _close(self) -> None:
        try:
            while self._failing:  # their writes run again alone first
                await asyncio.gather(*self._failing)
            await self._drained.wait()
        finally:
            await self._drop()


#: Batches of deliveries the writes run in a row while an engine write waits (``_Lanes``). Two,
#: not one: under ``bench/ingest.py``'s saturated stream on one replica a stored delivery's batch
#: came while an engine write waited (the dozen incidents a second the stream closes write five
#: transactions each) and the last batch was a delivery's often enough that it waited for the
#: engine's 3-5 ms transaction too. Eight pairs alternated (the warm-up and first saturated
#: stream): p99 11.3 ms against 14.1 at the median, lower in all eight; stored deliveries' p50 7.7
#: against 8.8 ms. Three measured no better than two (six pairs: 13.4 against 12.0).
DELIVERIES_IN_A_ROW = 2


class _Lanes:
    """What the writes run next (``_Writes._kick``): webhook deliveries (``first``) before the
    engine's writes, each lane in order, but no more than ``DELIVERIES_IN_A_ROW`` deliveries'
    transactions in a row while an engine write waits. In a storm a turn of the group commit is
    always waiting (``bot.store.group_commit`` puts the next as soon as a delivery comes): first
    alone, they would hold the engine's writes back for as long as the storm lasts."""

    def __init__(self) -> None:
        self._first: collections.deque[Callable[[], Awaitable[None]]] = collections.deque()
        self._rest: collections.deque[Callable[[], Awaitable[None]]] = collections.deque()
        self._in_a_row = 0  # deliveries' works taken since the last engine write
        #: No more works come (``close``); those put are still taken.
        self.closed = False

    def put(self, work: Callable[[], Awaitable[None]], *, first: bool) -> None:
        (self._first if first else self._rest).append(work)

    def take(self) -> Callable[[], Awaitable[None]] | None:
        """The next work, if one waits; else ``None``."""
        if self._first and not (self._rest and self._in_a_row >= DELIVERIES_IN_A_ROW):
            self._in_a_row += 1
            return self._first.popleft()
        if self._rest:
            self._in_a_row = 0
            return self._rest.popleft()
        return None

    def close(self) -> None:
        self.closed = True


@dataclass(frozen=True, slots=True)
class _EngineWrite:
    """An engine write waiting for its group's transaction (``_Writes.write``): its operation, made
    afresh each time it runs, and its caller's answer."""

    make: Callable[[], Op[Any]]
    done: asyncio.Future[tuple[Any, bool]]


@dataclass(slots=True, eq=False)
class _Turn:
    """A work's transaction begun by the writes (``_Writes._begin``): its connection, and its task,
    held here while it runs (the event loop keeps only a weak reference to a task)."""

    slot: int
    task: asyncio.Task[None] | None = None


def where(url: str) -> str:
    """The server(s) and database of a libpq URL, for messages: no user, password or options. A
    URL may list several hosts (``postgresql://a:5432,b:5432/db``, each with its port, or one port
    for all, or none: 5432)."""
    info = psycopg.conninfo.conninfo_to_dict(url)
    hosts = str(info.get("host", "")).split(",")
    ports = str(info.get("port", "")).split(",")
    if len(ports) != len(hosts):
        ports = ports[:1] * len(hosts)
    servers = ",".join(f"{host}:{port or 5432}" for host, port in zip(hosts, ports, strict=True))
    return f"postgresql://{servers}/{info.get('dbname', '')}"


def read_password(path: Path) -> str:
    """The password in ``store.password_file`` (its first line: a Kubernetes Secret's file)."""
    lines = path.read_text().splitlines()
    return lines[0] if lines else ""


@dataclass(slots=True)
class _Shared:
    """What a store and its fenced views have in common: the pool, opened after they are made."""

    pool: AsyncConnectionPool[Conn] | None = None
    #: Webhook deliveries, many to a transaction (``bot.store.group_commit``).
    deliveries: GroupCommit | None = None
    #: Where every write under the write lock commits.
    writes: _Writes | None = None
    #: Where retention's transactions commit, without the lock (made at the first prune).
    prunes: _Writes | None = None
    #: Keys committed, and repeat deliveries counted and not yet committed (``bot.store.repeats``).
    memory: RepeatMemory = field(default_factory=RepeatMemory)
    #: When the pool's connections were last used, to check one unused for a while.
    idle: _Idle = field(default_factory=_Idle)
    #: Commits the counts of ``memory`` every ``FLUSH_EVERY`` seconds.
    flusher: asyncio.Task[None] | None = None
    #: A flush's chunks under way (``PostgresStore._count``): the store closes once they end.
    counting: set[asyncio.Task[None]] = field(default_factory=set)
    #: The replication the server's commits got at the last ``ping`` (``/readyz``), if any yet.
    replication: Replication | None = None
    #: Probes' reads given up (``ping``), until their cancelling ends.
    abandoned: set[asyncio.Task[Any]] = field(default_factory=set)


async def _give_back_cancelled(pool: AsyncConnectionPool[Conn], conn: Conn) -> NoReturn:
    """The caller was cancelled while the pool handed it ``conn``, and the pool's wait swallowed the
    cancellation: psycopg_pool waits for a connection with ``asyncio.wait_for``, which on Python
    3.11 returns the result when the waiting task is cancelled as the result arrives (CPython
    gh-86296; psycopg/psycopg#1345). The task would carry on as if never cancelled, and whoever
    stopped it would wait for ever (a leader stepping down did: its engine scan went on). The
    connection goes back (shielded: the cancellation may still be pending), and the cancellation
    is raised."""
    giving = asyncio.ensure_future(pool.putconn(conn))
    with contextlib.suppress(asyncio.CancelledError):
        await asyncio.shield(giving)
    raise asyncio.CancelledError


def _forget(tasks: set[asyncio.Task[Any]]) -> Callable[[asyncio.Task[Any]], None]:
    """A done callback: the task leaves ``tasks``, its outcome read (a read given up says nothing)."""

    def forget(task: asyncio.Task[Any]) -> None:
        tasks.discard(task)
        if not task.cancelled():
            task.exception()

    return forget


class PostgresStore(SqlStore):
    dialect = POSTGRES
    _prune_pace = retention.BESIDE_PACE  # a prune runs beside the deliveries, on the same WAL

    def __init__(
        self,
        url: str,
        *,
        password_file: Path | None = None,
        pool_size: int = 10,
        connect_timeout: float = 10.0,
        clock: Callable[[], datetime] | None = None,
        retention: timedelta | None = None,
    ) -> None:
        super().__init__(clock)
        self.url = url
        self._password_file = password_file
        self._pool_size = pool_size
        self._connect_timeout = connect_timeout
        #: Shared with every fenced view (``fenced`` copies this object, not the pool).
        self._shared = _Shared(memory=RepeatMemory(retention=retention))

    # ------------------------------------------------------------- connection
    def _connection_kwargs(self) -> dict[str, Any]:
        """How every connection of the store is made (the pool's, the writes', the lease
        release's, ``inspect``'s)."""
        kwargs: dict[str, Any] = {
            "autocommit": True,
            "row_factory": dict_row,
            "connect_timeout": max(1, int(self._connect_timeout)),
            # Nothing is set for the session but startup parameters a pooler passes (``application_name``,
            # ``client_encoding`` below), so a connection pooler in front of Postgres
            # (PgBouncer, in its transaction mode too) passes every connection and statement: what a
            # transaction needs it sets itself (``_TRANSACTION_SETTINGS``), and the lease's times
            # come back as instants, read in UTC whatever the session's time zone
            # (``bot.store.sql.POSTGRES.moment``). No statement is prepared on the server either
            # (psycopg prepares one run five times on a connection): the pooler may run the next on
            # another server session, where it does not exist (PgBouncer before 1.21, or without
            # ``max_prepared_statements``). It costs a direct connection 0.1-0.35 ms a read (p50 of
            # the engine's reads of an incident, its alerts, its steps, loopback).
            "prepare_threshold": None,
            "application_name": "pitcrew",
        }
        given = psycopg.conninfo.conninfo_to_dict(self.url)
        kwargs |= {key: value for key, value in TCP.items() if key not in given}
        # Whatever the URL, the environment (PGCLIENTENCODING) or the role (ALTER ROLE ... SET
        # client_encoding) says: text goes both ways as UTF-8, so any text of a UTF8 database
        # (``_AT_OPEN``) is written and read (a LATIN1 session failed on the first character
        # outside Latin-1). A parameter of the startup message, which PgBouncer passes.
        kwargs["client_encoding"] = "UTF8"
        if self._password_file is not None:
            kwargs["password"] = read_password(self._password_file)
        return kwargs

    def _connecting(self) -> dict[str, Any]:
        """``_connection_kwargs`` for a new connection of the open store: the password file is read
        again each time, so a rotated password (its Secret updated in the mounted volume; Vault's
        or a cloud's rotation) is used from the next connection on. Read once at start, the old
        one was sent by every connection made after the rotation (a failover, a restart of
        Postgres, the pool replacing ended ones) and each was refused until pitcrew restarted.
        A file that cannot be read fails that connection, as a server that cannot be reached does."""
        try:
            return self._connection_kwargs()
        except OSError as exc:
            raise psycopg.OperationalError(f"cannot read the password file: {exc}") from exc

    async def open(self) -> None:
        self._connection_kwargs()  # a password file that cannot be read fails the start, named
        pool: AsyncConnectionPool[Conn] = AsyncConnectionPool(
            self.url,
            connection_class=psycopg.AsyncConnection[DictRow],
            kwargs=self._connecting,
            min_size=1,
            max_size=self._pool_size,
            timeout=self._connect_timeout,
            configure=self._shared.idle.made,
            open=False,
            name="pitcrew-store",
        )
        try:
            await pool.open(wait=True, timeout=self._connect_timeout)
        except PoolTimeout as exc:
            await pool.close()
            raise StoreUnavailable(f"cannot connect to {self._where()}: {exc}") from exc
        except BaseException:  # cancelled (a stop while the start waits for Postgres): no pool left behind
            await pool.close()
            raise
        self._shared.pool = pool
        try:
            await self._migrate()
        except _NOT_PERMITTED as exc:
            await self.close()
            raise NotPermitted(_not_permitted(self._where(), exc)) from exc
        except BaseException:
            await self.close()
            raise
        self._shared.writes = _Writes(
            self.url,
            self._connecting,
            self._where(),
            lost=self._server_lost,
            check_after=self._shared.idle.after,
        )
        self._shared.deliveries = GroupCommit(
            self._shared.writes, expectations=Expectations(keys=self._shared.memory.trusted)
        )
        self._shared.deliveries.start()
        self._shared.flusher = asyncio.create_task(self._flush_repeats(), name="pitcrew-store-repeats")

    def _where(self) -> str:
        return where(self.url)

    async def close(self) -> None:
        """Commit the deliveries queued, then close the pool, whatever happens."""
        deliveries, self._shared.deliveries = self._shared.deliveries, None
        flusher, self._shared.flusher = self._shared.flusher, None
        try:
            if deliveries is not None:
                await deliveries.stop()
            if flusher is not None:
                flusher.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await flusher
                await self._flush()  # repeats answered 200 are on disk before the store closes
            # A chunk the flusher left as it was cancelled still commits on the pool, before it closes.
            await asyncio.gather(*self._shared.counting, return_exceptions=True)
        finally:
            # Probes' reads given up end first (psycopg's cancelling is bounded): they hold connections.
            await asyncio.gather(*self._shared.abandoned, return_exceptions=True)
            writes, self._shared.writes = self._shared.writes, None
            if writes is not None:
                await writes.close()
            prunes, self._shared.prunes = self._shared.prunes, None
            if prunes is not None:
                await prunes.close()
            pool, self._shared.pool = self._shared.pool, None
            if pool is not None:
                await pool.close()

    @asynccontextmanager
    async def _conn(self) -> AsyncIterator[Conn]:
        pool = self._shared.pool
        if pool is None:
            raise StoreUnavailable("store is not open")
        try:
            conn = await self._live(pool)
        except (PoolTimeout, *_UNAVAILABLE) as exc:
            raise StoreUnavailable(f"{self._where()}: {exc}") from exc
        try:
            yield conn
        except _UNAVAILABLE as exc:
            if _is_lost(conn, exc):
                await self._server_lost()
            raise StoreUnavailable(f"{self._where()}: {exc}") from exc
        finally:
            # Its last use, recorded now: not in the pool's ``reset`` callback, which a worker task
            # runs later (a connection the server ended meanwhile looked freshly used, unchecked).
            self._shared.idle.used(conn)
            await pool.putconn(conn)  # a broken one is discarded, and another made

    async def _live(self, pool: AsyncConnectionPool[Conn]) -> Conn:
        """A connection of the pool; one left unused for ``_Idle.after`` is checked first (one empty
        query). If the server has ended it, it has ended the others left idle as well (a restart, a
        failover, its idle limit): all are replaced at once, and a new one is taken. Not the
        pool's own ``check``: after each dead connection it finds, psycopg_pool waits a growing
        backoff (1 s, 2 s, 4 s...) before the next, and a pool of dead connections after a quiet
        spell held the first read for seconds, or failed it at the pool's timeout."""
        task = asyncio.current_task()
        asked = task.cancelling() if task is not None else 0
        for _ in range(_LIVE_ATTEMPTS):
            conn = await pool.getconn()
            if task is not None and task.cancelling() > asked:
                await _give_back_cancelled(pool, conn)
            if not self._shared.idle.stale(conn):
                return conn
            try:
                await AsyncConnectionPool.check_connection(conn)
            except psycopg.Error:
                await pool.putconn(conn)
                await self._server_lost()
                continue
            except BaseException:  # cancelled (a probe's timeout): the connection goes back
                await pool.putconn(conn)
                raise
            return conn
        raise psycopg.OperationalError(f"{_LIVE_ATTEMPTS} connections in a row ended before their first use")

    async def _server_lost(self) -> None:
        """A read, a lease write or the writes found the server lost (``_is_lost``):
        every connection of the pool reached that server, and each would fail its next use in
        turn (a read, a lease renewal each), so all are replaced: the next use connects again, to
        the new primary after a failover."""
        pool = self._shared.pool
        if pool is not None:
            await pool.drain()

    async def _migrate(self) -> None:
        async with self._conn() as conn, conn.transaction():
            unbounded = f"{_UNBOUNDED}; {_NO_TRANSACTION_TIMEOUT}" if _newer(conn) else _UNBOUNDED
            await conn.execute(f"{_TRANSACTION_SETTINGS}; {unbounded}")
            found = await (await conn.execute(_AT_OPEN)).fetchone()
            assert found is not None
            if found["encoding"] != "UTF8":  # before anything is created in it
                raise WrongEncoding(_wrong_encoding(self._where(), str(found["encoding"])))
            if found["standby"] or found["read_only"]:  # where nothing needs writing, it opened
                raise StoreUnavailable(
                    f"{self._where()}: read-only ({'a standby' if found['standby'] else 'for this role'}):"
                    " pitcrew needs a primary that takes its writes"
                )
            await conn.execute("SELECT pg_advisory_xact_lock(%s)", (_MIGRATE_LOCK,))
            # Created only when it is not there: ``CREATE TABLE IF NOT EXISTS`` asks for CREATE
            # on the schema even then, and a role allowed to use the tables a DBA made, not to
            # create, failed every start (what check-config --live said it could do).
            there = await (
                await conn.execute("SELECT to_regclass('pitcrew_schema') IS NOT NULL AS t")
            ).fetchone()
            if there is None or not there["t"]:
                await conn.execute("CREATE TABLE IF NOT EXISTS pitcrew_schema (version INTEGER NOT NULL)")
            row = await (await conn.execute("SELECT * FROM pitcrew_schema")).fetchone()
            if row is None:
                await conn.execute("INSERT INTO pitcrew_schema (version) VALUES (0)")
                row = {"version": 0}
            if "compatible_from" not in row:  # a store of a pitcrew before the column
                await conn.execute("ALTER TABLE pitcrew_schema ADD COLUMN compatible_from INTEGER")
            version, compatible = int(row["version"]), row.get("compatible_from")
            stands = opening(version, compatible, self._where())
            if version < SCHEMA_VERSION:
                # Every replica's writes wait meanwhile (a rolling update's older replica goes on
                # writing): a migration locks table after table, and a write that held one and
                # wanted another ended in a deadlock, failing the migration or that write.
                await conn.execute("SELECT pg_advisory_xact_lock(%s)", (_WRITE_LOCK,))
            for number in range(version, SCHEMA_VERSION):
                async with conn.transaction():  # a savepoint: each migration whole or not at all
                    await conn.execute(_MIGRATIONS[number])
                    await conn.execute("UPDATE pitcrew_schema SET version = %s", (number + 1,))
                log.info("store schema migrated", extra={"schema_version": number + 1})
            if stands != "newer" and compatible != compatible_from(SCHEMA_VERSION):
                await conn.execute(
                    "UPDATE pitcrew_schema SET compatible_from = %s", (compatible_from(SCHEMA_VERSION),)
                )
            # The replication its commits get, logged and shown from the start (then at every probe).
            seen = await (await conn.execute(_PING)).fetchone()
            assert seen is not None
            self._replicated(_replication(seen))
            limit = await (await conn.execute(_IDLE_SESSION_LIMIT)).fetchone()
            if limit is not None:
                self._shared.idle.heed(int(limit["setting"]))

    async def schema_version(self) -> int:
        row = await self._read(single(one("SELECT version FROM pitcrew_schema")))
        return int(row["version"]) if row is not None else 0

    async def ping(self) -> bool:
        """Ready for writes: the database answers within ``PING_TIMEOUT`` and is not read-only (a
        standby of a failover pair, or read-only for this role). While Postgres is away the pool
        would wait its whole connect timeout, past the readiness probe's own: the probe is answered
        "not ready" in time instead.
        A read given up is cancelled behind the answer, not before it: cancelling a statement the
        server does not answer, psycopg waits up to 5 s for it to confirm (a frozen node, a silent
        link), and the probe would time out on its own."""
        read = asyncio.create_task(self._read(single(one(_PING))), name="pitcrew-store-ping")
        done, _ = await asyncio.wait({read}, timeout=PING_TIMEOUT)
        if not done:
            read.cancel()
            self._shared.abandoned.add(read)
            read.add_done_callback(_forget(self._shared.abandoned))
            return False
        try:
            row = read.result()
        except Exception:  # readiness probes report, they do not raise
            return False
        if row is None:
            return False
        self._replicated(_replication(row))
        return not row["read_only"]  # a standby, or default_transaction_read_only (database, role)

    def _replicated(self, seen: Replication) -> None:
        """Keep what the last probe saw; log a turn to (or from) commits a failover may lose."""
        before, self._shared.replication = self._shared.replication, seen
        if seen.mode == "asynchronous" and (before is None or before.mode != "asynchronous"):
            log.warning(
                "%s streams to %d standby(s) without waiting for them: a commit returns before any "
                "standby has it, and a failover may lose alerts pitcrew acknowledged and steps it "
                "recorded; make replication synchronous (synchronous_standby_names; CloudNativePG: "
                ".spec.postgresql.synchronous)",
                self._where(),
                seen.standbys,
            )
        elif before is not None and before.mode == "asynchronous" and seen.mode != "asynchronous":
            log.info("%s: commits are no longer acknowledged before a standby has them", self._where())

    def describe(self) -> dict[str, Any]:
        seen = self._shared.replication
        answer: dict[str, Any] = {"kind": "postgresql"}  # no address: /readyz asks no credentials
        if seen is not None:
            answer |= {
                "replication": seen.mode,
                "standbys": seen.standbys,
                "synchronous_commit": seen.commit,
            }
        return answer

    # ------------------------------------------------------------------ drivers
    async def _read(self, op: Op[T]) -> T:
        """Each statement on its own (autocommit): at Postgres's READ COMMITTED, statements inside
        one transaction see a snapshot each as well, and a BEGIN and a COMMIT around every read
        were two more round trips (most of the engine's reads are one statement). Not before the
        store is open: while it migrates, a read (a Slack click let through during a start) could
        find a table not made yet."""
        self._writes()
        async with self._conn() as conn:
            return (await _drive(conn, op)).result

    async def _transact(self, make: Callable[[], Op[T]]) -> tuple[T, bool]:
        """One transaction under the write lock (see the module's docstring), on ``_Writes``."""
        return await self._writes().write(make)

    async def _bulk_transact(self, make: Callable[[], Op[T]]) -> tuple[T, bool]:
        """A write that may touch many rows (a fleet's watch memory): a transaction of its own, not
        in a group of the engine's writes (``_Writes.write``), so none waits for it."""
        driven = await self._writes().drive(make())
        return driven.result, driven.wakes

    def _writes(self) -> _Writes:
        """The writes, made last as the store opens: the one sign that it is open (migrated,
        taking writes); ``StoreUnavailable`` before, and once closed."""
        if self._shared.writes is None:
            raise StoreUnavailable("store is not open")
        return self._shared.writes

    async def _prune_transact(self, make: Callable[[], Op[T]]) -> tuple[T, bool]:
        """Retention's transactions, on a connection and a task of their own beside the
        writes' (``_Writes(locked=False)``), without the write lock: a delivery never waits for a
        prune. Under the lock, each of a prune's transactions (its deletes and its commit) held
        every delivery of every replica back, and ingest's p99 while pruning 1,000,000 alerts was
        2-2.3x what it was alone.

        What makes that safe: a prune touches only what no other write does, incidents closed
        before the cut-off that are not the newest (ids are taken as ``MAX(seq) + 1``, never
        reused), their alerts, counters, steps, approvals and delivered outbox rows. The database
        keeps it so where a write could still meet one: a step, approval or alert written for an
        incident as it goes fails its foreign key, or makes the prune's delete of the incident fail
        (the prune rolls back whole and the next period tries again); an outbox row written
        meanwhile is left, as only delivered rows are removed. The fence is checked in the
        transaction as for every write, so only the leader prunes."""
        self._writes()
        if self._shared.prunes is None:
            self._shared.prunes = _Writes(
                self.url,
                self._connecting,
                self._where(),
                locked=False,
                check_after=self._shared.idle.after,
            )
        driven = await self._shared.prunes.drive(make())
        return driven.result, driven.wakes

    async def _lease_write(self, make: Callable[[], Op[T]]) -> T:
        """The lease's own writes: no write lock (a renewal never waits on ingest)."""
        async with self._conn() as conn, conn.transaction():
            await conn.execute(_TRANSACTION_SETTINGS)
            return (await _drive(conn, make())).result

    async def inspect(self) -> Inspection:
        """What ``check-config --live`` reports, on one connection made as the store makes them,
        changing nothing (no pool, no migration): the server, whether it takes writes, what opening
        the store there will do to its schema and whether this role may, how its commits are
        replicated, who leads. Every problem found is named, not only the first."""
        where = self._where()
        within = self._connect_timeout + PING_TIMEOUT

        def failed(exc: Exception, missing: str) -> Inspection:
            reason = str(exc) or f"no answer within {within:g}s"  # a timeout says nothing
            return Inspection("postgresql", False, f"{where}: {reason}", missing=(missing,))

        try:
            kwargs = self._connection_kwargs()
        except OSError as exc:
            return failed(exc, f"the password file {exc.filename}")
        try:
            async with asyncio.timeout(within):
                conn = await psycopg.AsyncConnection.connect(self.url, **kwargs)
        except (TimeoutError, OSError, psycopg.Error) as exc:
            return failed(exc, f"a connection to {where}")
        try:
            async with asyncio.timeout(within), conn:
                server = await (await conn.execute(_INSPECT)).fetchone()
                ping = await (await conn.execute(_PING)).fetchone()
                assert server is not None and ping is not None
                schema = lease = None
                if server["schema_readable"]:
                    schema = await (await conn.execute("SELECT * FROM pitcrew_schema")).fetchone()
                if server["leadership_readable"]:
                    lease = await (await conn.execute(_WHO_LEADS)).fetchone()
                refused = await (await conn.execute(_NOT_ALLOWED, (["pitcrew_schema", *TABLES],))).fetchall()
        except (TimeoutError, psycopg.Error) as exc:
            return failed(exc, f"an answer from {where}")
        said = [f"{where}: PostgreSQL {server['version']}"]
        missing: list[str] = []
        if ping["standby"]:
            said.append("a standby, read-only")
            missing.append(
                "a primary that takes writes (the manager's -rw Service, or every host with "
                "target_session_attrs=read-write)"
            )
        elif ping["read_only"]:
            said.append("read-only for this role (default_transaction_read_only)")
            missing.append("writes: default_transaction_read_only off for the database and the role")
        if int(server["version_num"]) < MIN_SERVER_VERSION:
            missing.append("PostgreSQL 12 or newer")
        if server["encoding"] != "UTF8":
            said.append(f"encoding {server['encoding']}")
            missing.append(f"a database in UTF8 ({server['encoding']} cannot hold what pitcrew stores)")
        if server["has_schema"] and schema is None:
            said.append("schema not readable by this role")  # the privileges it lacks: below
        else:
            try:
                found = None if schema is None else int(schema["version"])
                compatible = None if schema is None else schema.get("compatible_from")
                foreseen, creates = foresee(found, compatible, where)
                said.append(foreseen)
                if creates and not server["may_create"]:
                    missing.append(
                        f"CREATE on schema {server['schema'] or '(none on the search_path)'}, to "
                        "create and migrate pitcrew's tables"
                    )
            except NewerSchema as exc:
                said.append(str(exc).removeprefix(f"{where} has "))
                missing.append("a pitcrew that runs on this store's schema")
        lacking: dict[str, list[str]] = {}
        for row in refused:
            lacking.setdefault(row["name"], []).append(row["privilege"])
        missing.extend(f"{', '.join(privileges)} on {table}" for table, privileges in lacking.items())
        said.append(_replication(ping).said())
        if lease is not None:
            said.append(
                f"led by {lease['holder']} (epoch {lease['epoch']})" if lease["live"] else "nobody leads"
            )
        return Inspection("postgresql", not missing, "; ".join(said), missing=tuple(missing))

    async def release_lease(self, holder: str, epoch: int) -> None:
        """End the term now (graceful shutdown), on a connection of its own: at SIGTERM
        ``asyncio.run`` cancels every task, the pool's background workers too, and the release
        must not depend on them."""
        if self._shared.pool is None:
            raise StoreUnavailable("store is not open")
        op = single(queries.release_lease(self.dialect, self._now(), holder, epoch))
        try:
            async with asyncio.timeout(self._connect_timeout):
                conn = await psycopg.AsyncConnection.connect(self.url, **self._connecting())
                async with conn:
                    await _drive(conn, op)
        except (TimeoutError, psycopg.OperationalError) as exc:
            raise StoreUnavailable(f"{self._where()}: {exc}") from exc

    # ------------------------------------------------------------------ ingest
    def _moved(self, record: IncidentRecord) -> None:
        deliveries = self._shared.deliveries
        if deliveries is not None and deliveries.expectations is not None:
            deliveries.expectations.moved(record.id, record.node, record.state)

    def _group(self) -> GroupCommit:
        if self._shared.deliveries is None:
            raise StoreUnavailable("store is not open")
        return self._shared.deliveries

    async def ingest(self, delivery: Delivery, now: datetime) -> IngestOutcome:
        """Worked out and written as SQLite's writer does it, in the next batch's transaction."""
        outcome = await self._group().ingest(delivery, now)
        self._shared.memory.remember(outcome.cache)  # committed: safe to remember
        return outcome

    async def count_repeats(
        self, alerts: Sequence[tuple[str, datetime, AlertStatus]], now: datetime
    ) -> int | None:
        """If every alert is already stored in the same status, count the delivery and return how
        many alerts it had; else ``None`` and nothing is counted (the caller ingests it in full,
        which counts what it holds of repeats, in one transaction). From memory while the database
        commits this replica's writes (``FRESH``), the counts committed within a second; else
        looked up and counted in the next batch's transaction, which proves the database answers."""
        group, writes, memory = self._group(), self._shared.writes, self._shared.memory
        if writes is not None and time.monotonic() - writes.committed_at < FRESH:
            return memory.count(alerts, now)
        counted = await group.repeats(alerts, now)
        if counted is not None:
            # Stored and unchanged by a delivery in this status: resolved if it says resolved;
            # remembered as firing otherwise, which never lets a resolution pass for a repeat.
            memory.remember({dedupe_key(fp, starts): (status, None) for fp, starts, status in alerts})
        return counted

    async def _flush_repeats(self) -> None:
        while True:
            await asyncio.sleep(FLUSH_EVERY)
            await self._flush()

    async def _flush(self) -> None:
        """Commit the repeat deliveries counted in memory, ``FLUSH_ROWS`` counters a transaction
        (``_count``). A chunk that fails is counted again for the next flush, and the rest waits
        for it."""
        memory = self._shared.memory
        for _ in range(math.ceil(len(memory.seen) / FLUSH_ROWS)):  # what is counted now, no more
            if not memory.seen or self._shared.writes is None:
                return
            rows = memory.take(FLUSH_ROWS)
            counting = asyncio.ensure_future(self._count(rows))
            self._shared.counting.add(counting)
            counting.add_done_callback(_forget(self._shared.counting))
            try:
                # Shielded: the counts it carries were answered 200 already.
                await asyncio.shield(counting)
            except asyncio.CancelledError:
                memory.flushed(committed=True)  # the shielded write goes on without us
                raise
            except Exception:
                log.warning("could not record repeat deliveries; will retry", exc_info=True)
                memory.flushed(committed=False)
                return
            memory.flushed(committed=True)

    async def _count(self, rows: Sequence[Seen]) -> None:
        """One chunk of a flush: its counters, one statement in a transaction of its own on a
        connection of the pool, neither under the write lock nor in the writes' turn. It writes
        only counters of alerts stored already, in one statement in key order, as every
        transaction does (``bump_seen``), so it needs nothing the lock keeps: deliveries, the
        engine's writes and other replicas' flushes go on beside it, and it waits only for a
        transaction counting the same alerts. In the writes' turn, under the lock's shared mode,
        every delivery that came while a chunk ran waited for all of it, in pitcrew and then in
        the server: a chunk took 3.7 to 6 ms under ``bench/ingest.py``'s saturated stream, however
        few its rows, and a flush was several. Its transaction is one message (``_transaction``),
        at READ COMMITTED whatever the site's default, so a chunk that waited for a row another
        transaction counted adds to what that one committed instead of failing to serialize. A
        commit here is one of this replica's, as the writes' are: a replica taking only repeats
        stays fresh by its flushes (``FRESH``), and one whose flush finds the database gone no
        longer is."""
        writes = self._writes()
        try:
            async with self._conn() as conn:
                await _transaction(conn, single(bump_seen(rows)), None)
        except StoreUnavailable:
            writes.heard(committed=False)
            raise
        writes.heard(committed=True)

    def _alert(self, alert: AlertRecord) -> AlertRecord:
        """Include repeat deliveries counted in memory and not yet committed."""
        return self._shared.memory.overlay(alert)

    def _pruned(self, done: retention.Pruned) -> None:
        self._shared.memory.forget(done.keys)  # a pruned alert delivered again is new, not a repeat
