"""Connection limits against a real ``pitcrew serve`` on loopback, with few open files.

Cases: with the process's open-files limit at the usual 1,024, 1,100 idle connections that
never send a byte (which used to delay a webhook by seconds and write thousands of accept-error
lines) do not keep Alertmanager out — its webhook is answered 200 — and the server ends holding
at most its cap (512) of them, having closed the longest idle; ``accept()`` never runs out of
descriptors and the log stays short. A connection that has sent no valid
credential is closed once idle for ``server.unauthenticated_idle``, one that sent an
unauthenticated request too, while an authenticated keep-alive connection stays open and
usable.
"""

from __future__ import annotations

import contextlib
import errno
import json
import resource
import socket
import sys
from collections.abc import Iterator
from typing import Any

from bot.web.limits import effective_cap
from tests.harness.pitcrew import Pitcrew
from tests.harness.proc import wait_until
from tests.harness.scenarios import delivery

#: The usual default, unless this process may not hold more idle sockets than that.
OPEN_FILES = 1024 if resource.getrlimit(resource.RLIMIT_NOFILE)[1] >= 1300 else 512
CAP = effective_cap(512, OPEN_FILES)  # server.max_connections' default: 512 with 1,024 files
IDLE = OPEN_FILES + 76
#: Start pitcrew serve as the shell would with `ulimit -n 1024`.
LIMITED = (
    "import resource, sys\n"
    f"resource.setrlimit(resource.RLIMIT_NOFILE, ({OPEN_FILES}, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))\n"
    "from bot.cli import main\n"
    "sys.exit(main(sys.argv[1:]))\n"
)


def _serve(factory: Any, name: str, **server: Any) -> Pitcrew:
    pitcrew: Pitcrew = factory(name, simulated=False, config={"server": server})
    pitcrew.argv = [sys.executable, "-c", LIMITED, *pitcrew.argv[3:]]  # after "-m bot.cli"
    return pitcrew.start()


@contextlib.contextmanager
def _idle_sockets(port: int, count: int) -> Iterator[list[socket.socket]]:
    """``count`` connections to ``port`` that never send a byte, made one after the other (all at
    once would overflow the accept queue, and the kernel would hold their SYNs back for a minute)."""
    needed = count + 64
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < needed:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(needed, hard), hard))
    sockets: list[socket.socket] = []
    try:
        for _ in range(count):
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sockets.append(sock)
            sock.settimeout(10)
            sock.connect(("127.0.0.1", port))
            sock.setblocking(False)
        yield sockets
    finally:
        for sock in sockets:
            sock.close()


def _closed_by_peer(sock: socket.socket) -> bool:
    try:
        return sock.recv(1) == b""
    except (BlockingIOError, InterruptedError):
        return False
    except OSError as exc:
        return exc.errno in {errno.ECONNRESET, errno.EPIPE, errno.ENOTCONN}


def _log_lines(server: Pitcrew, logger: str) -> list[dict[str, Any]]:
    lines = []
    for raw in server.log.read_text(errors="replace").splitlines():
        with contextlib.suppress(ValueError):
            entry = json.loads(raw)
            if isinstance(entry, dict) and entry.get("logger") == logger:
                lines.append(entry)
    return lines


def test_idle_connections_do_not_keep_the_webhook_out(pitcrew_factory: Any) -> None:
    # Strangers may idle a whole minute: what lets the webhook in is the cap, not a timeout.
    server = _serve(pitcrew_factory, "flood", unauthenticated_idle="60s")
    with _idle_sockets(server.port, IDLE) as idle:
        status, body = server.post_alerts(delivery(node="gpu-node-01"))
        assert status == 200 and body["opened"], body
        wait_until(
            lambda: sum(not _closed_by_peer(s) for s in idle) <= CAP,
            timeout=60,
            what=f"the server holding at most {CAP} of {IDLE} idle connections",
        )
    assert _log_lines(server, "asyncio") == []  # accept() never ran out of descriptors
    lines = server.log.read_text(errors="replace").splitlines()
    assert len(lines) < 50, lines[-20:]


def _request(sock: socket.socket, path: str, token: str | None = None) -> bytes:
    auth = f"Authorization: Bearer {token}\r\n" if token else ""
    sock.sendall(f"GET {path} HTTP/1.1\r\nHost: pitcrew\r\n{auth}\r\n".encode())
    head = b""
    while b"\r\n\r\n" not in head:
        head += sock.recv(65536)
    header, _, body = head.partition(b"\r\n\r\n")
    length = next(
        int(line.split(b":", 1)[1])
        for line in header.split(b"\r\n")
        if line.lower().startswith(b"content-length")
    )
    while len(body) < length:
        body += sock.recv(65536)
    return header.split(b"\r\n", 1)[0]


def test_idle_strangers_are_closed_and_authenticated_peers_kept(pitcrew_factory: Any) -> None:
    server = _serve(pitcrew_factory, "idle", unauthenticated_idle="1s")
    silent = socket.create_connection(("127.0.0.1", server.port), timeout=30)
    anonymous = socket.create_connection(("127.0.0.1", server.port), timeout=30)
    reader = socket.create_connection(("127.0.0.1", server.port), timeout=30)
    try:
        assert _request(anonymous, "/healthz") == b"HTTP/1.1 200 OK"
        assert _request(reader, "/api/v1/incidents", server.read_token) == b"HTTP/1.1 200 OK"
        for sock in (silent, anonymous, reader):
            sock.setblocking(False)
        wait_until(
            lambda: _closed_by_peer(silent) and _closed_by_peer(anonymous),
            timeout=30,
            what="idle unauthenticated connections closed by the server",
        )
        assert not _closed_by_peer(reader)
        reader.setblocking(True)
        assert _request(reader, "/api/v1/incidents", server.read_token) == b"HTTP/1.1 200 OK"
    finally:
        for sock in (silent, anonymous, reader):
            sock.close()
