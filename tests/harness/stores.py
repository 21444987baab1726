"""Both stores behind one fixture: the contract suites run every case on SQLite and on Postgres.

``stores`` (parametrised ``sqlite`` / ``postgres`` / ``pgbouncer``: Postgres through a real
PgBouncer in its transaction mode, ``tests.harness.pgbouncer``) opens store objects on one
database: each call of ``stores.open()`` is another process's view of it (SQLite: another
writer and reader on the same file; Postgres: another connection pool on the same database of
the session's cluster, ``tests.harness.postgres``), and closes them all at the end of the test.
The Postgres cluster is started only when a Postgres case runs.
"""

from __future__ import annotations

import contextlib
import dataclasses
import sqlite3
from collections.abc import AsyncIterator, Callable, Iterator
from datetime import datetime, timedelta
from pathlib import Path

import psycopg
import pytest

from bot.store.postgres import PostgresStore
from bot.store.sqlite import SqliteStore
from tests.harness.postgres import PostgresDatabase, fresh_database

AnyStore = SqliteStore | PostgresStore
KINDS = ("sqlite", "postgres", "pgbouncer")


class Stores:
    def __init__(self, kind: str, tmp_path: Path, database: PostgresDatabase | None) -> None:
        self.kind = kind
        self._tmp = tmp_path
        self.database = database
        self._opened: list[AnyStore] = []

    def make(
        self, clock: Callable[[], datetime] | None = None, *, retention: timedelta | None = None
    ) -> AnyStore:
        if self.database is not None:
            database = self.database
            return PostgresStore(
                database.url, password_file=database.password_file, clock=clock, retention=retention
            )
        return SqliteStore(self._tmp / "pitcrew.db", synchronous="off", clock=clock, retention=retention)

    async def open(
        self, clock: Callable[[], datetime] | None = None, *, retention: timedelta | None = None
    ) -> AnyStore:
        store = self.make(clock, retention=retention)
        await store.open()
        self._opened.append(store)
        return store

    @contextlib.contextmanager
    def writes_locked(self) -> Iterator[None]:
        """Another session holds what a new alert's write needs until the block ends (SQLite: the
        database's write lock, ``BEGIN IMMEDIATE``; Postgres: the alerts table)."""
        if self.database is None:
            other = sqlite3.connect(self._tmp / "pitcrew.db", isolation_level=None)
            try:
                other.execute("BEGIN IMMEDIATE")
                yield
                other.execute("ROLLBACK")
            finally:
                other.close()
            return
        database = self.database
        with psycopg.connect(database.server.url(database.name), password=database.server.password) as lock:
            lock.execute("LOCK TABLE alerts IN ACCESS EXCLUSIVE MODE")
            yield
            lock.rollback()

    def sql(self, *statements: str) -> list[tuple[object, ...]]:
        """Run ``statements`` on the stores' database from a session of the test's own (SQLite:
        the file, made if missing; Postgres: ``PostgresDatabase.connect``); the last one's rows."""
        rows: list[tuple[object, ...]] = []
        if self.database is None:
            with contextlib.closing(sqlite3.connect(self._tmp / "pitcrew.db", isolation_level=None)) as db:
                for statement in statements:
                    rows = db.execute(statement).fetchall()
            return rows
        with self.database.connect() as conn:
            for statement in statements:
                cursor = conn.execute(statement)
                rows = cursor.fetchall() if cursor.description else []
        return rows

    async def close(self) -> None:
        for store in reversed(self._opened):
            await store.close()
        self._opened.clear()


@pytest.fixture(params=KINDS)
async def stores(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Stores]:
    """Each store in turn; ``postgres-17`` (not in ``KINDS``, asked for by name): PostgreSQL 17,
    for what Debian 12's 15 lacks."""
    with contextlib.ExitStack() as stack:
        database: PostgresDatabase | None = None
        if request.param == "postgres-17":
            database = stack.enter_context(
                fresh_database(request.getfixturevalue("postgres17_server"), tmp_path)
            )
        elif request.param != "sqlite":
            database = request.getfixturevalue("postgres_db")
        if request.param == "pgbouncer":
            assert database is not None
            bouncer = request.getfixturevalue("pgbouncer")
            database = dataclasses.replace(database, url=bouncer.url(database.name))
        opened = Stores(request.param, tmp_path, database)
        try:
            yield opened
        finally:
            await opened.close()


def newer_schema(sqlite: bool, version: int, compatible: int | None) -> list[str]:
    """The statements that leave a store's schema record as a pitcrew of schema ``version`` leaves
    it: recording that a pitcrew written for ``compatible`` or later runs on it, or nothing
    (``None``, as a pitcrew before the record did). Its migrations are the caller's."""
    if sqlite:
        record = (
            "DELETE FROM pitcrew_schema"
            if compatible is None
            else f"UPDATE pitcrew_schema SET compatible_from = {compatible}"  # noqa: S608 - an int
        )
        return [f"PRAGMA user_version = {version}", record]
    value = "NULL" if compatible is None else str(compatible)
    return [f"UPDATE pitcrew_schema SET version = {version}, compatible_from = {value}"]  # noqa: S608 - ints


def before_guarded_indexes() -> list[str]:
    """The statements that take migration 9 back (``bot.store.schema``): no indexes for the
    breaker's count, the same on both databases. The schema's record is the caller's."""
    return ["DROP INDEX incidents_guarded", "DROP INDEX events_action"]


def before_check_function(sqlite: bool) -> list[str]:
    """The statements that take migration 8 back (``bot.store.schema``): no ``pitcrew_check`` on
    Postgres (nothing on SQLite). The schema's record is the caller's (``newer_schema``)."""
    return [] if sqlite else ["DROP FUNCTION pitcrew_check(boolean, integer)"]


def before_audit_column(sqlite: bool) -> list[str]:
    """The statements that take migration 7 back (``bot.store.schema``): no ``audit`` column on
    ``events``, and its delete guard refusing every delete, as an earlier pitcrew left it. The
    schema's record is the caller's (``newer_schema``)."""
    if sqlite:
        return [
            "DROP TRIGGER events_no_delete",
            "ALTER TABLE events DROP COLUMN audit",
            "CREATE TRIGGER events_no_delete BEFORE DELETE ON events"
            " BEGIN SELECT RAISE(ABORT, 'the audit log is append-only'); END",
        ]
    return [
        "DROP TRIGGER events_no_update ON events",
        "DROP FUNCTION pitcrew_events_prunable()",
        "ALTER TABLE events DROP COLUMN audit",
        "CREATE TRIGGER events_no_update BEFORE UPDATE OR DELETE ON events"
        " FOR EACH ROW EXECUTE FUNCTION pitcrew_append_only()",
    ]
