"""A real PostgreSQL for the tests: the proving ground's throwaway cluster, one per session.

``postgres_server`` (session) is ``proving_ground.postgres.running_postgres``: Debian's
``postgresql`` as an unprivileged user on a free loopback port in a temporary directory, stopped
and removed at session end. Missing binaries skip the tests that need them, or fail them under
``CI=true`` (``tests.harness.proc``).

``postgres_db`` (function) is a fresh, empty database for one test (``CREATE DATABASE``, copied
from ``template1`` by the server: a few milliseconds), and its password file.
"""

from __future__ import annotations

import contextlib
import shutil
import subprocess
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg.rows import DictRow, TupleRow, dict_row

from proving_ground.postgres import (
    USER,
    Install,
    PostgresServer,
    installed,
    missing,
    pg_ctl_runner,
    unprivileged,
)
from proving_ground.postgres import running_postgres as _running
from proving_ground.proc import DemoError, free_port, tail, wait_until
from tests.harness.proc import unavailable


def require_postgres(major: str | None = None) -> Install:
    found = installed(major)
    if found is not None:
        return found
    unavailable(missing(major))


@contextlib.contextmanager
def running_postgres(
    networks: Sequence[str] = (), *, durable: bool = False, major: str | None = None
) -> Iterator[PostgresServer]:
    """The proving ground's cluster (also on ``networks``' addresses; with PostgreSQL's own
    durability if ``durable``; ``major``: which, ``proving_ground.postgres.installed``), skipped
    (or failed under CI) without PostgreSQL, failed when it will not start."""
    require_postgres(major)
    try:
        with _running(networks=networks, durable=durable, major=major) as server:
            yield server
    except DemoError as exc:
        pytest.fail(str(exc))


@dataclass(frozen=True)
class Standby:
    """A hot standby of a running cluster (``primary``), streaming its WAL on ``127.0.0.1:port``."""

    primary: PostgresServer
    port: int
    directory: Path
    _pg_ctl: Callable[[list[str]], None]

    def url(self, database: str, *ports: int, read_write: bool = True) -> str:
        """A libpq URL of ``database`` listing the servers on ``ports`` in that order (the pair's,
        the primary's or this one's), with ``target_session_attrs=read-write`` if ``read_write``."""
        hosts = ",".join(f"127.0.0.1:{port}" for port in ports)
        query = "?target_session_attrs=read-write" if read_write else ""
        return f"postgresql://{USER}@{hosts}/{database}{query}"

    def synchronous(self) -> None:
        """From now on the primary waits for this standby's flush before a commit returns."""
        with self.primary.connect() as conn:
            conn.execute("ALTER SYSTEM SET synchronous_standby_names = '*'")
            conn.execute("SELECT pg_reload_conf()")

            def synchronous() -> bool:
                row = conn.execute("SELECT sync_state FROM pg_stat_replication").fetchone()
                return row is not None and row[0] == "sync"

            wait_until(synchronous, timeout=30, what=f"the standby on 127.0.0.1:{self.port} synchronous")

    def promote(self) -> None:
        """What a failover does to it: it stops following, and takes writes."""
        self._pg_ctl(["-w", "promote"])


@contextlib.contextmanager
def running_standby(primary: PostgresServer) -> Iterator[Standby]:
    """A streaming standby of ``primary``, as a site's failover pair has (CloudNativePG's replicas,
    Patroni's): ``pg_basebackup -R`` over the primary's own socket (trust, as its replication
    line in ``pg_hba.conf`` says), started on a free loopback port as the primary's user, and
    stopped and removed on exit. Its roles and password are the primary's."""
    install = require_postgres()
    directory = install.workdir("pitcrew-pg-standby-")
    data, log = directory / "data", directory / "postgres.log"
    user = unprivileged(directory)
    port = free_port()
    # max_connections as the primary's (a standby refuses to recover with fewer).
    options = (
        f"-c listen_addresses=127.0.0.1 -c port={port}"
        f" -c unix_socket_directories={install.seen(directory)} -c max_connections=200"
    )
    pg_ctl = pg_ctl_runner(install, data, log, options, user)
    backup = install.argv(
        user,
        "pg_basebackup",
        *("-h", install.seen(primary.directory), "-p", str(primary.port), "-U", USER),
        *("-D", install.seen(data), "-R", "-X", "stream", "--no-sync", "-c", "fast"),
    )
    started = False
    try:
        try:
            subprocess.run(backup, check=True, capture_output=True, timeout=120)
            started = True
            pg_ctl(["-w", "start"])
        except subprocess.CalledProcessError as exc:
            output = exc.stderr.decode(errors="replace")
            pytest.fail(f"the standby did not start: {output}\n{tail(log) if log.exists() else ''}")

        def streaming() -> bool:
            with primary.connect() as conn:
                row = conn.execute(
                    "SELECT count(*) FROM pg_stat_replication WHERE state = 'streaming'"
                ).fetchone()
            return row is not None and row[0] == 1

        wait_until(streaming, timeout=30, what=f"the standby on 127.0.0.1:{port} streaming")
        yield Standby(primary, port, directory, pg_ctl)
    finally:
        if started:
            with contextlib.suppress(subprocess.CalledProcessError, subprocess.TimeoutExpired):
                pg_ctl(["-m", "immediate", "-w", "stop"])
        shutil.rmtree(directory, ignore_errors=True)


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[PostgresServer]:
    with running_postgres() as server:
        yield server


@dataclass(frozen=True)
class PostgresDatabase:
    """A fresh database of the session's cluster: its URL and a file holding the password."""

    url: str
    password_file: Path
    name: str
    server: PostgresServer

    def connect(self) -> psycopg.Connection[TupleRow]:
        """The test's own session on this database: the cluster's superuser, autocommit."""
        return self.server.connect(self.name)

    def limits(self) -> tuple[str, ...]:
        """The limits a site may set on its sessions that this server has: ``statement_timeout``,
        ``lock_timeout`` and, from PostgreSQL 17, ``transaction_timeout``."""
        with self.connect() as conn:
            newer = conn.info.server_version >= 170000
        return ("statement_timeout", "lock_timeout", *(("transaction_timeout",) if newer else ()))

    def limit(self, milliseconds: int) -> tuple[str, ...]:
        """Every one of ``limits`` set to ``milliseconds`` on every new session of the database, as
        a site's guard on its application's database or role; their names."""
        limits = self.limits()
        with self.connect() as conn:
            for setting in limits:
                conn.execute(f'ALTER DATABASE "{self.name}" SET {setting} = {milliseconds}')
        return limits

    @contextlib.contextmanager
    def login_role(self, name: str, password: str) -> Iterator[str]:
        """A login role of the test's own, ``password`` its password: this database's URL as that
        role. Afterwards what it owns (this database too, if given it) goes back to the superuser,
        what it was granted goes, and the role is dropped (roles are the whole cluster's)."""
        with self.connect() as db:
            db.execute(f"CREATE ROLE {name} LOGIN PASSWORD '{password}'")
        try:
            yield self.url.replace(f"//{USER}@", f"//{name}@")
        finally:
            with self.connect() as db:
                db.execute(f"REASSIGN OWNED BY {name} TO {USER}")
                db.execute(f"DROP OWNED BY {name}")
                db.execute(f"DROP ROLE {name}")

    @contextlib.contextmanager
    def store_role(self, name: str, password: str) -> Iterator[tuple[str, Path]]:
        """``login_role``, allowed all a store does on this database (connect, create its tables in
        ``public``): its URL and a file holding its password, beside the superuser's."""
        with self.login_role(name, password) as url:
            with self.connect() as db:
                db.execute(f"GRANT ALL ON DATABASE {self.name} TO {name}")
                db.execute(f"GRANT ALL ON SCHEMA public TO {name}")
            password_file = self.password_file.with_name(f"{name}-password")
            password_file.write_text(f"{password}\n")
            yield url, password_file


@pytest.fixture(scope="session")
def postgres17_server() -> Iterator[PostgresServer]:
    """PostgreSQL 17 from the root ``scripts/setup`` makes, for what Debian 12's 15 lacks
    (``transaction_timeout``): started when a test first asks for it."""
    with running_postgres(major="17") as server:
        yield server


@contextlib.contextmanager
def fresh_database(server: PostgresServer, tmp_path: Path) -> Iterator[PostgresDatabase]:
    """A new database of ``server`` and its password file, dropped afterwards."""
    name = server.create_database()
    password_file = server.password_file(tmp_path / "postgres-password")
    try:
        yield PostgresDatabase(server.url(name), password_file, name, server)
    finally:
        server.drop_database(name)


@pytest.fixture
def postgres_db(postgres_server: PostgresServer, tmp_path: Path) -> Iterator[PostgresDatabase]:
    with fresh_database(postgres_server, tmp_path) as database:
        yield database


class CountedConnection(psycopg.AsyncConnection[DictRow]):
    """A connection that keeps each message it sends (one ``execute``, one simple query)."""

    sent: list[str]

    async def execute(self, query: Any, params: Any = None, **kwargs: Any) -> Any:
        self.sent.append(str(query))
        return await super().execute(query, params, **kwargs)


def whole(message: str) -> bool:
    """Whether ``message`` (a ``CountedConnection``'s) is a whole transaction in one simple query:
    the server's implicit transaction, with neither ``BEGIN`` nor ``COMMIT``
    (``bot.store.postgres._Message.send``)."""
    statements = {statement.strip() for statement in message.split(";")}
    return not statements & {"BEGIN", "COMMIT"}


@contextlib.asynccontextmanager
async def counted_connection(database: PostgresDatabase) -> AsyncIterator[CountedConnection]:
    """A ``CountedConnection`` to ``database`` (autocommit, rows as dicts), closed afterwards."""
    password = database.password_file.read_text().strip()
    conn = await CountedConnection.connect(
        database.url, password=password, autocommit=True, row_factory=dict_row
    )
    conn.sent = []
    async with conn:
        yield conn
