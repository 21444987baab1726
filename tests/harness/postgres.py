"""A real PostgreSQL for the tests: Debian's ``postgresql`` (15), a throwaway cluster per session.

``postgres_server`` (session) runs ``initdb`` and ``pg_ctl`` from ``/usr/lib/postgresql/<v>/bin``
as an unprivileged user (PostgreSQL refuses to run as root, and CI runs as root: there the
cluster runs as ``nobody``), in a temporary directory that user owns, listening on a free
loopback port only (no Unix socket outside the directory), with password authentication for TCP
(so ``store.password_file`` is exercised) and trust for its own socket. It is stopped and its
directory removed at session end, whatever happened in between.

``postgres_url`` (function) is a fresh, empty database for one test (``CREATE DATABASE``, copied
from ``template1`` by the server: a few milliseconds), and its password file. Missing binaries
skip the tests that need them, or fail them under ``CI=true`` (``tests.harness.proc``).
"""

from __future__ import annotations

import contextlib
import itertools
import os
import pwd
import secrets
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import psycopg
import pytest

from proving_ground.proc import free_port, tail
from tests.harness.proc import in_ci, wait_until

VERSIONS = ("17", "16", "15")  # newest first: Debian 12 ships 15
USER = "pitcrew"


def _bindir() -> Path | None:
    for version in VERSIONS:
        bindir = Path(f"/usr/lib/postgresql/{version}/bin")
        if (bindir / "initdb").exists() and (bindir / "pg_ctl").exists():
            return bindir
    return None


def require_postgres() -> Path:
    bindir = _bindir()
    if bindir is not None:
        return bindir
    message = "PostgreSQL server binaries not found: apt-get install postgresql (scripts/setup dev)"
    if in_ci():
        pytest.fail(message)
    pytest.skip(message)


@dataclass
class PostgresServer:
    """One running cluster: superuser ``pitcrew`` with ``password`` on ``127.0.0.1:port``."""

    port: int
    password: str
    directory: Path
    _names: Iterator[int] = field(default_factory=lambda: itertools.count(1))
    #: Runs ``pg_ctl`` with the given arguments against this cluster, as its owner.
    _pg_ctl: Callable[[list[str]], None] | None = None

    def url(self, database: str = "postgres") -> str:
        """A libpq URL without the password (it goes in the password file)."""
        return f"postgresql://{USER}@127.0.0.1:{self.port}/{database}"

    def connect(self, database: str = "postgres") -> psycopg.Connection[tuple[object, ...]]:
        return psycopg.connect(self.url(database), password=self.password, autocommit=True)

    def create_database(self) -> str:
        name = f"t{os.getpid()}_{next(self._names)}"
        with self.connect() as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        return name

    def stop(self) -> None:
        """Shut the server down as an operator's ``pg_ctl stop`` does (``fast``: every session
        ended, open transactions rolled back); ``start`` brings it back on the same port."""
        assert self._pg_ctl is not None
        self._pg_ctl(["-m", "fast", "-w", "stop"])

    def start(self) -> None:
        assert self._pg_ctl is not None
        self._pg_ctl(["-w", "start"])

    def drop_database(self, name: str) -> None:
        with self.connect() as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def _as(user: str | None, argv: list[str]) -> list[str]:
    return ["runuser", "-u", user, "--", *argv] if user else argv


@contextlib.contextmanager
def running_postgres() -> Iterator[PostgresServer]:
    """Start a throwaway cluster; stop it and remove its files on exit, even after a failure."""
    bindir = require_postgres()
    # PostgreSQL will not run as root: run it as nobody then (the directory is chowned to it).
    user = "nobody" if os.geteuid() == 0 else None
    directory = Path(tempfile.mkdtemp(prefix="pitcrew-pg-"))
    data, log = directory / "data", directory / "postgres.log"
    password = secrets.token_urlsafe(16)
    pwfile = directory / "pwfile"
    pwfile.write_text(password + "\n")
    if user is not None:
        entry = pwd.getpwnam(user)
        for path in (directory, pwfile):
            os.chown(path, entry.pw_uid, entry.pw_gid)
    port = free_port()
    started = False
    try:
        subprocess.run(
            _as(
                user,
                [
                    str(bindir / "initdb"),
                    "-D",
                    str(data),
                    "-U",
                    USER,
                    f"--pwfile={pwfile}",
                    "--auth-host=scram-sha-256",
                    "--auth-local=trust",
                    "--encoding=UTF8",
                    "--locale=C",
                    "--no-sync",
                ],
            ),
            check=True,
            capture_output=True,
            timeout=120,
        )
        pwfile.unlink()
        options = (
            f"-c listen_addresses=127.0.0.1 -c port={port} -c unix_socket_directories={directory}"
            " -c fsync=off -c synchronous_commit=off -c full_page_writes=off -c max_connections=200"
        )
        started = True
        subprocess.run(
            _as(
                user, [str(bindir / "pg_ctl"), "-D", str(data), "-l", str(log), "-o", options, "-w", "start"]
            ),
            check=True,
            capture_output=True,
            timeout=120,
        )

        def pg_ctl(arguments: list[str]) -> None:
            argv = [str(bindir / "pg_ctl"), "-D", str(data), "-l", str(log), "-o", options, *arguments]
            subprocess.run(_as(user, argv), check=True, capture_output=True, timeout=120)

        server = PostgresServer(port, password, directory, _pg_ctl=pg_ctl)

        def answers() -> bool:
            try:
                server.connect().close()
            except psycopg.OperationalError:
                return False
            return True

        wait_until(answers, timeout=30, what=f"PostgreSQL on 127.0.0.1:{port}")
        yield server
    except subprocess.CalledProcessError as exc:
        pytest.fail(f"PostgreSQL did not start: {exc.stderr.decode(errors='replace')}\n{_tail(log)}")
    finally:
        if started:
            subprocess.run(
                _as(user, [str(bindir / "pg_ctl"), "-D", str(data), "-m", "immediate", "-w", "stop"]),
                capture_output=True,
                timeout=60,
                check=False,
            )
        shutil.rmtree(directory, ignore_errors=True)


def _tail(log: Path) -> str:
    return tail(log) if log.exists() else ""


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


@pytest.fixture
def postgres_db(postgres_server: PostgresServer, tmp_path: Path) -> Iterator[PostgresDatabase]:
    name = postgres_server.create_database()
    password_file = tmp_path / "postgres-password"
    password_file.write_text(postgres_server.password + "\n")
    password_file.chmod(0o600)
    try:
        yield PostgresDatabase(postgres_server.url(name), password_file, name, postgres_server)
    finally:
        postgres_server.drop_database(name)
