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
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest

from proving_ground.postgres import MISSING, PostgresServer, bindir
from proving_ground.postgres import running_postgres as _running
from proving_ground.proc import DemoError
from tests.harness.proc import in_ci


def require_postgres() -> Path:
    found = bindir()
    if found is not None:
        return found
    if in_ci():
        pytest.fail(MISSING)
    pytest.skip(MISSING)


@contextlib.contextmanager
def running_postgres(networks: Sequence[str] = ()) -> Iterator[PostgresServer]:
    """The proving ground's cluster (also on ``networks``' addresses), skipped (or failed under
    CI) without PostgreSQL, failed when it will not start."""
    require_postgres()
    try:
        with _running(networks=networks) as server:
            yield server
    except DemoError as exc:
        pytest.fail(str(exc))


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
    password_file = postgres_server.password_file(tmp_path / "postgres-password")
    try:
        yield PostgresDatabase(postgres_server.url(name), password_file, name, postgres_server)
    finally:
        postgres_server.drop_database(name)
