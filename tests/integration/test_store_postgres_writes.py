"""How a Postgres store's writes reach the database (``bot.store.postgres._Writes``), on a real
throwaway cluster: webhook deliveries go before the engine's writes queued earlier, those that
come while the writes are busy commit together in the next transaction, one whose caller went is
committed before the store closes; the counts of repeats answered from memory commit beside
them, without the write lock, and hold no delivery back."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any, cast

import psycopg
import pytest

from bot.domain.alerts import dedupe_key
from bot.domain.faults import Fault
from bot.domain.incident import State
from bot.store import outbox, queries
from bot.store.base import Delivery, IncomingAlert, NewEvent
from bot.store.ingest import Batch, insert_events
from bot.store.lease import Deposed, Fence
from bot.store.postgres import (
    _WRITE_LOCK,
    BATCH_STATEMENTS,
    FLUSH_ROWS,
    PostgresStore,
    _drive,
    _transaction,
)
from bot.store.sql import POSTGRES, Op, Stmt, both, check, many, one, run, single, together
from tests.harness.postgres import PostgresDatabase, counted_connection, whole

T0 = datetime(2026, 12, 1, tzinfo=UTC)


def _delivery(fingerprint: str, node: str, alerts: int = 1) -> Delivery:
    fault = Fault("xid", node, "3", 79, "RESTART_BM", "fatal", "replace-node", True, "fell off the bus", True)
    fingerprints = [fingerprint] if alerts == 1 else [f"{fingerprint}-{n:04d}" for n in range(alerts)]
    made = tuple(
        IncomingAlert(fp, T0, None, "firing", "GpuXid", node, {"node": node}, {}, fault)
        for fp in fingerprints
    )
    return Delivery("pitcrew", f"{{node={node}}}", "firing", 0, made)


def _connect(database: PostgresDatabase) -> psycopg.Connection[tuple[object, ...]]:
    return psycopg.connect(database.url, password=database.password_file.read_text().strip(), autocommit=True)


def _waits(watch: psycopg.Connection[tuple[object, ...]]) -> list[tuple[object, ...]]:
    """What each of the store's sessions waiting for a lock waits for (``advisory``, ``relation``)."""
    return watch.execute(
        "SELECT wait_event FROM pg_stat_activity WHERE datname = current_database()"
        " AND wait_event_type = 'Lock' AND application_name = 'pitcrew' ORDER BY wait_event"
    ).fetchall()


async def _waiting_for_lock(watch: psycopg.Connection[tuple[object, ...]], sessions: int = 1) -> None:
    for _ in range(300):
        if len(_waits(watch)) == sessions:
            return
        await asyncio.sleep(0.02)
    raise AssertionError(f"{sessions} of the store's writes never waited for a lock")


async def _order(store: PostgresStore, opened: str) -> list[str]:
    """The engine's events (``engine-N``) and the delivery's (its incident ``opened``, its alert:
    ``delivery``, once), in the order they were written."""
    order: list[str] = []
    for event in await store.events_since(0):
        kind = event.kind if event.kind.startswith("engine-") else "delivery"
        if event.incident_id in (None, opened) and order[-1:] != [kind]:
            order.append(kind)
    return order


async def _opened(database: PostgresDatabase) -> PostgresStore:
    """A store open on ``database`` whose writes' connection is made (a delivery committed)."""
    store = PostgresStore(database.url, password_file=database.password_file)
    await store.open()
    try:
        await store.ingest(_delivery("warm", "gpu-000"), T0)
    except BaseException:
        await store.close()
        raise
    return store


async def _writes_busy(
    store: PostgresStore,
    holder: psycopg.Connection[tuple[object, ...]],
    watch: psycopg.Connection[tuple[object, ...]],
) -> asyncio.Future[None]:
    """The writes kept busy: the write lock taken on ``holder``, and an engine write
    (event ``engine-0``) waiting for it in the server. That write's future."""
    holder.execute("SELECT pg_advisory_lock(%s)", (_WRITE_LOCK,))
    engine = asyncio.ensure_future(store.record(None, NewEvent("engine-0"), T0))
    await _waiting_for_lock(watch)
    return engine


def _alone(stmt: Stmt) -> Op[None]:
    """An operation of ``stmt`` alone, its answer not read (a ``put``, as ``SqlStore._put`` writes one)."""
    yield stmt


def _transactions(watch: psycopg.Connection[tuple[object, ...]]) -> list[list[str]]:
    """The engine's events (``engine-N``) grouped by the transaction that wrote them (``xmin``), in
    the order of their first event."""
    found = watch.execute(
        "SELECT kind, xmin::text::bigint FROM events WHERE kind LIKE 'engine-%' ORDER BY seq"
    ).fetchall()
    together: dict[int, list[str]] = {}
    for kind, xmin in found:
        together.setdefault(int(cast(int, xmin)), []).append(str(kind))
    return list(together.values())


async def test_a_delivery_goes_before_the_engine_s_writes_queued_earlier(
    postgres_db: PostgresDatabase,
) -> None:
    """The write lock held elsewhere: one engine write waits for it in the server; two more come,
    and begin at once together on the second connection (the write under way has sent its
    ``COMMIT``: ``_Writes._kick``), in one transaction; then another engine write, then a
    delivery, both waiting in pitcrew. Once the lock is let go the delivery commits third, right
    after those two transactions, before the engine write queued before it."""
    store = await _opened(postgres_db)
    try:
        with _connect(postgres_db) as holder, _connect(postgres_db) as watch:
            first = await _writes_busy(store, holder, watch)
            begun = [asyncio.ensure_future(store.record(None, NewEvent(f"engine-{n}"), T0)) for n in (1, 2)]
            await _waiting_for_lock(watch, sessions=2)
            later = asyncio.ensure_future(store.record(None, NewEvent("engine-3"), T0))
            await asyncio.sleep(0.05)  # handed to the writes, behind the two under way
            delivery = asyncio.ensure_future(store.ingest(_delivery("new", "gpu-001"), T0))
            await asyncio.sleep(0.05)
            holder.execute("SELECT pg_advisory_unlock(%s)", (_WRITE_LOCK,))
            await asyncio.wait_for(asyncio.gather(first, *begun, later, delivery), timeout=15)
            transactions = _transactions(watch)
        (opened,) = delivery.result().opened
        order = await _order(store, opened)
        assert order == ["engine-0", "engine-1", "engine-2", "delivery", "engine-3"], order
        assert transactions == [["engine-0"], ["engine-1", "engine-2"], ["engine-3"]], transactions
    finally:
        await store.close()


async def test_a_write_waiting_when_a_commit_is_sent_begins_at_once_on_a_second_connection(
    postgres_db: PostgresDatabase,
) -> None:
    """Three engine writes and a delivery come together; the engine's three, taken first, go in
    one transaction, whose ``COMMIT`` waits in the server for a table held elsewhere (the write
    lock held meanwhile). The delivery, waiting, begins at once on a second connection and waits
    in the server for the write lock: two of the store's sessions wait, never three. Once the
    table is let go both commit (two transactions that overlap were both unanswered: either order
    is one their callers could have seen)."""
    store = await _opened(postgres_db)
    try:
        with _connect(postgres_db) as holder, _connect(postgres_db) as watch:
            holder.autocommit = False
            holder.execute("LOCK TABLE events IN ACCESS EXCLUSIVE MODE")
            engine = asyncio.ensure_future(store.record(None, NewEvent("engine-0"), T0))
            delivery = asyncio.ensure_future(store.ingest(_delivery("new", "gpu-001"), T0))
            more = [asyncio.ensure_future(store.record(None, NewEvent(f"engine-{n}"), T0)) for n in (1, 2)]
            await _waiting_for_lock(watch, sessions=2)
            await asyncio.sleep(0.2)  # a third would have begun by now
            waiting = _waits(watch)
            assert waiting == [("advisory",), ("relation",)], waiting
            holder.commit()
            await asyncio.wait_for(asyncio.gather(engine, delivery, *more), timeout=15)
            transactions = _transactions(watch)
        (opened,) = delivery.result().opened
        order = await _order(store, opened)
        engines = ["engine-0", "engine-1", "engine-2"]
        assert order in ([*engines, "delivery"], ["delivery", *engines]), order
        assert transactions == [engines], transactions
    finally:
        await store.close()


async def test_an_engine_write_the_database_refuses_fails_alone(
    postgres_db: PostgresDatabase, caplog: pytest.LogCaptureFixture
) -> None:
    """Three engine writes wait together for the write lock, the second one the database refuses
    (a step of an incident that does not exist: its foreign key). Their transaction fails, each
    runs again alone: the other two commit, each in a transaction of its own, and only the second's
    caller hears the database's refusal."""
    store = await _opened(postgres_db)
    try:
        with _connect(postgres_db) as holder, _connect(postgres_db) as watch:
            first = await _writes_busy(store, holder, watch)
            good = store.record(None, NewEvent("engine-1"), T0)
            bad = store.step_finished("no-such-incident", "notify", "ok", T0, event=NewEvent("engine-x"))
            also = store.record(None, NewEvent("engine-2"), T0)
            group = [asyncio.ensure_future(write) for write in (good, bad, also)]
            await _waiting_for_lock(watch, sessions=2)  # begun together, beside the first
            holder.execute("SELECT pg_advisory_unlock(%s)", (_WRITE_LOCK,))
            outcomes = await asyncio.wait_for(asyncio.gather(first, *group, return_exceptions=True), 15)
            transactions = _transactions(watch)
        assert outcomes[:2] == [None, None] and outcomes[3] is None, outcomes
        assert isinstance(outcomes[2], psycopg.errors.ForeignKeyViolation), outcomes
        assert transactions == [["engine-0"], ["engine-1"], ["engine-2"]], transactions
        assert [e.kind for e in await store.events_since(0) if e.kind == "engine-x"] == []
        said = [r.getMessage() for r in caplog.records if "together" in r.getMessage()]
        assert said == ["the engine's writes failed together; each runs alone"], said
    finally:
        await store.close()


async def test_a_deposed_leader_s_engine_writes_waiting_together_all_fail(
    postgres_db: PostgresDatabase,
) -> None:
    """Another replica took the lease over while three fenced writes of the old leader wait
    together for the write lock: each is refused (``Deposed``), alone as in their group, and
    nothing of them is written."""
    store = await _opened(postgres_db)
    other = PostgresStore(postgres_db.url, password_file=postgres_db.password_file)
    await other.open()
    try:
        lease = await store.acquire_lease("replica-a", timedelta(seconds=1))
        fence = Fence("replica-a")
        fence.grant(lease.epoch, time.monotonic() + 60)  # as if its local clock had not noticed
        fenced = store.fenced(fence)
        await asyncio.sleep(1.2)
        taken = await other.acquire_lease("replica-b", timedelta(seconds=60))
        assert taken.epoch == lease.epoch + 1
        with _connect(postgres_db) as holder, _connect(postgres_db) as watch:
            first = await _writes_busy(store, holder, watch)
            group = [
                asyncio.ensure_future(fenced.record(None, NewEvent(f"engine-deposed-{n}"), T0))
                for n in (1, 2, 3)
            ]
            await _waiting_for_lock(watch, sessions=2)
            holder.execute("SELECT pg_advisory_unlock(%s)", (_WRITE_LOCK,))
            outcomes = await asyncio.wait_for(asyncio.gather(*group, return_exceptions=True), 15)
            await first
            transactions = _transactions(watch)
        assert all(isinstance(outcome, Deposed) for outcome in outcomes), outcomes
        assert transactions == [["engine-0"]], transactions
    finally:
        await other.close()
        await store.close()


async def test_an_engine_write_whose_caller_goes_before_its_turn_is_not_made(
    postgres_db: PostgresDatabase,
) -> None:
    """Two engine writes wait in pitcrew behind two transactions waiting for the write lock; the
    caller of the first goes (its task cancelled). Once the lock is let go the other commits, and
    the one whose caller went was never made: nobody would have heard of it."""
    store = await _opened(postgres_db)
    try:
        with _connect(postgres_db) as holder, _connect(postgres_db) as watch:
            first = await _writes_busy(store, holder, watch)
            second = asyncio.ensure_future(store.record(None, NewEvent("engine-1"), T0))
            await _waiting_for_lock(watch, sessions=2)
            gone = asyncio.ensure_future(store.record(None, NewEvent("engine-gone"), T0))
            kept = asyncio.ensure_future(store.record(None, NewEvent("engine-2"), T0))
            await asyncio.sleep(0.05)
            gone.cancel()
            holder.execute("SELECT pg_advisory_unlock(%s)", (_WRITE_LOCK,))
            await asyncio.wait_for(asyncio.gather(first, second, kept), timeout=15)
            transactions = _transactions(watch)
        assert gone.cancelled()
        assert transactions == [["engine-0"], ["engine-1"], ["engine-2"]], transactions
    finally:
        await store.close()


async def test_without_a_second_connection_the_writes_run_one_at_a_time(
    postgres_db: PostgresDatabase, caplog: pytest.LogCaptureFixture
) -> None:
    """A role allowed no more connections than the store has made: the write that would begin
    beside a committing one cannot make its connection, so it runs after that one on the first,
    and its caller hears nothing of it (no 503, no engine retry); the writes run one at a time
    for ``ALONE_FOR`` and say so once."""
    with postgres_db.store_role("pitcrew_few", "few-secret") as (url, password):
        store = PostgresStore(url, password_file=password)
        await store.open()
        try:
            await store.ingest(_delivery("warm", "gpu-000"), T0)
            with postgres_db.connect() as admin, postgres_db.connect() as holder:
                [(made,)] = admin.execute(
                    "SELECT count(*) FROM pg_stat_activity WHERE usename = 'pitcrew_few'"
                ).fetchall()
                admin.execute(f"ALTER ROLE pitcrew_few CONNECTION LIMIT {made}")
                holder.autocommit = False
                holder.execute("LOCK TABLE events IN ACCESS EXCLUSIVE MODE")
                engine = asyncio.ensure_future(store.record(None, NewEvent("engine-0"), T0))
                delivery = asyncio.ensure_future(store.ingest(_delivery("new", "gpu-001"), T0))
                for _ in range(300):
                    if any("second connection" in r.getMessage() for r in caplog.records):
                        break
                    await asyncio.sleep(0.02)
                waiting = admin.execute(
                    "SELECT wait_event FROM pg_stat_activity WHERE usename = 'pitcrew_few'"
                    " AND wait_event_type = 'Lock'"
                ).fetchall()
                assert waiting == [("relation",)], waiting  # the other waits in pitcrew, not beside it
                holder.commit()
                await asyncio.wait_for(asyncio.gather(engine, delivery), timeout=15)
            assert len(delivery.result().opened) == 1
            more = [store.record(None, NewEvent(f"engine-{n}"), T0) for n in (1, 2, 3)]
            await asyncio.wait_for(asyncio.gather(*more, store.ingest(_delivery("late", "gpu-002"), T0)), 15)
        finally:
            await store.close()
    said = [r.getMessage() for r in caplog.records if "second connection" in r.getMessage()]
    assert said == ["the store's writes run one at a time: their second connection could not be made"], said


async def test_deliveries_that_come_while_the_writes_are_busy_commit_in_one_transaction(
    postgres_db: PostgresDatabase,
) -> None:
    """The write lock held elsewhere, an engine write waits for it in the server; eight deliveries
    come one after the other meanwhile. The first begins at once, alone (the engine write has sent
    its ``COMMIT``: ``_Writes._kick``); once the lock is let go the seven that came while it
    waited commit in one transaction (their alerts' ``xmin``), the writes taking every one waiting
    when they begin it: handed over as batches as they came, the first two were batches of their
    own, each waiting for the writes, and the rest a third."""
    store = await _opened(postgres_db)
    try:
        with _connect(postgres_db) as holder, _connect(postgres_db) as watch:
            engine = await _writes_busy(store, holder, watch)
            deliveries = []
            for n in range(1, 9):
                deliveries.append(
                    asyncio.ensure_future(store.ingest(_delivery(f"new-{n}", f"gpu-{n:03d}"), T0))
                )
                await asyncio.sleep(0.02)
            holder.execute("SELECT pg_advisory_unlock(%s)", (_WRITE_LOCK,))
            await asyncio.wait_for(asyncio.gather(engine, *deliveries), timeout=15)
            found = watch.execute(
                "SELECT fingerprint, xmin::text::bigint FROM alerts WHERE fingerprint LIKE 'new-%'"
            ).fetchall()
        assert len(found) == 8 and all(len(d.result().opened) == 1 for d in deliveries), found
        together: dict[int, list[str]] = {}
        for fingerprint, xmin in sorted(found):
            together.setdefault(int(cast(int, xmin)), []).append(str(fingerprint))
        assert sorted(together.values(), key=len) == [["new-1"], [f"new-{n}" for n in range(2, 9)]], together
    finally:
        await store.close()


async def test_a_delivery_whose_caller_goes_is_committed_before_the_store_closes(
    postgres_db: PostgresDatabase,
) -> None:
    """A delivery waits for the writes (an engine write waits for the lock held elsewhere)
    and its caller goes (Alertmanager hung up): closed at once, once the lock is let go, the store
    still commits it before it is closed; what Alertmanager sends again is a repeat."""
    store = await _opened(postgres_db)
    closed = False
    try:
        with _connect(postgres_db) as holder, _connect(postgres_db) as watch:
            engine = await _writes_busy(store, holder, watch)
            gone = asyncio.ensure_future(store.ingest(_delivery("gone", "gpu-001"), T0))
            await asyncio.sleep(0.05)
            gone.cancel()
            closing = asyncio.ensure_future(store.close())
            await asyncio.sleep(0.05)
            holder.execute("SELECT pg_advisory_unlock(%s)", (_WRITE_LOCK,))
            await asyncio.wait_for(asyncio.gather(engine, closing), timeout=15)
            closed = True
            assert gone.cancelled()
            found = watch.execute("SELECT count(*) FROM alerts WHERE fingerprint = 'gone'").fetchone()
        assert found == (1,), found
        again = PostgresStore(postgres_db.url, password_file=postgres_db.password_file)
        await again.open()
        try:
            outcome = await again.ingest(_delivery("gone", "gpu-001"), T0)
        finally:
            await again.close()
        assert (outcome.new_alerts, outcome.repeated_alerts, outcome.opened) == (0, 1, []), outcome
    finally:
        if not closed:
            await store.close()


def _counts(watch: psycopg.Connection[tuple[object, ...]], like: str) -> list[tuple[object, ...]]:
    """Each counter of the alerts whose fingerprint is ``like``: its deliveries, the transaction
    that last wrote it (``xmin``)."""
    return watch.execute(
        "SELECT deliveries, xmin::text::bigint FROM alert_deliveries WHERE fingerprint LIKE %s", (like,)
    ).fetchall()


async def _counted_twice(watch: psycopg.Connection[tuple[object, ...]], like: str, alerts: int) -> list[int]:
    """Until each of ``alerts`` counters counts two deliveries (a flush committed them all): the
    transactions that wrote them."""
    for _ in range(300):
        rows = _counts(watch, like)
        if len(rows) == alerts and all(deliveries == 2 for deliveries, _ in rows):
            return sorted(cast(set[int], {xmin for _, xmin in rows}))  # bigints
        await asyncio.sleep(0.02)
    twice = sum(deliveries == 2 for deliveries, _ in rows)
    raise AssertionError(f"a count was never committed: {twice} of {alerts} counters count two")


async def _repeated(store: PostgresStore, prefix: str, alerts: int) -> None:
    """``alerts`` alerts stored, then delivered again: a repeat of each counted in memory."""
    stored = _delivery(prefix, "gpu-000", alerts)
    await store.ingest(stored, T0)
    counted = await store.count_repeats([(a.fingerprint, a.starts_at, a.status) for a in stored.alerts], T0)
    assert counted == alerts  # from memory: the database was not asked


async def test_a_flush_of_repeats_commits_while_the_write_lock_is_held_elsewhere(
    postgres_db: PostgresDatabase,
) -> None:
    """Repeats of 600 alerts counted in memory while another session holds the write lock: the
    flush commits every count without it, in ``FLUSH_ROWS`` counters a transaction."""
    alerts = 600
    store = PostgresStore(postgres_db.url, password_file=postgres_db.password_file)
    await store.open()
    try:
        with _connect(postgres_db) as holder, _connect(postgres_db) as watch:
            await _repeated(store, "rep", alerts)
            holder.execute("SELECT pg_advisory_lock(%s)", (_WRITE_LOCK,))
            chunks = await _counted_twice(watch, "rep-%", alerts)
            assert len(chunks) == -(-alerts // FLUSH_ROWS), chunks
            holder.execute("SELECT pg_advisory_unlock(%s)", (_WRITE_LOCK,))
    finally:
        await store.close()


async def test_a_flush_counts_each_alert_whatever_its_fingerprint_holds(
    postgres_db: PostgresDatabase,
) -> None:
    """The counters a flush commits travel as one JSON array (``_bulk``): fingerprints with quotes,
    backslashes, placeholders, JSON's own characters and letters beyond ASCII each reach their own
    row, counted once, and nothing else is counted."""
    odd = [
        f"odd-{text}"
        for text in (
            "o'brien",
            'say "hi"',
            "back\\slash",
            "50%?",
            "[1,2]",
            "{a}",
            "gpu-ü-日本",
            "\t",
            "x" * 60,
        )
    ]
    store = PostgresStore(postgres_db.url, password_file=postgres_db.password_file)
    await store.open()
    try:
        with _connect(postgres_db) as watch:
            for fingerprint in [*odd, "bystander"]:
                await store.ingest(_delivery(fingerprint, "gpu-000"), T0)
            for fingerprint in odd:
                assert await store.count_repeats([(fingerprint, T0, "firing")], T0) == 1
            await _counted_twice(watch, "odd-%", len(odd))
            rows = watch.execute("SELECT fingerprint, deliveries FROM alert_deliveries").fetchall()
            found = {cast(str, fingerprint): deliveries for fingerprint, deliveries in rows}
            assert found == {**dict.fromkeys(odd, 2), "bystander": 1}, found
    finally:
        await store.close()


@contextlib.asynccontextmanager
async def _flush_at_a_held_row(
    database: PostgresDatabase, prefix: str, hold: str = "SELECT 1 FROM alert_deliveries {} FOR UPDATE"
) -> AsyncIterator[
    tuple[PostgresStore, psycopg.Connection[tuple[object, ...]], psycopg.Connection[tuple[object, ...]]]
]:
    """An open store whose flush's chunk waits at a counter row (``{prefix}-0001``, of three repeats
    counted in memory) that ``holder``'s open transaction holds (``hold``, formatted with the
    row's ``WHERE``): the store, ``holder`` and a session to ``watch`` with. The store is closed after."""
    store = PostgresStore(database.url, password_file=database.password_file)
    await store.open()
    try:
        with _connect(database) as holder, _connect(database) as watch:
            await _repeated(store, prefix, 3)
            holder.execute("BEGIN")
            holder.execute(hold.format(f"WHERE fingerprint = '{prefix}-0001'"))
            await _waiting_for_lock(watch)  # the flush, at the row
            yield store, holder, watch
    finally:
        await store.close()  # once more if the test closed it: nothing left to close


async def test_a_delivery_never_waits_for_a_flush_of_repeats(postgres_db: PostgresDatabase) -> None:
    """A flush whose chunk waits for a counter row another session holds: a new delivery commits
    meanwhile (it was in the writes' turn after the flush, and waited in the server for the write
    lock the flush held in its shared mode); the flush commits every count once the row is let go."""
    async with _flush_at_a_held_row(postgres_db, "held") as (store, holder, watch):
        outcome = await asyncio.wait_for(store.ingest(_delivery("new", "gpu-001"), T0), timeout=10)
        assert outcome.new_alerts == 1, outcome
        assert [deliveries for deliveries, _ in _counts(watch, "held-%")] == [1, 1, 1]  # still waiting
        assert _waits(watch) == [("transactionid",)]
        holder.execute("COMMIT")
        assert len(await _counted_twice(watch, "held-%", 3)) == 1


async def test_a_flush_adds_to_a_count_committed_while_it_waited_whatever_the_default_isolation(
    postgres_db: PostgresDatabase, caplog: pytest.LogCaptureFixture
) -> None:
    """The database's transactions default to REPEATABLE READ; a flush's chunk waits at a counter
    row another transaction updates, which then commits: the chunk runs at READ COMMITTED, adds
    to that count and commits (at REPEATABLE READ it failed to serialize, and was tried again)."""
    caplog.set_level(logging.WARNING, logger="pitcrew.store.postgres")
    with postgres_db.connect() as admin:
        admin.execute(
            f"ALTER DATABASE \"{postgres_db.name}\" SET default_transaction_isolation = 'repeatable read'"
        )
    adding = "UPDATE alert_deliveries SET deliveries = deliveries + 10 {}"
    async with _flush_at_a_held_row(postgres_db, "strict", adding) as (_, holder, watch):
        holder.execute("COMMIT")
        for _ in range(300):
            counts = sorted(cast(int, deliveries) for deliveries, _ in _counts(watch, "strict-%"))
            if counts == [2, 2, 12]:
                break
            await asyncio.sleep(0.02)
        assert counts == [2, 2, 12], counts
    assert not [r for r in caplog.records if "repeat deliveries" in r.getMessage()], caplog.text


async def test_the_store_closes_once_a_flush_s_chunk_under_way_has_committed(
    postgres_db: PostgresDatabase,
) -> None:
    """The store closes while a flush's chunk waits at a counter row another session holds: the
    close waits for that chunk (the flusher, cancelled, left it going on the pool), and each count
    is committed when it returns."""
    async with _flush_at_a_held_row(postgres_db, "closing") as (store, holder, watch):
        closing = asyncio.ensure_future(store.close())
        await asyncio.sleep(0.3)
        assert not closing.done(), "closed with a count not committed"
        holder.execute("COMMIT")
        await asyncio.wait_for(closing, timeout=10)
        assert [deliveries for deliveries, _ in _counts(watch, "closing-%")] == [2, 2, 2]


class _Refused(Exception):
    pass


def _checked(holds: bool, rows: int) -> Op[int]:
    """A check (holding or not; its values hold quotes and a dollar-quote tag), ``rows``
    rows inserted with nothing to answer, a statement answered (a sequence's next value, which a
    rollback does not take back, and the rows), more rows."""
    quoted = "it's $$ $pitcrew_check$"
    yield check(
        "SELECT 1 WHERE ? AND ? <> ''", (holds, quoted), lambda: _Refused("the condition did not hold")
    )
    yield many("INSERT INTO checked (n) VALUES (?)", [(n,) for n in range(rows)])
    counted = yield one("SELECT nextval('checked_answers') AS answer, (SELECT count(*) FROM checked) AS n")
    yield many("INSERT INTO checked (n) VALUES (?)", [(-1,)])
    return int(counted["n"])


def _sequence(database: PostgresDatabase) -> tuple[object, ...] | None:
    with _connect(database) as db:
        return db.execute("SELECT last_value, is_called FROM checked_answers").fetchone()


@pytest.mark.parametrize("rows", [3, BATCH_STATEMENTS + 5])
async def test_a_check_goes_with_the_statements_after_it_and_refuses_in_the_server(
    postgres_db: PostgresDatabase, rows: int
) -> None:
    """A ``check`` goes with the statements after it, not in a message of its own (a fenced write's
    lease check was a round trip of its own before every engine write), and fails in the server
    if it finds no row: holding, the transaction commits what follows it, a batch of rows over a
    message's limit included; not holding, it raises what it refuses with, nothing after it in
    its message runs (the sequence never moves on) and nothing of the transaction is kept. So
    ``COMMIT`` may go in the check's own message: rows last, with nothing to answer, and the check
    are one message, the whole transaction, which the server rolls back as the check refuses
    (no ``ROLLBACK`` is sent); a transaction begun in an earlier message is rolled back by one."""
    with _connect(postgres_db) as db:
        db.execute("CREATE TABLE checked (n INTEGER NOT NULL); CREATE SEQUENCE checked_answers")
        db.execute(POSTGRES.script("{check_function}"))
    async with counted_connection(postgres_db) as conn:
        driven = await _transaction(conn, _checked(True, rows), "pg_advisory_xact_lock")
        assert driven.result == rows
        assert len(conn.sent) == (2 if rows < BATCH_STATEMENTS else 3), conn.sent
        assert "SELECT pitcrew_check(" in conn.sent[0] and conn.sent[-1].endswith("COMMIT")
        assert _sequence(postgres_db) == (1, True)

        conn.sent.clear()
        with pytest.raises(_Refused, match="did not hold"):
            await _transaction(conn, _checked(False, rows), "pg_advisory_xact_lock")
        assert conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
        assert _sequence(postgres_db) == (1, True)  # the statement after the check never ran
        assert conn.sent[-1] == "ROLLBACK" and len(conn.sent) == 2, conn.sent

        conn.sent.clear()
        with pytest.raises(_Refused):
            await _transaction(conn, _rows_last(), "pg_advisory_xact_lock")
        assert len(conn.sent) == 1 and whole(conn.sent[0]), conn.sent
        assert conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
    with _connect(postgres_db) as db:
        found = db.execute("SELECT count(*) FROM checked").fetchone()
    assert found == (rows + 1,), found  # the first transaction's rows alone


def _rows_last() -> Op[None]:
    yield check("SELECT 1 WHERE ?", (False,), lambda: _Refused("the condition did not hold"))
    yield many("INSERT INTO checked (n) VALUES (?)", [(-2,)])


async def test_a_single_write_is_one_message_with_its_check_and_commit(postgres_db: PostgresDatabase) -> None:
    """A fenced engine write of one statement (``single``: its answer decides nothing before the
    commit) is one message, the lease check and the statement, the server's implicit transaction;
    its answer is the statement's: a row count, or the row it returned."""
    with _connect(postgres_db) as db:
        db.execute("CREATE TABLE singled (n INTEGER NOT NULL)")
        db.execute(POSTGRES.script("{check_function}"))

    def fenced(holds: bool, stmt: Stmt) -> Op[Any]:
        yield check("SELECT 1 WHERE ?", (holds,), lambda: _Refused("the condition did not hold"))
        return (yield from single(stmt))

    async with counted_connection(postgres_db) as conn:
        inserted = run("INSERT INTO singled (n) VALUES (?), (?)", (1, 2))
        assert (await _transaction(conn, fenced(True, inserted), "pg_advisory_xact_lock")).result == 2
        returned = one("INSERT INTO singled (n) VALUES (?) RETURNING n * 10 AS n", (3,))
        assert (await _transaction(conn, fenced(True, returned), "pg_advisory_xact_lock")).result == {"n": 30}
        assert len(conn.sent) == 2 and all(whole(m) for m in conn.sent), conn.sent
        with pytest.raises(_Refused):
            await _transaction(conn, fenced(False, inserted), "pg_advisory_xact_lock")
    with _connect(postgres_db) as db:
        assert db.execute("SELECT n FROM singled ORDER BY n").fetchall() == [(1,), (2,), (3,)]


async def test_engine_writes_that_read_nothing_back_go_together_in_one_message(
    postgres_db: PostgresDatabase,
) -> None:
    """The engine's writes at a step's end (the step's record, its progress, the incident's move to
    the next step, a notice's attempt) read nothing back (``put``), so a group of them
    (``together``, ``_Writes.write``) is one message, the server's implicit transaction: no round
    trip of its own while the group holds the write lock. A write whose answer decides (a
    transition) would end its message there."""
    store = await _opened(postgres_db)
    try:
        [incident] = (await store.ingest(_delivery("stepped", "gpu-001"), T0)).opened
        await store.enqueue(incident, NewEvent("notice"), "notice", {}, ["slack"], T0)
        [item] = [pending.id for pending in await store.outbox_pending("slack")]
    finally:
        await store.close()

    writes = [
        queries.step_started(incident, "notify", 1, T0),
        queries.step_progress(incident, "notify", '{"sent": 1}', T0),
        queries.advance(incident, 3, T0),
        outbox.attempt(item),
        outbox.delivered(item, "ts-1", T0),
    ]
    async with counted_connection(postgres_db) as conn:
        driven = await _transaction(conn, together([_alone(w) for w in writes]), "pg_advisory_xact_lock")
        assert driven.result == [(None, False)] * len(writes)
        assert len(conn.sent) == 1 and whole(conn.sent[0]), conn.sent
    with _connect(postgres_db) as db:
        assert db.execute("SELECT step_index FROM incidents WHERE id = %s", (incident,)).fetchone() == (3,)
        assert db.execute("SELECT attempts, ref FROM outbox WHERE id = %s", (item,)).fetchone() == (1, "ts-1")


async def test_an_engine_write_s_last_answer_goes_with_the_writes_after_it(
    postgres_db: PostgresDatabase,
) -> None:
    """An engine write's last statement (``single``) decides nothing in the transaction, so in a
    group (``together``) the writes after it go in the same message and it is answered when that
    message is (``later``): a notice's event ``seq``, read back last, costs no round trip of its
    own while the group holds the write lock. Each notice still gets its own event's ``seq``:
    answered in the group's only message, in a message a later write's decision ended, or in
    the last, which ``COMMIT`` goes with. A transition's event is written provided it moved,
    decided in the database: moved or not, it reads nothing before its last statement (whether it
    moved, so the outbox is woken only then), where its row count ended a message."""
    store = await _opened(postgres_db)
    store.route_events(frozenset({"moved-resolved", "moved-running"}), "slack")
    try:
        [incident] = (await store.ingest(_delivery("noticed", "gpu-001"), T0)).opened
    finally:
        await store.close()

    def notice(n: int) -> Op[int]:
        return outbox.enqueue(incident, NewEvent(f"notice-{n}"), "notice", {"n": n}, ["slack"], T0)

    def moved() -> Op[int]:  # a write whose answer decides what follows ends its message
        count = yield run("UPDATE incidents SET step_index = 2 WHERE id = ?", (incident,))
        if count:
            yield queries.advance(incident, 2, T0)
        return int(count)

    def transition(state: State, unless: str | None) -> Op[bool]:  # the store's own operation
        moving = NewEvent(f"moved-{state.value}")
        return store._move(incident, state, T0, moving, outcome=None, guarded=False, unless=unless)

    groups: list[tuple[list[Op[Any]], int]] = [
        ([notice(1), _alone(queries.advance(incident, 1, T0))], 1),  # answered with COMMIT (SYNC)
        ([notice(2), notice(3)], 1),  # the second notice's answer commits
        ([notice(4), moved(), notice(5)], 2),  # the first answered in the row count's message
        # A transition decides its event in the database: one message, moved or not (its alert
        # fires, so it stays open).
        ([transition(State.RESOLVED, "firing"), notice(6)], 1),
        ([transition(State.RUNNING, None)], 1),
        # An earlier write whose last statement is rows has no answer to wait for.
        ([single(queries.advance(incident, 4, T0)), notice(7)], 1),
    ]
    async with counted_connection(postgres_db) as conn:
        results = []
        for ops, messages in groups:
            conn.sent.clear()
            driven = await _transaction(conn, together(ops), "pg_advisory_xact_lock")
            assert len(conn.sent) == messages, conn.sent
            results.append(driven.result)
    with _connect(postgres_db) as db:
        found = db.execute(
            "SELECT kind, seq FROM events WHERE kind LIKE 'notice-%%' OR kind LIKE 'moved-%%'"
        ).fetchall()
        routed = db.execute("SELECT event_seq FROM outbox ORDER BY event_seq").fetchall()
        state = db.execute("SELECT state FROM incidents WHERE id = %s", (incident,)).fetchone()
    seqs = {str(kind): int(cast(int, seq)) for kind, seq in found}
    assert results == [
        [(seqs["notice-1"], False), (None, False)],
        [(seqs["notice-2"], False), (seqs["notice-3"], False)],
        [(seqs["notice-4"], False), (1, False), (seqs["notice-5"], False)],
        [(False, True), (seqs["notice-6"], False)],
        [(True, True)],
        [(None, False), (seqs["notice-7"], False)],
    ]
    assert "moved-resolved" not in seqs and state == (State.RUNNING.value,)
    assert [seq for (seq,) in routed] == sorted(seqs.values())


async def test_two_reads_together_are_one_message(postgres_db: PostgresDatabase) -> None:
    """Two reads (``both``: an incident and its steps, read at every move of its flow) are one
    message, where each was a round trip, with each one's answer as it reads alone; a read after
    them goes on its own."""
    with _connect(postgres_db) as db:
        db.execute("CREATE TABLE readings (n INTEGER NOT NULL, word TEXT NOT NULL)")
        db.execute("INSERT INTO readings VALUES (1, 'it''s'), (2, 'b'), (3, 'c')")

    def rows_of(above: int) -> Op[list[int]]:
        found = yield Stmt("SELECT n FROM readings WHERE n > ? ORDER BY n", (above,), "all")
        return [row["n"] for row in found]

    def word_of(n: int) -> Op[str | None]:
        found = yield one("SELECT word FROM readings WHERE n = ?", (n,))
        return None if found is None else str(found["word"])

    def three() -> Op[tuple[tuple[str | None, list[int]], str | None]]:
        pair = yield from both(word_of(1), rows_of(1))
        return pair, (yield from word_of(9))

    async with counted_connection(postgres_db) as conn:
        assert (await _drive(conn, three())).result == (("it's", [2, 3]), None)
        assert len(conn.sent) == 2, conn.sent
        assert [message.count("SELECT") for message in conn.sent] == [2, 1], conn.sent


async def test_a_batch_s_rows_are_one_statement_a_table_and_kept_as_given(
    postgres_db: PostgresDatabase,
) -> None:
    """A batch's new alerts, their counters and its events are one statement a table on Postgres,
    the rows one JSON array (``bot.store.ingest``'s bulk statements), where each row was a statement
    of its own: every text kept as given (quotes, backslashes, percent signs, other scripts, line
    breaks, nothing), and the events' ``seq`` in the rows' order."""
    store = await _opened(postgres_db)
    await store.close()
    odd = {"node": "gpu-001", "summary": 'it\'s 100 % \\ "quoted" — ünïcode ☃ 日本', "empty": ""}
    fault = Fault("xid", "gpu-001", "3", 79, "RESTART_BM", "fatal", "replace-node", True, "fell off", True)
    alerts = [
        IncomingAlert(f"odd-{n}", T0, None, "firing", "GpuXid", "gpu-001", odd, {"d": "a\nb\tc"}, fault)
        for n in range(3)
    ]
    batch = Batch({}, {}, {})
    batch.add(
        Delivery("pitcrew", "{node=gpu-001}", "firing", 0, tuple(alerts)),
        [dedupe_key(a.fingerprint, a.starts_at) for a in alerts],
        T0,
    )
    kinds = [f"kind-{n}" for n in range(5)]
    events = [
        (None, NewEvent(kind, detail=odd["summary"], attempt=n or None), T0) for n, kind in enumerate(kinds)
    ]

    def op() -> Op[None]:
        yield from batch.write()
        yield insert_events(events)

    async with counted_connection(postgres_db) as conn:
        await _transaction(conn, op(), "pg_advisory_xact_lock")
        inserts = [s for m in conn.sent for s in m.split(";\n") if s.lstrip().startswith("INSERT INTO")]
        tables = [s.split()[2] for s in inserts]
        assert sorted(tables) == ["alert_deliveries", "alerts", "events", "events", "incidents"], inserts
    with _connect(postgres_db) as db:
        stored = db.execute(
            "SELECT fingerprint, labels_json, annotations_json, incident_id FROM alerts"
            " WHERE node = 'gpu-001' ORDER BY fingerprint"
        ).fetchall()
        assert [(r[0], json.loads(str(r[1])), json.loads(str(r[2]))) for r in stored] == [
            (f"odd-{n}", odd, {"d": "a\nb\tc"}) for n in range(3)
        ]
        assert db.execute(
            "SELECT count(*) FROM alert_deliveries WHERE fingerprint LIKE 'odd-%'"
        ).fetchone() == (3,)
        written = db.execute(
            "SELECT kind, detail, attempt FROM events WHERE kind LIKE 'kind-%' ORDER BY seq"
        ).fetchall()
        assert written == [(kind, odd["summary"], n or None) for n, kind in enumerate(kinds)]
