"""A throwaway PostgreSQL cluster: Debian's ``postgresql`` (15), or a newer major from a Debian
root, for the demo and the tests.

``running_postgres`` runs ``initdb`` and ``pg_ctl`` from ``/usr/lib/postgresql/<v>/bin`` as an
unprivileged user (PostgreSQL refuses to run as root: as root the cluster runs as ``nobody``), in
a temporary directory that user owns, listening on a free loopback port only (no Unix socket
outside the directory), with password authentication for TCP (so ``store.password_file`` is
exercised) and trust for its own socket. It is stopped and its directory removed on exit,
whatever happened in between. ``scripts/demo --store postgres`` runs pitcrew on one; the tests'
fixtures (``tests.harness.postgres``) start one per session.

Sites run newer majors than Debian 12's (CloudNativePG's default is 18 since its 1.27.2), which
have settings 15 lacks (17's ``transaction_timeout``). ``installed("17")`` is PostgreSQL 17 from the
Debian 13 root ``scripts/setup`` makes (``slurm_root.roots()/postgres-17``), its programs
run under chroot (as root only) with the cluster's directory inside the root; ``"18"`` is 18 from
a Debian unstable root, made when ``PITCREW_POSTGRES_ROOTS="17 18"``. ``PITCREW_POSTGRES=17`` (or
18) makes it the default of the demo and of a whole test session.
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
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from ipaddress import ip_interface
from pathlib import Path

import psycopg
from psycopg.rows import TupleRow

from proving_ground.proc import DemoError, free_port, renew_claims, tail, wait_until
from proving_ground.slurm_root import roots

VERSIONS = ("17", "16", "15")  # newest first: Debian 12 ships 15
#: The majors of the Debian roots ``scripts/setup`` makes, each under ``roots()/postgres-<major>``.
ROOTED = ("17", "18")
#: The major a test session, the demo and the benches run when none is asked for.
MAJOR_ENV = "PITCREW_POSTGRES"
USER = "pitcrew"
MISSING = "PostgreSQL server binaries not found: apt-get install postgresql (scripts/setup dev)"


@dataclass(frozen=True)
class Install:
    """Where one PostgreSQL's server programs are (``bin``, as they see it), and the Debian root
    they run in under chroot (``None``: this machine's own)."""

    bin: Path
    root: Path | None = None

    def workdir(self, prefix: str) -> Path:
        """A new temporary directory the programs can reach (inside the root, if any)."""
        return Path(tempfile.mkdtemp(prefix=prefix, dir=self.root / "tmp" if self.root else None))

    def seen(self, path: Path) -> str:
        """``path`` of this machine as the programs see it."""
        return f"/{path.relative_to(self.root)}" if self.root else str(path)

    def argv(self, user: str | None, program: str, *arguments: str) -> list[str]:
        """``program`` with ``arguments`` (paths already ``seen``), run as ``user``
        (``unprivileged``; ``None``: this process's own)."""
        command = [str(self.bin / program), *arguments]
        if self.root is None:
            return as_user(user, command)
        if os.geteuid() != 0:
            raise DemoError(f"PostgreSQL from the root {self.root} runs under chroot: run as root")
        entry = pwd.getpwnam(user or "root")
        return ["chroot", f"--userspec={entry.pw_uid}:{entry.pw_gid}", str(self.root), *command]


def installed(major: str | None = None) -> Install | None:
    """The PostgreSQL to run: ``major`` (default ``$PITCREW_POSTGRES``) from its Debian root
    (``ROOTED``), or this machine's newest (``VERSIONS``); ``None``: not there."""
    major = _major(major)
    if major in ROOTED:
        root = roots() / f"postgres-{major}"
        inside = Path(f"/usr/lib/postgresql/{major}/bin")
        found = root / inside.relative_to("/")
        if (found / "initdb").exists() and (found / "pg_ctl").exists():
            return Install(inside, root)
        return None
    for version in (major,) if major else VERSIONS:
        found = Path(f"/usr/lib/postgresql/{version}/bin")
        if (found / "initdb").exists() and (found / "pg_ctl").exists():
            return Install(found)
    return None


def missing(major: str | None = None) -> str:
    """What to do when ``installed(major)`` is ``None``."""
    major = _major(major)
    if major in ROOTED:
        asked = "" if major == "17" else f' with PITCREW_POSTGRES_ROOTS="17 {major}"'
        return f"no PostgreSQL {major} root at {roots()}/postgres-{major}: run scripts/setup as root{asked}"
    return MISSING


def _major(major: str | None) -> str | None:
    """``major``, else ``$PITCREW_POSTGRES``, else ``None`` (this machine's newest)."""
    return major or os.environ.get(MAJOR_ENV) or None


@dataclass
class PostgresServer:
    """One running cluster: superuser ``pitcrew`` with ``password`` on ``127.0.0.1:port``."""

    port: int
    password: str
    directory: Path
    _names: Iterator[int] = field(default_factory=lambda: itertools.count(1))
    #: Runs ``pg_ctl`` with the given arguments against this cluster, as its owner.
    _pg_ctl: Callable[[list[str]], None] | None = None

    def url(self, database: str = "postgres", host: str = "127.0.0.1") -> str:
        """A libpq URL without the password (it goes in the password file); ``host``: one of the
        addresses it listens on."""
        return f"postgresql://{USER}@{host}:{self.port}/{database}"

    def connect(self, database: str = "postgres") -> psycopg.Connection[TupleRow]:
        return psycopg.connect(self.url(database), password=self.password, autocommit=True)

    def create_database(self, encoding: str | None = None) -> str:
        """A new database; ``encoding``: another than the cluster's (C collation, from template0)."""
        name = f"t{os.getpid()}_{next(self._names)}"
        other = f" ENCODING '{encoding}' LC_COLLATE 'C' LC_CTYPE 'C' TEMPLATE template0" if encoding else ""
        with self.connect() as conn:
            conn.execute(f'CREATE DATABASE "{name}"{other}')
        return name

    def password_file(self, path: Path) -> Path:
        """Write the password to ``path`` (mode 0600), for ``store.password_file``."""
        path.write_text(self.password + "\n")
        path.chmod(0o600)
        return path

    def stop(self, mode: str = "fast") -> None:
        """Shut the server down as an operator's ``pg_ctl stop`` does (``fast``: every session
        ended, open transactions rolled back; ``immediate``: at once, as when its node dies, with
        crash recovery at the next start); ``start`` brings it back on the same port."""
        assert self._pg_ctl is not None
        renew_claims(self.port)  # free until ``start``: no other server's choice meanwhile
        self._pg_ctl(["-m", mode, "-w", "stop"])

    def start(self) -> None:
        assert self._pg_ctl is not None
        self._pg_ctl(["-w", "start"])

    def drop_database(self, name: str) -> None:
        with self.connect() as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def unprivileged(*paths: Path) -> str | None:
    """The user a server that will not run as root runs as (PostgreSQL, PgBouncer): ``nobody``
    when this process is root, ``paths`` handed to it; else ``None``, this process's own user."""
    if os.geteuid() != 0:
        return None
    entry = pwd.getpwnam("nobody")
    for path in paths:
        os.chown(path, entry.pw_uid, entry.pw_gid)
    return "nobody"


def as_user(user: str | None, argv: list[str]) -> list[str]:
    """``argv`` run as ``user`` (``unprivileged``), or as it is for ``None``."""
    return ["runuser", "-u", user, "--", *argv] if user else argv


def pg_ctl_runner(
    install: Install, data: Path, log: Path, options: str, user: str | None
) -> Callable[[list[str]], None]:
    """Runs ``pg_ctl`` with the given arguments against the cluster in ``data`` (its log in
    ``log``, its server started with ``options``), as ``user`` (``unprivileged``)."""

    def pg_ctl(arguments: list[str]) -> None:
        where = ["-D", install.seen(data), "-l", install.seen(log), "-o", options]
        argv = install.argv(user, "pg_ctl", *where, *arguments)
        subprocess.run(argv, check=True, capture_output=True, timeout=120)

    return pg_ctl


@contextlib.contextmanager
def running_postgres(
    *, durable: bool = False, networks: Sequence[str] = (), major: str | None = None
) -> Iterator[PostgresServer]:
    """Start a throwaway cluster; stop it and remove its files on exit, even after a failure.
    ``DemoError`` when PostgreSQL is not installed or will not start. Without ``durable`` it
    skips fsync (tests and the demo lose nothing by it); a benchmark of durable commits asks for
    PostgreSQL's defaults. ``networks`` (``"10.213.0.1/24"``: this machine's address on a private
    test network, and its prefix): it listens on that address too and lets that network's
    clients in with the password. ``major``: which PostgreSQL (``installed``)."""
    interfaces = [ip_interface(n) for n in networks]
    install = installed(major)
    if install is None:
        raise DemoError(missing(major))
    directory = install.workdir("pitcrew-pg-")
    data, log = directory / "data", directory / "postgres.log"
    password = secrets.token_urlsafe(16)
    pwfile = directory / "pwfile"
    pwfile.write_text(password + "\n")
    # PostgreSQL will not run as root: run it as nobody then (the directory is chowned to it).
    user = unprivileged(directory, pwfile)
    port = free_port()
    listen = ",".join(["127.0.0.1", *(str(i.ip) for i in interfaces)])
    options = (
        f"-c listen_addresses={listen} -c port={port}"
        f" -c unix_socket_directories={install.seen(directory)} -c max_connections=200"
    )
    if not durable:
        options += " -c fsync=off -c synchronous_commit=off -c full_page_writes=off"
    pg_ctl = pg_ctl_runner(install, data, log, options, user)
    started = False
    try:
        initdb = install.argv(
            user,
            "initdb",
            *("-D", install.seen(data), "-U", USER, f"--pwfile={install.seen(pwfile)}"),
            *("--auth-host=scram-sha-256", "--auth-local=trust", "--encoding=UTF8", "--locale=C"),
            "--no-sync",
        )
        subprocess.run(initdb, check=True, capture_output=True, timeout=120)
        pwfile.unlink()
        if interfaces:
            with (data / "pg_hba.conf").open("a") as hba:
                hba.writelines(f"host all all {i.network} scram-sha-256\n" for i in interfaces)
        started = True
        pg_ctl(["-w", "start"])
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
        raise DemoError(
            f"PostgreSQL did not start: {exc.stderr.decode(errors='replace')}\n{_tail(log)}"
        ) from exc
    finally:
        if started:
            with contextlib.suppress(subprocess.CalledProcessError, subprocess.TimeoutExpired):
                pg_ctl(["-m", "immediate", "-w", "stop"])
        shutil.rmtree(directory, ignore_errors=True)


def _tail(log: Path) -> str:
    return tail(log) if log.exists() else ""
