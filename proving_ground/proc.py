"""Helpers every proving-ground piece shares: free ports, waiting, stopping a child, log tails.

Owns the one error the proving ground raises (``DemoError``: a far side did not start, answer
or stop as expected) so ``scripts/demo`` can report it in one line and the tests can show it
with the logs attached. Nothing here imports pytest: the tests wrap these in their fixtures.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import os
import random
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TypeVar


class DemoError(RuntimeError):
    """A proving-ground process did not start, answer or stop as expected (the message says which)."""


def find_binary(name: str) -> str | None:
    """Path of ``name`` on PATH or in the sbin directories (daemons live there on Debian)."""
    return shutil.which(name) or shutil.which(name, path="/usr/sbin:/sbin:/usr/bin")


#: Where shared holds (``hold_port(shared=True)``) take their ports, and nothing else does. A
#: shared hold keeps out a bind without ``SO_REUSEADDR`` only: a server that sets the option
#: (PostgreSQL, the Slurm daemons, Prometheus, aiohttp) binds beside the hold and listens, and
#: pitcrew's own bind then fails (a CI run lost pitcrew's port so, to a server another worker
#: started on a port its ``free_ports`` had chosen a moment before). So the two never draw from
#: the same ports.
SHARED_PORTS = range(10000, 15000)


#: Where a port handed out to be bound later is claimed, one empty file per port, by every process
#: on this machine (test workers, the two CI shards, the demo): a port claimed less than
#: ``CLAIM_SECONDS`` ago is not handed out again. Between ``free_ports`` and the server's bind the
#: port is free, and another process's ``free_ports`` could choose it too: rare for one choice,
#: but a CI run makes hundreds of them in several processes at once.
CLAIMS = Path(tempfile.gettempdir()) / "pitcrew-ports"
CLAIM_SECONDS = 600.0
#: The claims made here (port: the claiming process, and the claim file's identity: device, inode,
#: and when it was made or last renewed), given up when that process exits (``_release``): its
#: servers are gone then, and the files no longer pile up in ``CLAIMS`` run after run (thousands on
#: a developer's machine). A claim another process took over once it was old is another file, or
#: at least another time, and is left alone.
_MINE: dict[int, tuple[int, tuple[int, int, int]]] = {}


def _identity(seen: os.stat_result) -> tuple[int, int, int]:
    return seen.st_dev, seen.st_ino, seen.st_mtime_ns


def _release() -> None:
    """At exit, remove the claims this process made that are still its own (not those of the
    process a child was forked from: it inherits ``_MINE`` and this handler)."""
    for port, (pid, made) in list(_MINE.items()):
        if pid != os.getpid():
            continue
        path = CLAIMS / str(port)
        with contextlib.suppress(OSError):
            if _identity(path.stat()) == made:
                path.unlink()
        del _MINE[port]


atexit.register(_release)


def _claims() -> bool:
    """Whether this process can claim in ``CLAIMS`` (made if missing); not where it is another
    user's: nobody there to coordinate with."""
    with contextlib.suppress(OSError):
        CLAIMS.mkdir(mode=0o1777, exist_ok=True)
    return os.access(CLAIMS, os.W_OK)


def _claim(port: int) -> bool:
    """Claim ``port`` for this process unless another claimed it less than ``CLAIM_SECONDS`` ago.
    Where ``CLAIMS`` cannot be written (``_claims``), every port is this process's to claim."""
    if not _claims():
        return True
    path = CLAIMS / str(port)
    try:
        if time.time() - path.stat().st_mtime >= CLAIM_SECONDS:
            path.unlink()  # an old claim: its server bound long ago or never will
    except FileNotFoundError:
        pass  # never claimed, or given up meanwhile
    except PermissionError:
        return False  # another user's claim, not ours to take over
    try:
        made = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
    except FileExistsError:
        return False  # claimed, or claimed again since it was old
    try:
        seen = os.fstat(made)
    finally:
        os.close(made)
    _MINE[port] = (os.getpid(), _identity(seen))
    return True


def renew_claims(*ports: int) -> None:
    """Claim ``ports`` afresh for ``CLAIM_SECONDS``: a server that stops to start again on its
    port (a Postgres or slurmctld restart) leaves it free meanwhile, long after it was chosen."""
    if _claims():
        for port in ports:
            path = CLAIMS / str(port)
            with contextlib.suppress(PermissionError):  # another user's claim: it holds meanwhile
                path.touch()
                _MINE[port] = (os.getpid(), _identity(path.stat()))  # this process's, to give up at exit


def _below_ephemeral() -> range:
    """Ports from the end of ``SHARED_PORTS`` to the kernel's ephemeral range: one handed out here
    is not taken meanwhile as the source port of some client connection (as a port the kernel picks
    for ``bind(0)`` can be), nor held for pitcrew."""
    try:
        low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        low = 32768
    return range(SHARED_PORTS.stop, max(low, SHARED_PORTS.stop + 1))


def free_ports(count: int) -> list[int]:
    """``count`` distinct TCP ports on 127.0.0.1 that were free a moment ago, below the ephemeral
    range and outside ``SHARED_PORTS``, chosen at random so that test processes starting servers at
    once rarely pick the same; all held at once while choosing, so one call never returns a port
    twice."""
    held: list[socket.socket] = []
    try:
        while len(held) < count:
            held.append(hold_port())  # a held port cannot be bound again: each is another
        return [int(sock.getsockname()[1]) for sock in held]
    finally:
        for sock in held:
            sock.close()


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago (``free_ports``)."""
    return free_ports(1)[0]


def hold_port(*, shared: bool = False) -> socket.socket:
    """A free port below the ephemeral range, chosen at random, kept bound (not listening) until
    the socket is closed: for a server that must be named in another's configuration long before it
    starts. While held, no other hold and no ``free_ports`` takes it (a CI run once lost
    Alertmanager's port to another test's server in the minute between choosing it and starting
    Alertmanager).

    ``shared``: held for a child that binds it itself with ``SO_REUSEADDR`` (pitcrew's listener,
    asyncio's default), while it is still held, and again after each restart. Bound first
    without the option, so the port is one nobody holds; the option set afterwards lets Linux bind
    a second ``SO_REUSEADDR`` socket beside this one (which never listens). So no window is left
    between choosing the port and the child's bind, nor between a kill and the next start (a CI run
    once lost pitcrew's port to another worker's server in the seconds its start spends importing
    before it binds). Any server that sets the option could bind beside it as well, so shared
    holds come from ``SHARED_PORTS``, where no other server's port is chosen.

    Not ``shared``: also claimed in ``CLAIMS``, since it is released for its server to bind."""
    ports = SHARED_PORTS if shared else _below_ephemeral()
    while True:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            sock.bind(("127.0.0.1", random.choice(ports)))
        except OSError:
            sock.close()
            continue
        if shared:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        elif not _claim(int(sock.getsockname()[1])):
            sock.close()  # another process's choice, to be bound in a moment
            continue
        return sock


def port_free(port: int, host: str = "127.0.0.1") -> bool:
    """Nobody listens on ``host:port`` (a clash the demo reports before it starts anything)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return False
        return True


def wait_until(
    predicate: Callable[[], bool], *, timeout: float, interval: float = 0.05, what: str = ""
) -> None:
    """Poll ``predicate`` until true; ``DemoError`` naming ``what`` on timeout."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(interval)
    raise DemoError(f"timed out after {timeout:.1f}s waiting for {what or predicate}")


T = TypeVar("T")


async def eventually(
    probe: Callable[[], Awaitable[T | None]], *, timeout: float, what: str, interval: float = 0.1
) -> T:
    """Await ``probe`` until it returns something other than ``None``/``False``; return that.
    ``DemoError`` naming ``what`` on timeout (``wait_until``'s twin for the event loop)."""
    deadline = time.monotonic() + timeout
    while True:
        value = await probe()
        if value is not None and value is not False:
            return value
        if time.monotonic() > deadline:
            raise DemoError(f"timed out after {timeout:.1f}s waiting for {what}")
        await asyncio.sleep(interval)


def stop_process(proc: subprocess.Popen[bytes], *, timeout: float = 10.0) -> None:
    """SIGTERM, then SIGKILL after ``timeout``; always reaps the child."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=5)


def tail(path: Path, lines: int = 40) -> str:
    """Last lines of a log file, for failure messages."""
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return f"(no {path})"
