"""A pitcrew process frozen in the middle of a write on Postgres does not hold the store.

A process of its own (it must be stopped with SIGSTOP) opens the real ``PostgresStore`` and
ingests one delivery of twenty alerts on twenty nodes: a transaction under the write lock, sent
as a few messages (``bot.store.postgres._transaction``): the lookups, then every row
(incidents, alerts, events) with the ``COMMIT``. The test holds a table so that one message waits
in the server; then the process is frozen, and the table let go. Either way the write lock is
free soon after and another store writes:

* held at a lookup (``incidents``): the message answered, the session waits idle in its
  transaction for a process that does not come, and the server ends it within its
  idle-in-transaction limit: nothing of the delivery is committed;
* held at the rows (``events``): the message ends in ``COMMIT``, so the server runs it whole and
  commits without the process (which acknowledges the delivery when it wakes; a redelivery would
  be deduplicated): the session is idle, outside any transaction.

The same through a connection pooler (PgBouncer in its transaction mode): the limit is each
transaction's own (``SET LOCAL``), so it reaches whichever server session the write runs on.

Batches of rows are the case that once mattered: psycopg's ``executemany`` pipelines rows and
sends the Sync after the last, and a session left waiting for the rest of a pipeline has no idle
limit at all (the server arms it only when it answers a Sync) — it held the write lock and the
lease row until the process woke, and no standby could take over. The store sends simple queries
only, each answered as a whole.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from datetime import UTC, datetime

import psycopg
import pytest

from bot.domain.faults import Fault
from bot.store.base import Delivery, IncomingAlert
from bot.store.postgres import IDLE_IN_TRANSACTION_MS, PostgresStore
from tests.harness.postgres import PostgresDatabase
from tests.harness.proc import process_state, talking_child, wait_until

NODES = 20

CHILD = textwrap.dedent(
    """
    import asyncio, sys
    from pathlib import Path
    from datetime import UTC, datetime
    from bot.domain.faults import Fault
    from bot.store.base import Delivery, IncomingAlert
    from bot.store.postgres import PostgresStore

    def alert(node):
        fault = Fault("xid", node, "3", 79, "RESTART_BM", "fatal", "replace-node", True, "fell off the bus", True)
        return IncomingAlert(f"fp-{node}", datetime(2026, 12, 1, tzinfo=UTC), None, "firing", "GpuXid", node,
                             {"node": node}, {"summary": "XID"}, fault)

    async def main(url, password_file, nodes):
        store = PostgresStore(url, password_file=Path(password_file))
        await store.open()
        print("open", flush=True)
        sys.stdin.readline()
        alerts = tuple(alert(f"gpu-{n:03d}") for n in range(nodes))
        await store.ingest(Delivery("pitcrew", "{}:{}", "firing", 0, alerts), datetime.now(UTC))
        print("committed", flush=True)

    asyncio.run(main(sys.argv[1], sys.argv[2], int(sys.argv[3])))
    """
)


def _connect(database: PostgresDatabase) -> psycopg.Connection[tuple[object, ...]]:
    return psycopg.connect(database.url, password=database.password_file.read_text().strip(), autocommit=True)


@pytest.fixture(params=["direct", "pgbouncer"])
def writer(request: pytest.FixtureRequest, postgres_db: PostgresDatabase) -> Iterator[subprocess.Popen[str]]:
    """The writing process, connected to Postgres directly or through PgBouncer in its transaction
    mode (``tests.harness.pgbouncer``), where a limit set for the session would not reach the
    server session the write runs on."""
    url = postgres_db.url
    if request.param == "pgbouncer":
        url = request.getfixturevalue("pgbouncer").url(postgres_db.name)
    child = talking_child([sys.executable, "-c", CHILD, url, str(postgres_db.password_file), str(NODES)])
    try:
        yield child
    finally:
        os.kill(child.pid, signal.SIGCONT)
        child.kill()
        child.wait(timeout=30)


def _sessions(watch: psycopg.Connection[tuple[object, ...]], query: str) -> list[tuple[object, ...]]:
    """This database's sessions (the server is shared by the worker's tests) whose last query starts so."""
    return watch.execute(
        "SELECT pid, state, wait_event_type FROM pg_stat_activity"
        " WHERE datname = current_database() AND query LIKE %s AND pid != pg_backend_pid()",
        (f"{query}%",),
    ).fetchall()


def _backend(watch: psycopg.Connection[tuple[object, ...]], pid: object) -> tuple[object, ...] | None:
    """One session's state and last query, or ``None`` once it has ended."""
    row: tuple[object, ...] | None = watch.execute(
        "SELECT state, query FROM pg_stat_activity WHERE pid = %s", (pid,)
    ).fetchone()
    return row


@pytest.mark.parametrize(
    ("held", "committed", "ends"),
    [("incidents", 0, "the frozen session to be ended"), ("events", NODES, "the frozen transaction to end")],
    ids=["at-a-lookup", "at-the-commit"],
)
async def test_a_process_frozen_inside_a_write_does_not_hold_the_write_lock(
    postgres_db: PostgresDatabase, writer: subprocess.Popen[str], held: str, committed: int, ends: str
) -> None:
    assert writer.stdin is not None
    with _connect(postgres_db) as watch, _connect(postgres_db) as holder:
        holder.autocommit = False
        holder.execute(f"LOCK TABLE {held} IN ACCESS EXCLUSIVE MODE")
        writer.stdin.write("go\n")
        writer.stdin.flush()
        waiting: list[object] = []

        def write_waits() -> bool:
            waiting[:] = [row[0] for row in _sessions(watch, "") if row[2] == "Lock"]
            return bool(waiting)

        wait_until(write_waits, timeout=30, what=f"the delivery's write to wait for the table {held}")
        [backend] = waiting
        os.kill(writer.pid, signal.SIGSTOP)
        wait_until(lambda: process_state(writer.pid) == "T", timeout=10, what="the process to stop")
        holder.commit()  # the message goes on in the server; the process does not read its answer
        limit = IDLE_IN_TRANSACTION_MS / 1000
        states: list[object] = []

        def ended() -> bool:
            row = _backend(watch, backend)
            if row is not None and row[0] not in states:
                states.append(row[0])
            return row is None or (committed > 0 and row[0] == "idle")

        wait_until(ended, timeout=limit + 20, what=f"{ends} (limit {limit:g}s)")
        stopped = process_state(writer.pid)
        [(incidents,)] = watch.execute("SELECT count(*) FROM incidents").fetchall()
        assert incidents == committed, (
            f"{incidents} incidents committed, {committed} expected "
            f"(the session went {states}, the process is {stopped!r})"
        )
        assert stopped == "T", stopped
        if not committed:
            assert "idle in transaction" in states, states

    store = PostgresStore(postgres_db.url, password_file=postgres_db.password_file)
    await store.open()
    try:
        fault = Fault(
            "xid", "gpu-900", "3", 79, "RESTART_BM", "fatal", "replace-node", True, "fell off", True
        )
        alert = IncomingAlert(
            "fp-900", datetime(2026, 12, 1, tzinfo=UTC), None, "firing", "GpuXid", "gpu-900", {}, {}, fault
        )
        outcome = await store.ingest(Delivery("pitcrew", "{}:{}", "firing", 0, (alert,)), datetime.now(UTC))
        assert len(outcome.opened) == 1
    finally:
        await store.close()
