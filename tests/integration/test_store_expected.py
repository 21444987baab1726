"""A batch of deliveries that expects what its lookup would answer (``bot.store.expect``), on a
real throwaway cluster: it is one message, the whole transaction, and writes what the lookup would
have led to; whatever made the expectation stale (an alert stored meanwhile, the incident moved,
closed or opened, another fault attached), the database refuses it before any write, nothing is
kept (the server rolls it back at once: no ``ROLLBACK`` is sent), and the store runs the batch
again with its lookup."""

from __future__ import annotations

import contextlib
import os
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest

from bot.domain.faults import Fault
from bot.domain.incident import State
from bot.store.base import Delivery, IncomingAlert, IngestOutcome
from bot.store.expect import Expectations, Expecting, KeyState, Mispredicted, NodeView
from bot.store.group_commit import Ingest, deliveries
from bot.store.postgres import PostgresStore, _transaction
from proving_ground.postgres import PostgresServer
from tests.harness.postgres import CountedConnection, PostgresDatabase, counted_connection, whole

T0 = datetime(2026, 12, 1, tzinfo=UTC)
LOCK = "pg_advisory_xact_lock"


def _delivery(fingerprint: str, node: str, *, gpu: str = "3", starts: datetime = T0) -> Delivery:
    fault = Fault("xid", node, gpu, 79, "RESTART_BM", "fatal", "replace-node", True, "fell off the bus", True)
    alert = IncomingAlert(fingerprint, starts, None, "firing", "GpuXid", node, {"node": node}, {}, fault)
    return Delivery("pitcrew", f"{{node={node}}}", "firing", 0, (alert,))


@contextlib.asynccontextmanager
async def _counted(database: PostgresDatabase) -> AsyncIterator[CountedConnection]:
    """A connection to ``database`` that keeps each message it sends, its schema made by a store
    opened on it."""
    store = PostgresStore(database.url, password_file=database.password_file)
    await store.open()
    await store.close()
    async with counted_connection(database) as conn:
        yield conn


async def _ingest(conn: CountedConnection, delivery: Delivery, expecting: Expecting) -> IngestOutcome:
    driven = await _transaction(conn, deliveries([Ingest(delivery, T0)], expecting), LOCK)
    (outcome,) = driven.result
    assert isinstance(outcome, IngestOutcome)
    return outcome


def _tables(database: PostgresDatabase) -> dict[str, list[tuple[Any, ...]]]:
    with database.connect() as db:
        return {
            "incidents": db.execute("SELECT id, node, state FROM incidents ORDER BY id").fetchall(),
            "alerts": db.execute(
                "SELECT fingerprint, starts_at, status, incident_id FROM alerts ORDER BY 1, 2"
            ).fetchall(),
            "events": db.execute("SELECT seq, incident_id, kind FROM events ORDER BY seq").fetchall(),
        }


async def test_an_expected_batch_is_one_message_and_writes_what_its_lookup_would(
    postgres_db: PostgresDatabase,
) -> None:
    """Looked up, a new occurrence on a node with an incident is two messages (the lookup, then the
    writes and ``COMMIT``); expected, one, the server's implicit transaction. Both attach it to the
    node's incident, and what the batch left of the node is what the next may expect."""
    later = T0 + timedelta(minutes=1)
    async with _counted(postgres_db) as conn:
        first = Expecting(None)
        opened = await _ingest(conn, _delivery("fp-a", "gpu-001"), first)
        assert opened.opened == ["pc-00001"]
        assert first.seen == {"gpu-001": ("pc-00001", "open", frozenset({"xid79@gpu3"}))}

        conn.sent.clear()
        looked_up = Expecting(None)
        attached = await _ingest(conn, _delivery("fp-a", "gpu-001", starts=later), looked_up)
        assert attached.attached == ["pc-00001"] and attached.new_alerts == 1
        assert len(conn.sent) == 2 and not looked_up.used, conn.sent

        conn.sent.clear()
        expected = Expecting(looked_up.seen)
        again = await _ingest(conn, _delivery("fp-b", "gpu-001", starts=later), expected)
        assert len(conn.sent) == 1 and whole(conn.sent[0]), conn.sent
        assert "SELECT pitcrew_check(" in conn.sent[0] and expected.used
        assert (again.attached, again.opened, again.new_alerts) == (["pc-00001"], [], 1)
        assert expected.seen == first.seen
    tables = _tables(postgres_db)
    assert tables["incidents"] == [("pc-00001", "gpu-001", "open")]
    assert [a[3] for a in tables["alerts"]] == ["pc-00001"] * 3
    assert [e[2] for e in tables["events"]] == [
        "incident_opened",
        "alert_firing",
        "alert_firing",
        "alert_firing",
    ]


def _stored(db: psycopg.Connection[Any]) -> None:  # another replica stored the alert meanwhile
    db.execute(
        "INSERT INTO alerts (fingerprint, starts_at, status, alertname, node, incident_id, labels_json,"
        " annotations_json, first_seen) VALUES ('fp-new', %s, 'firing', 'GpuXid', 'gpu-001', 'pc-00001',"
        " '{}', '{}', 'x')",
        (T0.isoformat(timespec="microseconds"),),
    )


def _under_way(db: psycopg.Connection[Any]) -> None:  # another replica's engine began the playbook
    db.execute("UPDATE incidents SET state = 'running' WHERE id = 'pc-00001'")


def _closed(db: psycopg.Connection[Any]) -> None:  # ... or closed the incident
    db.execute("UPDATE incidents SET state = 'resolved', closed_at = 'x' WHERE id = 'pc-00001'")


def _other_fault(db: psycopg.Connection[Any]) -> None:  # another replica attached a new fault
    db.execute(
        "INSERT INTO alerts (fingerprint, starts_at, status, alertname, node, incident_id, fault_key,"
        " labels_json, annotations_json, first_seen) VALUES ('fp-other', 'x', 'firing', 'GpuXid',"
        " 'gpu-001', 'pc-00001', 'xid79@gpu5', '{}', '{}', 'x')"
    )


@pytest.mark.parametrize(
    ("change", "view"),
    [
        (_stored, ("pc-00001", "open", frozenset({"xid79@gpu3"}))),
        (_under_way, ("pc-00001", "open", frozenset({"xid79@gpu3"}))),
        (_closed, ("pc-00001", "open", frozenset({"xid79@gpu3"}))),
        (_other_fault, ("pc-00001", "open", frozenset({"xid79@gpu3"}))),
        (None, ("pc-00001", "running", frozenset({"xid79@gpu3"}))),  # expects under way: it is open
        (None, ("pc-00001", "open", frozenset())),  # expects no fault: it has one
        (None, None),  # expects no incident: the node has one
    ],
    ids=["alert-stored", "moved", "closed", "new-fault", "not-open", "faults", "no-incident"],
)
async def test_a_stale_expectation_is_refused_before_any_write(
    postgres_db: PostgresDatabase,
    change: Callable[[psycopg.Connection[Any]], None] | None,
    view: NodeView,
) -> None:
    """Each way what a batch expects can differ from the database: refused in the server
    (``Mispredicted``), in the one message, and nothing of the batch is kept: the server rolled
    the transaction back as it refused, so the write lock was let go there and then, and nothing
    more is sent (a batch that would open an incident reads its id first: its transaction was
    begun, and is rolled back by one more message); the lookup then finds what is there."""
    async with _counted(postgres_db) as conn:
        await _ingest(conn, _delivery("fp-a", "gpu-001"), Expecting(None))
        if change is not None:
            with postgres_db.connect() as db:
                change(db)
        before = _tables(postgres_db)
        conn.sent.clear()
        with pytest.raises(Mispredicted):
            await _ingest(conn, _delivery("fp-new", "gpu-001"), Expecting({"gpu-001": view}))
        assert conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
        if view is None:  # it would open an incident, whose id it reads first: a begun transaction
            assert conn.sent[0].startswith("BEGIN") and conn.sent[1:] == ["ROLLBACK"], conn.sent
        else:
            assert len(conn.sent) == 1 and whole(conn.sent[0]), conn.sent
        assert _tables(postgres_db) == before
        looked_up = Expecting(None)
        outcome = await _ingest(conn, _delivery("fp-new", "gpu-001"), looked_up)
    if change is _stored:
        assert outcome.repeated_alerts == 1 and outcome.new_alerts == 0
    elif change is _closed:
        assert outcome.opened == ["pc-00002"]
    elif change is _under_way:
        assert outcome.recurred == ["pc-00001"]
    elif change is _other_fault:
        assert looked_up.seen["gpu-001"] == ("pc-00001", "open", frozenset({"xid79@gpu3", "xid79@gpu5"}))
    else:
        assert outcome.attached == ["pc-00001"]


async def _store(database: PostgresDatabase) -> PostgresStore:
    store = PostgresStore(database.url, password_file=database.password_file)
    await store.open()
    return store


def _expectations(store: PostgresStore) -> Expectations:
    deliveries = store._shared.deliveries
    assert deliveries is not None and deliveries.expectations is not None
    return deliveries.expectations


async def test_the_store_expects_what_its_batches_and_its_moves_left(postgres_db: PostgresDatabase) -> None:
    """A store's batches expect what the last batch for the node left, and the moves this process
    made of its incident: a new fault on the incident under way is a change, and after its end a
    new alert opens another; none of them looks up, none is refused."""
    store = await _store(postgres_db)
    try:
        expectations = _expectations(store)
        first = await store.ingest(_delivery("fp-a", "gpu-001"), T0)
        (incident,) = first.opened
        await store.transition(incident, State.RUNNING, T0)
        changed = await store.ingest(_delivery("fp-b", "gpu-001", gpu="4"), T0)
        assert changed.changed == [incident]
        await store.transition(incident, State.RESOLVED, T0, outcome="resolved")
        reopened = await store.ingest(_delivery("fp-c", "gpu-001", gpu="5"), T0)
        assert reopened.opened and reopened.opened != [incident]
        assert (expectations.hits, expectations.misses) == (2, 0)
    finally:
        await store.close()


async def test_a_store_whose_expectation_is_stale_stores_the_delivery_as_its_lookup_says(
    postgres_db: PostgresDatabase,
) -> None:
    """The other replica of a pair closes the incident: this one's next batch for the node is
    refused, runs again with its lookup and opens a new incident; it then expects that one."""
    store, other = await _store(postgres_db), await _store(postgres_db)
    try:
        expectations = _expectations(store)
        (incident,) = (await store.ingest(_delivery("fp-a", "gpu-001"), T0)).opened
        await other.transition(incident, State.RESOLVED, T0, outcome="resolved")
        (reopened,) = (await store.ingest(_delivery("fp-b", "gpu-001"), T0)).opened
        assert reopened != incident
        assert (expectations.hits, expectations.misses) == (0, 1)
        assert (await store.incident(reopened)) is not None
    finally:
        await store.close()
        await other.close()


@pytest.fixture
def linguistic_db(postgres_server: PostgresServer, tmp_path: Path) -> Iterator[PostgresDatabase]:
    """A database whose default collation orders text as people read it (ICU, ``en-US``: ``a``
    before ``B``), not bytewise as Python does (``B`` before ``a``)."""
    name = f"icu_{os.getpid()}"
    with postgres_server.connect() as db:
        db.execute(
            f"CREATE DATABASE {name} TEMPLATE template0 ENCODING 'UTF8' LOCALE 'C'"
            " LOCALE_PROVIDER icu ICU_LOCALE 'en-US'"
        )
    try:
        yield PostgresDatabase(
            postgres_server.url(name), postgres_server.password_file(tmp_path / "pw"), name, postgres_server
        )
    finally:
        postgres_server.drop_database(name)


async def test_the_expected_rows_compare_in_the_order_python_sorts_them_whatever_the_collation(
    linguistic_db: PostgresDatabase,
) -> None:
    """An incident with faults whose order differs between bytes and the database's collation
    (``gpuB``, ``gpua``): what is expected still holds (a hit, one message)."""
    with linguistic_db.connect() as db:
        assert db.execute("SELECT 'xid79@gpua' < 'xid79@gpuB'").fetchone() == (True,)
    later = T0 + timedelta(minutes=1)
    async with _counted(linguistic_db) as conn:
        first = Expecting(None)
        driven = await _transaction(
            conn,
            deliveries(
                [
                    Ingest(_delivery("fp-a", "gpu-001", gpu="a"), T0),
                    Ingest(_delivery("fp-b", "gpu-001", gpu="B"), T0),
                ],
                first,
            ),
            LOCK,
        )
        assert [o.new_alerts for o in driven.result if isinstance(o, IngestOutcome)] == [1, 1]
        assert first.seen == {"gpu-001": ("pc-00001", "open", frozenset({"xid79@gpua", "xid79@gpuB"}))}
        conn.sent.clear()
        expected = Expecting(first.seen)
        outcome = await _ingest(conn, _delivery("fp-c", "gpu-001", gpu="a", starts=later), expected)
        assert expected.used and outcome.attached == ["pc-00001"] and len(conn.sent) == 1, conn.sent


def _resolved(fingerprint: str, node: str) -> Delivery:
    (alert,) = _delivery(fingerprint, node).alerts
    ended = replace(alert, status="resolved", ends_at=T0 + timedelta(minutes=5))
    return Delivery("pitcrew", f"{{node={node}}}", "resolved", 0, (ended,))


async def test_a_resolution_of_a_key_the_store_knows_is_expected_and_refused_once_it_changed(
    postgres_db: PostgresDatabase,
) -> None:
    """A key the store remembers (fingerprint, startsAt: its status and incident) is expected as
    remembered: its resolution is one message and resolves it. Resolved meanwhile by another
    replica, the same expectation is refused, and the lookup finds it resolved: a repeat."""
    async with _counted(postgres_db) as conn:
        first = Expecting(None)
        await _ingest(conn, _delivery("fp-a", "gpu-001"), first)
        await _ingest(conn, _delivery("fp-b", "gpu-001"), Expecting(first.seen))
        key_a = ("fp-a", T0.isoformat(timespec="microseconds"))
        key_b = ("fp-b", T0.isoformat(timespec="microseconds"))
        remembered: dict[tuple[str, str], KeyState] = {
            key_a: ("firing", "pc-00001"),
            key_b: ("firing", "pc-00001"),
        }

        conn.sent.clear()
        expected = Expecting(first.seen, keys=remembered)
        outcome = await _ingest(conn, _resolved("fp-a", "gpu-001"), expected)
        assert expected.used and len(conn.sent) == 1, conn.sent
        assert (outcome.resolved, outcome.resolved_in) == (1, ["pc-00001"])

        with postgres_db.connect() as db:
            db.execute("UPDATE alerts SET status = 'resolved' WHERE fingerprint = 'fp-b'")
        before = _tables(postgres_db)
        with pytest.raises(Mispredicted):
            await _ingest(conn, _resolved("fp-b", "gpu-001"), Expecting(first.seen, keys=remembered))
        assert _tables(postgres_db) == before
        again = await _ingest(conn, _resolved("fp-b", "gpu-001"), Expecting(None))
        assert (again.resolved, again.repeated_alerts) == (0, 1)


async def test_a_key_remembered_without_its_incident_is_looked_up(postgres_db: PostgresDatabase) -> None:
    """A repeat counted before its incident was known is remembered without it: a batch with that
    key looks up (two messages) instead of expecting an incident it would be refused for."""
    async with _counted(postgres_db) as conn:
        first = Expecting(None)
        await _ingest(conn, _delivery("fp-a", "gpu-001"), first)
        key = ("fp-a", T0.isoformat(timespec="microseconds"))
        conn.sent.clear()
        expecting = Expecting(first.seen, keys={key: ("firing", None)})
        outcome = await _ingest(conn, _resolved("fp-a", "gpu-001"), expecting)
        assert not expecting.used and len(conn.sent) == 2, conn.sent
        assert outcome.resolved_in == ["pc-00001"]
