"""A real PgBouncer in front of the session's PostgreSQL: the connection pooler sites put there.

CloudNativePG's ``Pooler``, managed Postgres services and many sites' own set-ups put PgBouncer
between their applications and Postgres, often in its *transaction* mode: a client holds a server
session only for one transaction, the next may run on another, and a session's settings or a
statement prepared on the server do not follow it. ``pgbouncer`` (session) runs Debian's
``pgbouncer`` in that mode on a free loopback port, with fewer server sessions than pitcrew's pool
opens connections (so its transactions really do change sessions), as an unprivileged user (it
will not run as root), with SCRAM authentication for the clients and towards Postgres. Stopped and
its directory removed at session end. Missing, it skips the tests that need it, or fails them
under ``CI=true``.
"""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psycopg
import pytest

from proving_ground.postgres import USER, PostgresServer, as_user, unprivileged
from proving_ground.proc import DemoError, free_port, tail, wait_until
from tests.harness.proc import require_binary

#: Server sessions per database and user: under pitcrew's pool (10) and its writes' connections.
POOL_SIZE = 3


@dataclass(frozen=True)
class Bouncer:
    port: int
    log: Path

    def url(self, database: str) -> str:
        """A libpq URL of ``database`` through the pooler (the password goes in a file)."""
        return f"postgresql://{USER}@127.0.0.1:{self.port}/{database}"


@contextlib.contextmanager
def running_pgbouncer(server: PostgresServer) -> Iterator[Bouncer]:
    binary = require_binary("pgbouncer", "pgbouncer (scripts/setup dev)")
    directory = Path(tempfile.mkdtemp(prefix="pitcrew-pgbouncer-"))
    port, log = free_port(), directory / "pgbouncer.log"
    users, config = directory / "users.txt", directory / "pgbouncer.ini"
    users.write_text(f'"{USER}" "{server.password}"\n')
    config.write_text(
        "[databases]\n"
        f"* = host=127.0.0.1 port={server.port}\n"
        "[pgbouncer]\n"
        f"listen_addr = 127.0.0.1\nlisten_port = {port}\nunix_socket_dir =\n"
        f"auth_type = scram-sha-256\nauth_file = {users}\n"
        f"pool_mode = transaction\ndefault_pool_size = {POOL_SIZE}\nmax_client_conn = 500\n"
        f"logfile = {log}\n"
    )
    user = unprivileged(directory, users, config)  # PgBouncer will not run as root either
    proc = subprocess.Popen(
        as_user(user, [binary, str(config)]),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    bouncer = Bouncer(port, log)

    def answers() -> bool:
        if proc.poll() is not None:
            raise DemoError(f"PgBouncer exited with {proc.returncode}\n{tail(log) if log.exists() else ''}")
        try:
            psycopg.connect(bouncer.url("postgres"), password=server.password, connect_timeout=2).close()
        except psycopg.OperationalError:
            return False
        return True

    try:
        wait_until(answers, timeout=30, what=f"PgBouncer on 127.0.0.1:{port}")
        yield bouncer
    except DemoError as exc:
        pytest.fail(str(exc))
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)
        shutil.rmtree(directory, ignore_errors=True)


@pytest.fixture(scope="session")
def pgbouncer(postgres_server: PostgresServer) -> Iterator[Bouncer]:
    with running_pgbouncer(postgres_server) as bouncer:
        yield bouncer
