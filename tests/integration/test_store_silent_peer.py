"""A Postgres that goes silent does not hold the store's writes for a quarter of an hour.

When the node under Postgres dies, or a link on the way goes down, nothing comes back: no reset,
no close. A connection waiting for an answer then waits for the kernel to give up retransmitting
(``tcp_retries2``: about 15 minutes), and every write of the replica waits behind it, webhooks
included. The store sets libpq's ``tcp_user_timeout`` and keepalives (``bot.store.postgres.TCP``)
unless its URL says otherwise: a message the peer does not acknowledge fails within the limit, the
store is unavailable (a webhook's 503), and the next write connects again.

A process of its own runs the real ``PostgresStore`` in a network namespace (``tests.harness.netns``),
reaching the test's PostgreSQL over a veth pair. Once its connections are made, the link goes down
(``ip link set db0 down`` in its namespace: packets vanish, as with a dead node) and it writes: the
write fails within the limit, plus a margin. With the link back, the next write commits.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from bot.store.postgres import TCP
from tests.harness.figures import show_figure
from tests.harness.netns import TwoSites
from tests.harness.postgres import running_postgres
from tests.harness.proc import talking_child

#: How long the write may take once the link is down: the limit, and a margin for a loaded machine.
BOUND = int(TCP["tcp_user_timeout"]) / 1000 + 15

CHILD = textwrap.dedent(
    """
    import asyncio, sys, time
    from pathlib import Path
    from datetime import UTC, datetime
    from bot.domain.faults import Fault
    from bot.store.base import Delivery, IncomingAlert, StoreUnavailable
    from bot.store.postgres import PostgresStore

    def delivery(n):
        node = f"gpu-{n:03d}"
        fault = Fault("xid", node, "3", 79, "RESTART_BM", "fatal", "replace-node", True, "fell off", True)
        alert = IncomingAlert(f"fp-{node}", datetime(2026, 12, 1, tzinfo=UTC), None, "firing", "GpuXid",
                              node, {"node": node}, {"summary": "XID"}, fault)
        return Delivery("pitcrew", "{}:{}", "firing", 0, (alert,))

    async def main(url, password_file):
        store = PostgresStore(url, password_file=Path(password_file))
        await store.open()
        await store.ingest(delivery(0), datetime.now(UTC))
        print("open", flush=True)
        n = 0
        while sys.stdin.readline():
            n += 1
            began = time.monotonic()
            try:
                await store.ingest(delivery(n), datetime.now(UTC))
            except StoreUnavailable as exc:
                print(f"unavailable {time.monotonic() - began:.1f} {exc}", flush=True)
            else:
                print(f"committed {time.monotonic() - began:.1f}", flush=True)
        await store.close()

    asyncio.run(main(sys.argv[1], sys.argv[2]))
    """
)


@pytest.fixture
def writer(two_sites: TwoSites, tmp_path: Path) -> Iterator[tuple[subprocess.Popen[str], TwoSites]]:
    with running_postgres(networks=(two_sites.db_network,)) as server:
        name = server.create_database()
        password = server.password_file(tmp_path / "postgres-password")
        site = two_sites.sites[0]
        url = server.url(name, host=two_sites.db_host)
        child = talking_child([*site.prefix, sys.executable, "-c", CHILD, url, str(password)])
        try:
            yield child, two_sites
        finally:
            site.restore()
            child.kill()
            child.wait(timeout=30)


def _ask(child: subprocess.Popen[str], timeout: float) -> str:
    """One write of the child's; its answer line, or a failure once ``timeout`` has passed."""
    assert child.stdin is not None and child.stdout is not None
    child.stdin.write("go\n")
    child.stdin.flush()
    done: list[str] = []

    def read() -> None:
        assert child.stdout is not None
        done.append(child.stdout.readline().strip())

    reader = threading.Thread(target=read, daemon=True)
    began = time.monotonic()
    reader.start()
    reader.join(timeout)
    if not done:
        child.kill()  # the reader's readline ends with the pipe
        pytest.fail(f"the write had no answer {time.monotonic() - began:.0f}s after the link went down")
    return done[0]


def test_a_write_to_a_postgres_gone_silent_fails_in_seconds_and_the_next_one_reconnects(
    writer: tuple[subprocess.Popen[str], TwoSites], capsys: pytest.CaptureFixture[str]
) -> None:
    child, sites = writer
    site = sites.sites[0]
    site.cut()
    failed = _ask(child, BOUND)
    assert failed.startswith("unavailable"), failed
    site.restore()
    committed = _ask(child, 60)
    assert committed.startswith("committed"), committed
    took = failed.split()[1]
    show_figure(
        capsys, f"  silent Postgres: the write failed {took}s after the link went down; the next committed"
    )
