"""The store port's contract, the same cases on SQLite and on a real PostgreSQL (``tests.harness.stores``).

Cases: ingest dedupes on fingerprint + startsAt (a repeat only counts, through ``count_repeats``
and through ``ingest``; deliveries reaching two processes at once open one incident per node and
are each counted once, on disk after they close (repeats counted in memory included); repeats
answered from memory reach the database within a second, and on Postgres only while it commits
this replica's writes (``bot.store.repeats``); a resolve marks the alert and is never undone by a stale firing repeat;
another startsAt is another alert of the same incident; an alert without a node is kept and
opens nothing; a second node opens a second incident, numbered in order); a delivery waiting
for another session's lock never holds the event loop; the incident's life
(plan, guard, steps begun/progress/finished, advance, close unless something fires, history,
nodes in remediation); what a watch remembers; the timeline (pages with cursors, ``events_since``) and the audit log's
refusal of UPDATE and DELETE in the database itself; approvals decided once; a rollback recorded
once; switches; the outbox (enqueue with the event in one transaction, routed events and their
wake, attempt, defer, delivered, references and links; a notice a step posts once per key in each
of its runs, a superseded step's next run posting it anew); two views of one database see each
other's writes; ``pitcrew incidents`` reads either and says who leads; the two stores have the same tables and columns at the same schema version.
The lease and the fence are in ``test_store_lease.py``, retention in ``test_store_retention.py`` (also on
both stores).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import sqlite3
import time
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path

import psycopg
import pytest

from bot.cli import main
from bot.domain.faults import Fault
from bot.domain.incident import State
from bot.domain.planner import Plan
from bot.domain.policy import Mode
from bot.store import postgres, sql
from bot.store.base import (
    ACTION,
    ONCE,
    SUPERSEDED,
    Delivery,
    Deposed,
    Fence,
    IncomingAlert,
    NewEvent,
    SkippedStep,
    StoreUnavailable,
    link_key,
)
from bot.store.postgres import PostgresStore
from bot.store.schema import SCHEMA_VERSION
from bot.store.sql import single
from bot.store.sqlite import SqliteStore
from tests.harness.figures import show_figure
from tests.harness.stores import AnyStore, Stores

T0 = datetime(2026, 11, 30, 9, 0, tzinfo=UTC)


def _fault(node: str, xid: int = 79, gpu: str = "3") -> Fault:
    return Fault("xid", node, gpu, xid, "RESTART_BM", "fatal", "replace-node", True, "fell off the bus", True)


def _alert(
    fp: str, node: str | None, *, starts: datetime = T0, status: str = "firing", xid: int = 79
) -> IncomingAlert:
    fault = _fault(node, xid) if node is not None else None
    labels = {"node": node} if node is not None else {}
    return IncomingAlert(
        fp,
        starts,
        T0 + timedelta(minutes=5) if status == "resolved" else None,
        status,  # type: ignore[arg-type]
        "GpuXid",
        node,
        labels,
        {"summary": "XID"},
        fault,
    )


def _delivery(*alerts: IncomingAlert) -> Delivery:
    return Delivery("pitcrew", "{}:{node=x}", alerts[0].status, 0, alerts)


def _plan(node: str) -> Plan:
    fault = _fault(node)
    return Plan(
        node,
        (fault,),
        fault,
        "replace-node",
        Mode.AUTO,
        ("notify", "slurm_down"),
        "down",
        ("why",),
        acts=True,
    )


async def test_ingest_dedupes_on_fingerprint_and_starts_at(stores: Stores) -> None:
    store = await stores.open()
    first = await store.ingest(_delivery(_alert("fp1", "gpu-001")), T0)
    assert (first.new_alerts, first.opened) == (1, ["pc-00001"])

    # The same alert again: counted, nothing new (fast path, and through ingest as well).
    assert await store.count_repeats([("fp1", T0, "firing")], T0 + timedelta(seconds=1)) == 1
    again = await store.ingest(_delivery(_alert("fp1", "gpu-001")), T0 + timedelta(seconds=2))
    assert (again.new_alerts, again.repeated_alerts, again.opened) == (0, 1, [])
    # A resolve is not a repeat the fast path may count.
    assert await store.count_repeats([("fp1", T0, "resolved")], T0) is None
    assert await store.count_repeats([("fp-unknown", T0, "firing")], T0) is None

    # Another startsAt of the same fingerprint is another alert, of the same incident. It is what
    # fires now: Alertmanager keeps one alert per fingerprint, so the earlier occurrence ended when
    # this one began, and a resolve of it may never come.
    later = T0 + timedelta(minutes=1)
    other = await store.ingest(_delivery(_alert("fp1", "gpu-001", starts=later)), later)
    assert (other.new_alerts, other.attached) == (1, ["pc-00001"])
    assert await store.firing("pc-00001") == 1

    resolved = await store.ingest(
        _delivery(_alert("fp1", "gpu-001", status="resolved")), T0 + timedelta(minutes=5)
    )
    assert (resolved.resolved, resolved.resolved_in) == (1, ["pc-00001"])
    stale = await store.ingest(_delivery(_alert("fp1", "gpu-001")), T0 + timedelta(minutes=6))
    assert stale.repeated_alerts == 1
    assert await store.firing("pc-00001") == 1  # the stale repeat left it resolved
    assert await store.firing("pc-99999") == 0

    alerts = {(a.fingerprint, a.starts_at): a for a in await store.alerts_of("pc-00001")}
    assert alerts[("fp1", T0)].status == "resolved"  # a stale firing repeat never un-resolves
    assert alerts[("fp1", T0)].deliveries == 5
    assert alerts[("fp1", later)].status == "firing" and alerts[("fp1", later)].deliveries == 1
    assert alerts[("fp1", T0)].labels == {"node": "gpu-001"}

    nowhere = await store.ingest(_delivery(_alert("fp-nonode", None)), T0)
    assert (nowhere.unroutable, nowhere.opened) == (1, [])
    second = await store.ingest(_delivery(_alert("fp2", "gpu-002")), T0)
    assert second.opened == ["pc-00002"]
    incident = await store.incident("pc-00001")
    assert incident is not None and [f.key for f in incident.faults] == ["xid79@gpu3"]


async def test_an_occurrence_alertmanager_replaced_does_not_hold_its_incident_open(stores: Stores) -> None:
    """An alert resolves and fires again between two flushes of its group: Alertmanager replaces
    the resolved alert with the new one (one alert per fingerprint, provider/mem ``Put``), so no
    delivery ever says the first occurrence resolved. It must not keep the incident firing."""
    store = await stores.open()
    (incident_id,) = (await store.ingest(_delivery(_alert("fp1", "gpu-001")), T0)).opened
    again = T0 + timedelta(minutes=2)
    await store.ingest(_delivery(_alert("fp1", "gpu-001", starts=again)), again)
    assert await store.firing(incident_id) == 1
    kept = await store.transition(incident_id, State.RESOLVED, again, unless="firing")
    assert kept.state is not State.RESOLVED  # the new occurrence fires

    ended = _alert("fp1", "gpu-001", starts=again, status="resolved")
    await store.ingest(_delivery(ended), T0 + timedelta(minutes=6))
    assert await store.firing(incident_id) == 0
    closed = await store.transition(incident_id, State.RESOLVED, T0 + timedelta(minutes=7), unless="firing")
    assert closed.state is State.RESOLVED


async def test_a_transition_reports_its_move_only_when_it_moved(stores: Stores) -> None:
    """A transition's event, and the outbox row its kind is routed to, are written with the move
    and only if it moved: kept open while an alert fires, nothing is reported and the incident is
    as it was; once they are resolved, the move and its one event and row."""
    store = await stores.open()
    woken: list[str] = []
    store.route_events(frozenset({"incident_closed"}), "slack", wake=lambda: woken.append("slack"))
    (incident_id,) = (await store.ingest(_delivery(_alert("fp1", "gpu-001")), T0)).opened
    before = await store.incident(incident_id)
    closing = NewEvent("incident_closed", detail="recovered")
    kept = await store.transition(incident_id, State.RESOLVED, T0, event=closing, unless="firing")
    assert kept == before
    assert [e.kind for e in await store.events_since(0) if e.kind == "incident_closed"] == []
    assert await store.outbox_pending("slack") == [] and woken == []

    await store.ingest(_delivery(_alert("fp1", "gpu-001", status="resolved")), T0 + timedelta(minutes=5))
    later = T0 + timedelta(minutes=6)
    closed = await store.transition(incident_id, State.RESOLVED, later, event=closing, unless="firing")
    assert closed.state is State.RESOLVED and closed.closed_at == later
    (reported,) = [e for e in await store.events_since(0) if e.kind == "incident_closed"]
    (row,) = await store.outbox_pending("slack")
    assert (row.event_seq, row.kind, woken) == (reported.seq, "incident_closed", ["slack"])


async def test_deliveries_at_once_are_each_stored_once(stores: Stores) -> None:
    """Deliveries reaching two processes at once, each process committing what reaches it together
    (SQLite's writer, Postgres's group commit): one incident per node, every delivery counted once,
    and the counts are on disk when the processes are gone."""
    views = [await stores.open(), await stores.open()]
    nodes = ("gpu-001", "gpu-002", "gpu-003")
    stored = await asyncio.gather(
        *(views[i % 2].ingest(_delivery(_alert(f"fp{i % 3}", nodes[i % 3])), T0) for i in range(30))
    )
    assert sorted(i for outcome in stored for i in outcome.opened) == ["pc-00001", "pc-00002", "pc-00003"]
    assert [sum(o.new_alerts for o in stored), sum(o.repeated_alerts for o in stored)] == [3, 27]
    later = T0 + timedelta(seconds=1)

    async def again(i: int) -> int:
        """Delivered again as the webhook does it: the fast path, else (``None``) in full."""
        view, fingerprint = views[i % 2], f"fp{i % 3}"
        counted = await view.count_repeats([(fingerprint, T0, "firing")], later)
        if counted is None:
            counted = (await view.ingest(_delivery(_alert(fingerprint, nodes[i % 3])), later)).repeated_alerts
        return counted

    assert await asyncio.gather(*(again(i) for i in range(30))) == [1] * 30
    assert await views[0].count_repeats([("fp0", T0, "resolved")], later) is None
    await stores.close()
    store = await stores.open()
    for index, node in enumerate(nodes):
        [alert] = [a for i in (await store.incidents(node=node)) for a in await store.alerts_of(i.id)]
        assert (alert.fingerprint, alert.last_seen) == (f"fp{index}", later)
        assert alert.deliveries == 20  # SQLite: the counts held in memory, flushed at close


@pytest.mark.parametrize("stores", ["postgres", "pgbouncer"], indirect=True)
@pytest.mark.parametrize("isolation", ["repeatable read", "serializable"])
async def test_a_database_whose_transactions_default_to_a_stricter_isolation_stores_each_once(
    stores: Stores, isolation: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The database's (or the role's) ``default_transaction_isolation`` set stricter than READ
    COMMITTED, as some sites set it: every transaction of the store still runs at READ COMMITTED,
    which its write lock relies on (a transaction that waited for the lock must see what the one
    before it committed: at REPEATABLE READ its snapshot was taken before the wait). Deliveries
    reaching two processes at once: one incident per node, each stored once; the lease changes
    hands and the old holder's fenced write is refused."""
    caplog.set_level(logging.WARNING, logger="pitcrew.store.batch")
    assert stores.database is not None
    with stores.database.connect() as admin:
        admin.execute(
            f"ALTER DATABASE \"{stores.database.name}\" SET default_transaction_isolation = '{isolation}'"
        )
    views = [await stores.open(), await stores.open()]
    nodes = [f"gpu-{n:03}" for n in range(7)]  # each reaches both processes (7 and 2 coprime)
    with stores.writes_locked():  # both processes' batches wait, as under load, then go in turn
        delivered = asyncio.gather(
            *(views[i % 2].ingest(_delivery(_alert(f"fp{i % 7}", nodes[i % 7])), T0) for i in range(70))
        )
        await asyncio.sleep(0.5)
    stored = await delivered
    # At REPEATABLE READ the second batch failed on what the first stored (its snapshot older than
    # its wait) and its deliveries were stored again one by one; at SERIALIZABLE they failed.
    assert not [r for r in caplog.records if "a batch failed" in r.getMessage()], caplog.text
    assert len({i for outcome in stored for i in outcome.opened}) == 7
    assert [sum(o.new_alerts for o in stored), sum(o.repeated_alerts for o in stored)] == [7, 63]
    lease = await views[0].acquire_lease("replica-a", timedelta(seconds=1))
    await asyncio.sleep(1.2)
    taken = await views[1].acquire_lease("replica-b", timedelta(seconds=60))
    assert taken.epoch == lease.epoch + 1
    fence = Fence("replica-a")
    fence.grant(lease.epoch, time.monotonic() + 60)  # as if its local clock had not noticed
    with pytest.raises(Deposed):
        await views[0].fenced(fence).record(None, NewEvent("deposed write"), T0)


# Repeats answered from memory (``bot.store.repeats``): counted in one process, the deliveries
# reach the database within about a second; a key another process stored is counted once where
# the database is read, then remembered; on Postgres memory answers only while the database
# commits this replica's writes, and a replica taking only repeats stays fresh by their commits.


async def test_repeats_counted_in_memory_reach_the_database_within_a_second(stores: Stores) -> None:
    counting, other = await stores.open(), await stores.open()
    outcome = await counting.ingest(_delivery(_alert("fp-a", "gpu-001")), T0)
    [incident] = outcome.opened
    later = T0 + timedelta(seconds=30)
    assert [await counting.count_repeats([("fp-a", T0, "firing")], later) for _ in range(3)] == [1, 1, 1]

    began = time.monotonic()
    while True:
        [alert] = await other.alerts_of(incident)
        if alert.deliveries == 4:
            break
        assert time.monotonic() - began < 5, f"the counts never reached the database: {alert.deliveries}"
        await asyncio.sleep(0.05)
    assert alert.last_seen == later
    # Committed, and no longer added from memory: once the flush's answer has reached this
    # process's loop. A read landing between the commit and that answer counts the flush twice
    # (``RepeatMemory.overlay`` says so); under load the other process read the commit first,
    # and this read saw 7 in a run of the store tests.
    while True:
        [mine] = await counting.alerts_of(incident)
        if mine.deliveries == 4:
            break
        assert mine.deliveries == 7, mine  # the flush's three, twice: never anything else
        assert time.monotonic() - began < 5, f"the flush never answered: {mine.deliveries}"
        await asyncio.sleep(0.01)


async def test_a_key_another_process_stored_is_looked_up_once_then_remembered(stores: Stores) -> None:
    storing, counting = await stores.open(), await stores.open()
    await storing.ingest(_delivery(_alert("fp-b", "gpu-002")), T0)
    # Its first delivery here is counted where the database is read (Postgres, which has not
    # committed for this process yet, looks it up; SQLite ingests it in full, as the webhook does).
    first = await counting.count_repeats([("fp-b", T0, "firing")], T0)
    if first is None:
        first = (await counting.ingest(_delivery(_alert("fp-b", "gpu-002")), T0)).repeated_alerts
    assert first == 1
    # Then it is remembered.
    assert await counting.count_repeats([("fp-b", T0, "firing")], T0) == 1
    # Remembered as firing: its resolution is no repeat, and the database stores it.
    assert await counting.count_repeats([("fp-b", T0, "resolved")], T0) is None
    resolved = await counting.ingest(_delivery(_alert("fp-b", "gpu-002", status="resolved")), T0)
    assert resolved.resolved == 1
    # A stale firing after the resolution is a repeat, from memory or not.
    assert await storing.count_repeats([("fp-b", T0, "firing")], T0) == 1


@pytest.mark.parametrize("stores", ["postgres"], indirect=True)
async def test_postgres_answers_repeats_from_memory_only_while_it_commits(stores: Stores) -> None:
    assert stores.database is not None
    store = await stores.open()
    await store.ingest(_delivery(_alert("fp-c", "gpu-003")), T0)
    database = stores.database
    with psycopg.connect(database.server.url(database.name), password=database.server.password) as lock:
        lock.execute("LOCK TABLE alerts, alert_deliveries IN ACCESS EXCLUSIVE MODE")
        # Just committed: memory answers, though the database could not.
        counted = await asyncio.wait_for(store.count_repeats([("fp-c", T0, "firing")], T0), timeout=0.5)
        assert counted == 1
        await asyncio.sleep(postgres.FRESH + 0.3)  # nothing committed since (the counts wait too)
        asking = asyncio.ensure_future(store.count_repeats([("fp-c", T0, "firing")], T0))
        done, _ = await asyncio.wait([asking], timeout=0.5)
        assert not done, "answered from memory though the database had committed nothing for a while"
        lock.commit()  # the database answers again
    assert await asyncio.wait_for(asking, timeout=5) == 1
    counted = await asyncio.wait_for(store.count_repeats([("fp-c", T0, "firing")], T0), timeout=0.5)
    assert counted == 1


@pytest.mark.parametrize("stores", ["postgres", "pgbouncer"], indirect=True)
async def test_connections_the_server_ended_in_a_quiet_spell_are_replaced_before_use(stores: Stores) -> None:
    """A quiet store's connections are ended under it (here the server's ``idle_session_timeout``;
    as well a pooler's or a load balancer's idle limit, a failover): the first write, read and
    lease renewal after the quiet spell succeed all the same (``postgres.CHECK_AFTER``)."""
    assert stores.database is not None
    database = stores.database
    with database.connect() as admin:
        admin.execute(f'ALTER DATABASE "{database.name}" SET idle_session_timeout = 300')
        store = await stores.open()
        await store.ingest(_delivery(_alert("fp-q1", "gpu-031")), T0)
        lease = await store.acquire_lease("replica-a", timedelta(seconds=60))

        def sessions() -> int:
            [(count,)] = admin.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
                " AND pid != pg_backend_pid()"
            ).fetchall()
            return int(count)

        for _ in range(100):  # the server ends every session of the store (or of the pooler)
            if sessions() == 0:
                break
            await asyncio.sleep(0.1)
        assert sessions() == 0
        # Every connection was last used before the server ended it: unused for CHECK_AFTER now
        # (one the pool made in the background after the test's last call included).
        await asyncio.sleep(postgres.CHECK_AFTER)
    outcome = await store.ingest(_delivery(_alert("fp-q2", "gpu-032")), T0)
    assert len(outcome.opened) == 1
    assert len(await store.active()) == 2
    renewed = await store.renew_lease("replica-a", lease.epoch, timedelta(seconds=60))
    assert renewed is not None and renewed.epoch == lease.epoch


@pytest.mark.parametrize("stores", ["postgres"], indirect=True)
async def test_a_pool_of_connections_the_server_ended_is_replaced_at_the_first_read(
    stores: Stores, capsys: pytest.CaptureFixture[str]
) -> None:
    """Six pooled connections, all ended by the server in a quiet spell (a restart, a failover):
    the first read after it finds one dead and replaces them all, and succeeds. psycopg_pool's own
    check would try them one by one, waiting 1 s, 2 s, 4 s... between them, and fail the read at
    the pool's timeout."""
    assert stores.database is not None
    database = stores.database
    store = await stores.open()
    await store.ingest(_delivery(_alert("fp-p1", "gpu-061")), T0)

    sessions = "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'pitcrew'"
    with database.connect() as holder, database.connect() as watch:
        with holder.transaction():  # reads wait, so the pool opens a connection for each
            holder.execute("LOCK TABLE incidents IN ACCESS EXCLUSIVE MODE")
            reads = asyncio.gather(*(store.active() for _ in range(6)))
            opened = 0
            for _ in range(200):
                row = watch.execute(sessions).fetchone()
                opened = int(str(row[0])) if row is not None else 0
                if opened >= 7:  # six reads and the writes' connection
                    break
                await asyncio.sleep(0.05)
        assert [len(found) for found in await reads] == [1] * 6
        assert opened >= 7, opened
        watch.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = 'pitcrew'"
        )
    await asyncio.sleep(postgres.CHECK_AFTER)  # a quiet spell: each is checked before use
    began = time.monotonic()
    assert len(await store.active()) == 1
    show_figure(capsys, f"  six dead pooled connections: the first read took {time.monotonic() - began:.2f}s")


@pytest.mark.parametrize("stores", ["postgres"], indirect=True)
async def test_a_connection_is_unused_from_its_last_use_not_from_when_the_pool_took_it_back(
    stores: Stores,
) -> None:
    """The event loop busy right after a read (a storm's handlers; here a blocking pause) while
    the server ends the read's session (a restart, a failover): a read ``CHECK_AFTER`` after the
    first checks its connection, which was last used then. The pool takes a connection back in a
    worker task that runs only once the loop is free: had the last use been recorded there, the
    dead connection would look used a moment ago and fail the read unchecked."""
    assert stores.database is not None
    database = stores.database
    store = await stores.open()
    await store.ingest(_delivery(_alert("fp-b1", "gpu-071")), T0)
    with database.connect() as admin:
        for _ in range(3):
            assert len(await store.active()) == 1  # the pool's idle connection, used
            time.sleep(0.4)  # the loop busy: nothing else runs, the pool's worker included
            admin.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = 'pitcrew'"
            )
            await asyncio.sleep(postgres.CHECK_AFTER - 0.3)  # the last use CHECK_AFTER + 0.1 s ago
            assert len(await store.active()) == 1


@pytest.mark.parametrize("stores", ["postgres"], indirect=True)
async def test_a_rotated_password_is_used_from_the_next_connection_on(stores: Stores, tmp_path: Path) -> None:
    """The role's password is changed and its Secret's file replaced (as the kubelet does: a new
    file renamed into place), then the server ends the store's sessions (a failover, a restart):
    the next write, read and lease renewal connect again with the new password. Read once at
    start, the old one was refused on every new connection until pitcrew restarted. A password
    file missing meanwhile fails those uses as the store being unavailable (503, retried), and
    they succeed once it is back."""
    assert stores.database is not None
    database = stores.database
    role = f"rotating_{database.name}"
    password_file = tmp_path / "password"

    def rotate(password: str) -> None:
        staged = tmp_path / "password.new"
        staged.write_text(password + "\n")
        staged.rename(password_file)

    def end_sessions() -> None:
        admin.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = %s", (role,))

    with database.login_role(role, "first-password") as url, database.connect() as admin:
        admin.execute(f'ALTER DATABASE "{database.name}" OWNER TO {role}')
        rotate("first-password")
        store = PostgresStore(url, password_file=password_file)
        await store.open()
        try:
            assert (await store.ingest(_delivery(_alert("fp-r1", "gpu-081")), T0)).opened
            lease = await store.acquire_lease("replica-a", timedelta(seconds=60))

            admin.execute(f"ALTER ROLE {role} PASSWORD 'second-password'")
            rotate("second-password")
            end_sessions()
            await asyncio.sleep(postgres.CHECK_AFTER)  # the next use checks its connection
            assert (await store.ingest(_delivery(_alert("fp-r2", "gpu-082")), T0)).opened
            assert len(await store.active()) == 2
            assert await store.renew_lease("replica-a", lease.epoch, timedelta(seconds=60)) is not None

            password_file.unlink()
            end_sessions()
            await asyncio.sleep(postgres.CHECK_AFTER)
            with pytest.raises(StoreUnavailable, match="password file"):
                await store.ingest(_delivery(_alert("fp-r3", "gpu-083")), T0)
            rotate("second-password")
            assert (await store.ingest(_delivery(_alert("fp-r3", "gpu-083")), T0)).opened
            assert len(await store.active()) == 3
        finally:
            await store.close()


@pytest.mark.parametrize("stores", ["postgres"], indirect=True)
async def test_a_read_cancelled_while_its_connection_is_checked_gives_the_connection_back(
    stores: Stores,
) -> None:
    """A read given up (a readiness probe's timeout) while the connection it took is being checked
    after a quiet spell, the server slow to answer: the connection goes back to the pool. Three
    such reads on a pool of two, then a read succeeds; were each to keep its connection, the pool
    would be empty after two and the read would fail at the pool's timeout."""
    assert stores.database is not None
    database = stores.database
    store = PostgresStore(database.url, password_file=database.password_file, pool_size=2, connect_timeout=2)
    await store.open()
    stopped: set[int] = set()
    try:
        assert await store.active() == []
        loop = asyncio.get_running_loop()
        with database.connect() as admin:
            for _ in range(3):
                await asyncio.sleep(postgres.CHECK_AFTER)  # the next use checks its connection
                pids = {
                    int(row[0])
                    for row in admin.execute(
                        "SELECT pid FROM pg_stat_activity WHERE application_name = 'pitcrew'"
                    ).fetchall()
                }
                assert pids
                for pid in pids:  # the server answers nothing until they go on
                    os.kill(pid, signal.SIGSTOP)
                    stopped.add(pid)
                    loop.call_later(0.6, os.kill, pid, signal.SIGCONT)
                with pytest.raises(TimeoutError):
                    async with asyncio.timeout(0.2):
                        await store.active()
                await asyncio.sleep(0.7)  # every one going on again (the cancelled check's end)
        assert await store.active() == []
    finally:
        for pid in stopped:  # never left stopped, whatever failed
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
        await store.close()


@pytest.mark.parametrize("stores", ["postgres"], indirect=True)
async def test_a_read_cancelled_as_the_pool_hands_it_a_connection_is_cancelled(stores: Stores) -> None:
    """A read waiting for the pool's one connection, cancelled in the very turns the connection is
    handed to it (a leader stepping down stops its engine just as a drained pool refills): it ends
    cancelled, never as if it had not been asked to stop. psycopg_pool waits with
    ``asyncio.wait_for``, which on Python 3.11 swallows such a cancellation; the task went on, and
    the step-down that stopped it waited for ever (a CI run of ``test_fencing.py``)."""
    assert stores.database is not None
    store = PostgresStore(stores.database.url, password_file=stores.database.password_file, pool_size=1)
    await store.open()
    lost = []
    try:
        with stores.database.connect() as admin:
            for turns in [n for n in range(6) for _ in range(2)]:
                with admin.transaction():  # the first read holds the one connection, waiting
                    admin.execute("LOCK TABLE incidents IN ACCESS EXCLUSIVE MODE")
                    holding = asyncio.create_task(store.active())
                    waiting = asyncio.create_task(store.active())
                    await asyncio.sleep(0.2)  # the second waits for the pool's connection
                await holding  # gives its connection back: handed to the waiting read
                for _ in range(turns):
                    await asyncio.sleep(0)
                asked = waiting.cancel()
                try:
                    await waiting
                except asyncio.CancelledError:
                    continue
                if asked:
                    lost.append(turns)
        assert not lost, f"cancellations lost, so many turns after the hand-over: {lost}"
        assert await store.active() == []  # the connection went back to the pool
    finally:
        await store.close()


@pytest.mark.parametrize("stores", ["postgres"], indirect=True)
async def test_a_readiness_probe_on_a_server_that_stopped_answering_says_not_ready_in_time(
    stores: Stores, capsys: pytest.CaptureFixture[str]
) -> None:
    """The server's sessions stop answering (its node frozen, a link gone silent): ``ping`` says
    "not ready" after ``PING_TIMEOUT``, inside the readiness probe's own timeout, and does not wait
    on the driver's cancelling of the statement (psycopg waits up to 5 s for the server to confirm
    it); once the server answers again, the probe says ready."""
    assert stores.database is not None
    store = await stores.open()
    assert await store.ping()
    stopped: set[int] = set()
    try:
        with stores.database.connect() as admin:
            rows = admin.execute("SELECT pid FROM pg_stat_activity WHERE application_name = 'pitcrew'")
            stopped = {int(row[0]) for row in rows.fetchall()}
            for pid in stopped:
                os.kill(pid, signal.SIGSTOP)
            began = time.monotonic()
            assert not await store.ping()
            took = time.monotonic() - began
    finally:
        for pid in stopped:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
    show_figure(capsys, f"  server stopped answering: the probe said not ready after {took:.2f}s")
    assert took < 3, took  # the Deployment's readinessProbe timeoutSeconds: 3
    for _ in range(50):
        if await store.ping():
            break
        await asyncio.sleep(0.1)
    else:
        raise AssertionError("not ready after the server answers again")


@pytest.mark.parametrize("stores", ["postgres"], indirect=True)
async def test_a_server_idle_limit_shorter_than_the_check_is_heeded(stores: Stores) -> None:
    """The server ends sessions idle for 400 ms, less than ``CHECK_AFTER``: a connection unused
    for longer than that, but not for ``CHECK_AFTER``, is checked before use all the same (the
    store read the limit at open), so each write, read and renewal after such a pause succeeds."""
    assert stores.database is not None
    database = stores.database
    with database.connect() as admin:
        admin.execute(f'ALTER DATABASE "{database.name}" SET idle_session_timeout = 400')
    store = await stores.open()
    lease = await store.acquire_lease("replica-a", timedelta(seconds=60))
    for n in range(3):
        await asyncio.sleep(0.7)  # past the server's limit, short of CHECK_AFTER
        outcome = await store.ingest(_delivery(_alert(f"fp-l{n}", f"gpu-05{n}")), T0)
        assert len(outcome.opened) == 1
        assert len(await store.active()) == n + 1
        renewed = await store.renew_lease("replica-a", lease.epoch, timedelta(seconds=60))
        assert renewed is not None and renewed.epoch == lease.epoch


@pytest.mark.parametrize("stores", ["postgres"], indirect=True)
async def test_a_database_that_takes_no_writes_is_the_store_unavailable(stores: Stores) -> None:
    """Connected to a server that takes no writes (a standby, a primary a failover demoted: here
    the database made read-only for new sessions, which answers the same "read-only transaction"):
    a write and a lease renewal fail as the store being unavailable (a webhook's 503), and every
    connection the store had to it is given up, so once the database takes writes again the next
    write goes through."""
    assert stores.database is not None
    database = stores.database
    store = await stores.open()
    lease = await store.acquire_lease("replica-a", timedelta(seconds=60))
    with database.connect() as admin:
        admin.execute(f'ALTER DATABASE "{database.name}" SET default_transaction_read_only = on')
        admin.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
            " WHERE datname = current_database() AND pid != pg_backend_pid()"
        )
        await asyncio.sleep(postgres.CHECK_AFTER)  # the store's connections are replaced: read-only
        # Reads still work, on several sessions at once: each waits for the incidents, which this
        # session holds locked meanwhile, so none hands its connection on to the next (six reads
        # at once were sometimes served by one session, and the check below saw only one).
        admin.execute("BEGIN")
        admin.execute("LOCK TABLE incidents IN ACCESS EXCLUSIVE MODE")
        reads = [asyncio.ensure_future(store.active()) for _ in range(6)]
        waiting = "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'pitcrew' AND wait_event_type = 'Lock'"
        for _ in range(100):
            await asyncio.sleep(0.05)
            admin.execute("SELECT pg_stat_clear_snapshot()")  # else the first one read, all along
            row = admin.execute(waiting).fetchone()
            if row is not None and row[0] > 1:
                break
        admin.execute("COMMIT")
        await asyncio.gather(*reads)
        assert not await store.ping()  # not ready: /readyz takes it out of the Service
        seen = await store.inspect()
        assert not seen.ok and "read-only for this role" in seen.detail, seen
        sessions = "SELECT pid FROM pg_stat_activity WHERE application_name = 'pitcrew'"
        before = {row[0] for row in admin.execute(sessions).fetchall()}
        with pytest.raises(StoreUnavailable, match="read-only transaction"):
            await store.ingest(_delivery(_alert("fp-ro", "gpu-041")), T0)
        with pytest.raises(StoreUnavailable, match="read-only transaction"):
            await store.renew_lease("replica-a", lease.epoch, timedelta(seconds=60))
        for _ in range(100):  # the pool closes them in the background
            kept = before & {row[0] for row in admin.execute(sessions).fetchall()}
            if not kept:
                break
            await asyncio.sleep(0.05)
        assert len(before) > 1 and not kept, f"{len(kept)} of the store's {len(before)} sessions kept"
        # Writes taken again as a real server takes them again: restarted (promoted or not), its
        # sessions ended. (Sessions begun read-only here would stay so: a standby's do not.)
        admin.execute(f'ALTER DATABASE "{database.name}" SET default_transaction_read_only = off')
        admin.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
            " WHERE datname = current_database() AND pid != pg_backend_pid()"
        )
        await asyncio.sleep(postgres.CHECK_AFTER)  # the ended connections are replaced, not failed
    assert await store.ping()
    outcome = await store.ingest(_delivery(_alert("fp-ro", "gpu-041")), T0)
    assert len(outcome.opened) == 1
    renewed = await store.renew_lease("replica-a", lease.epoch, timedelta(seconds=60))
    assert renewed is not None and renewed.epoch == lease.epoch


@pytest.mark.parametrize("stores", ["postgres"], indirect=True)
async def test_a_postgres_replica_taking_only_repeats_stays_fresh_by_its_own_counts(stores: Stores) -> None:
    """No write but the counts' own commits, for longer than ``FRESH``: memory answers every repeat
    (the alerts table, which a lookup would read, is locked all along), and every count is kept."""
    assert stores.database is not None
    store, other = await stores.open(), await stores.open()
    outcome = await store.ingest(_delivery(_alert("fp-d", "gpu-004")), T0)
    database = stores.database
    counted = 0
    with psycopg.connect(database.server.url(database.name), password=database.server.password) as lock:
        lock.execute("LOCK TABLE alerts IN ACCESS EXCLUSIVE MODE")
        until = time.monotonic() + 3 * postgres.FRESH
        while time.monotonic() < until:
            found: int | None = await asyncio.wait_for(
                store.count_repeats([("fp-d", T0, "firing")], T0), timeout=0.5
            )
            counted += found or 0
            await asyncio.sleep(0)
    [incident] = outcome.opened
    await store.close()
    [alert] = await other.alerts_of(incident)
    assert alert.deliveries == 1 + counted


async def test_a_delivery_waiting_for_another_session_s_lock_does_not_hold_the_event_loop(
    stores: Stores,
) -> None:
    """SQLite begins a delivery's transaction on the event loop's own thread (``bot.store.writer``):
    it must never wait for the lock there, or every request waits with it (SQLite's busy timeout is
    10 s). The delivery waits elsewhere, and is stored once the lock is let go."""
    store = await stores.open()
    await store.ingest(_delivery(_alert("fp-w0", "gpu-001")), T0)  # open and warm
    with stores.writes_locked():
        storing = asyncio.ensure_future(store.ingest(_delivery(_alert("fp-w1", "gpu-002")), T0))
        began = time.monotonic()
        await asyncio.sleep(0.2)
        blocked = time.monotonic() - began
        assert blocked < 3, (
            f"the event loop stood still {blocked:.1f}s while the delivery waited for the lock"
        )
        assert not storing.done(), storing
    outcome = await asyncio.wait_for(storing, timeout=15)
    assert (outcome.new_alerts, outcome.opened) == (1, ["pc-00002"])


async def test_a_new_fault_on_an_incident_under_way_marks_it_changed(stores: Stores) -> None:
    store = await stores.open()
    (incident_id,) = (await store.ingest(_delivery(_alert("a", "gpu-001")), T0)).opened
    await store.transition(incident_id, State.GUARDED, T0, guarded=True)
    later = T0 + timedelta(seconds=1)
    out = await store.ingest(_delivery(_alert("b", "gpu-001", starts=later, xid=48)), later)
    assert out.changed == [incident_id]
    record = await store.incident(incident_id)
    assert record is not None and record.faults_changed
    await store.ack_faults(incident_id)
    record = await store.incident(incident_id)
    assert record is not None and not record.faults_changed
    assert [f.xid for f in record.faults] == [79, 48]  # in order of first occurrence
    # Two alerts of one fault starting at the same instant are one fault, in the incident read
    # and in the list of incidents alike; so are many alerts of it.
    twins = [_alert(f"c{n}", "gpu-001", starts=later, xid=48) for n in range(3)]
    await store.ingest(_delivery(*twins), later)
    for read in (await store.incident(incident_id), *(await store.incidents(node="gpu-001"))):
        assert read is not None and [f.xid for f in read.faults] == [79, 48]


async def test_steps_skipped_at_once_end_each_and_move_the_cursor(stores: Stores) -> None:
    """``steps_skipped``: each step ended as skipped with its result (a superseded record's replaced),
    its event in the order given, and the cursor moved, in one write; nothing else of the incident
    changes. ``step_finished`` with ``step_index`` moves the cursor with the step's end."""
    store = await stores.open()
    (incident_id,) = (await store.ingest(_delivery(_alert("fp1", "gpu-001")), T0)).opened
    await store.save_plan(incident_id, _plan("gpu-001"), [NewEvent("planned")], T0)
    await store.step_finished(
        incident_id, "drain", "superseded", T0, result={"old": 1}, event=NewEvent("superseded", step="drain")
    )
    later = T0 + timedelta(seconds=5)
    skips = [
        SkippedStep(
            step, {"would": f"{step} it"}, NewEvent("step_skipped", step=step, detail=f"would {step}")
        )
        for step in ("slurm_down", "cordon", "drain")
    ]
    await store.steps_skipped(incident_id, skips, 5, later)
    steps = await store.steps_of(incident_id)
    for step in ("slurm_down", "cordon", "drain"):
        assert (steps[step].status, steps[step].result) == ("skipped", {"would": f"{step} it"})
        assert steps[step].ended_at == later
    events = [e for e in await store.events_of(incident_id) if e.kind == "step_skipped"]
    assert [(e.step, e.detail, e.at) for e in events] == [
        ("slurm_down", "would slurm_down", later),
        ("cordon", "would cordon", later),
        ("drain", "would drain", later),
    ]
    record = await store.incident(incident_id)
    assert record is not None and record.step_index == 5 and not record.acted
    assert record.state is State.OPEN
    # Read together, an incident and its steps are what each read alone says.
    alone = (await store.incident(incident_id), await store.steps_of(incident_id))
    assert await store.incident_and_steps(incident_id) == alone
    assert await store.incident_and_steps("pc-none") == (None, {})
    # A step's end may move the cursor too, in the same write.
    ended = NewEvent("step_finished", step="replace", outcome="ok")
    await store.step_finished(
        incident_id, "replace", "ok", later, result={"done": 1}, event=ended, step_index=6
    )
    record = await store.incident(incident_id)
    assert record is not None and record.step_index == 6
    assert (await store.steps_of(incident_id))["replace"].result == {"done": 1}


async def test_what_was_opened_after_a_look(stores: Stores) -> None:
    store = await stores.open()
    assert await store.last_opened() == 0 and await store.opened_after(0) == []
    (first,) = (await store.ingest(_delivery(_alert("fp1", "gpu-001")), T0)).opened
    seen = await store.last_opened()
    assert [(i, s) for _, i, s in await store.opened_after(0)] == [(first, State.OPEN)]
    assert await store.opened_after(seen) == []
    second, third = (
        await store.ingest(_delivery(_alert("fp2", "gpu-002"), _alert("fp3", "gpu-003")), T0)
    ).opened
    await store.transition(second, State.SUPPRESSED, T0, event=NewEvent("closed"))
    found = await store.opened_after(seen)
    # Closed ones too, oldest first, each with its seq: the newest is the store's last.
    assert sorted(found) == found and [(i, s) for _, i, s in found] == [
        (second, State.SUPPRESSED),
        (third, State.OPEN),
    ]
    assert found[-1][0] == await store.last_opened() and seen < found[0][0]
    assert await store.opened_after(found[-1][0]) == []


async def test_an_incident_s_life(stores: Stores) -> None:
    store = await stores.open()
    (incident_id,) = (await store.ingest(_delivery(_alert("fp1", "gpu-001")), T0)).opened
    await store.save_plan(incident_id, _plan("gpu-001"), [NewEvent("planned", detail="replace")], T0)
    guarded = await store.transition(incident_id, State.GUARDED, T0, guarded=True, event=NewEvent("guarded"))
    assert guarded.state is State.GUARDED and guarded.guarded_at == T0
    assert guarded.plan is not None and guarded.plan.playbook == "replace-node"

    await store.step_started(incident_id, "slurm_down", 1, T0, acted=True)
    await store.step_progress(incident_id, "slurm_down", {"intent": "down"}, T0)
    steps = await store.steps_of(incident_id)
    assert steps["slurm_down"].status == "running" and steps["slurm_down"].result == {"intent": "down"}
    await store.step_finished(
        incident_id,
        "slurm_down",
        "ok",
        T0,
        result={"done": True},
        event=NewEvent("step_ok", step="slurm_down"),
    )
    await store.advance(incident_id, 2, T0)
    record = await store.incident(incident_id)
    assert record is not None and record.acted and record.step_index == 2
    assert (await store.steps_of(incident_id))["slurm_down"].result == {"done": True}

    assert await store.nodes_in_remediation(T0 - timedelta(hours=1)) == frozenset({"gpu-001"})
    # What the guards read, read together, is what each read alone says.
    await store.set_switch("pause", {"reason": "maintenance"}, "cli:ops", T0)
    for node in ("gpu-001", "gpu-002"):
        together = await store.guard_reads(
            ("pause", "breaker"),
            node=node,
            remediation_since=T0 - timedelta(hours=1),
            history_since=T0 - timedelta(days=1),
            exclude="pc-none",
        )
        assert together.switches == {"pause": await store.switch("pause"), "breaker": None}
        assert together.switches["pause"] is not None
        assert together.nodes_in_remediation == await store.nodes_in_remediation(
            T0 - timedelta(hours=1), exclude_node=node
        )
        assert together.history == await store.history(node, T0 - timedelta(days=1), exclude="pc-none")
    await store.set_switch("pause", None, "cli:ops", T0)
    assert await store.nodes_in_remediation(T0 - timedelta(hours=1), exclude_node="gpu-001") == frozenset()
    assert [i for i, _, _ in await store.active()] == [incident_id]

    # It may not close while one of its alerts fires; it closes once they are resolved.
    kept = await store.transition(incident_id, State.RESOLVED, T0, unless="firing")
    assert kept.state is State.GUARDED
    await store.ingest(_delivery(_alert("fp1", "gpu-001", status="resolved")), T0 + timedelta(minutes=5))
    closed = await store.transition(
        incident_id, State.RESOLVED, T0 + timedelta(minutes=6), unless="firing", outcome="recovered"
    )
    assert closed.state is State.RESOLVED and closed.closed_at == T0 + timedelta(minutes=6)
    assert closed.outcome == "recovered"
    assert await store.active() == []
    assert await store.incidents(active_only=True) == []
    assert [i.id for i in await store.incidents(node="gpu-001")] == [incident_id]
    (past,) = await store.history("gpu-001", T0 - timedelta(days=1))
    assert (past.incident_id, past.playbook, past.acted) == (incident_id, "replace-node", True)
    assert await store.history("gpu-001", T0 - timedelta(days=1), exclude=incident_id) == []
    # The node's next fault opens a new incident.
    reopened = await store.ingest(_delivery(_alert("fp9", "gpu-001")), T0 + timedelta(hours=1))
    assert reopened.opened == ["pc-00002"]


async def test_the_breaker_counts_incidents_under_way_and_ended_ones_that_changed_their_node(
    stores: Stores,
) -> None:
    """Nodes in remediation (the breaker's count): an incident admitted in the window holds its
    node's place while under way, and once ended only if pitcrew changed something for it (an
    action in its audit log); one admitted before the window, or never admitted, holds none."""
    store = await stores.open()
    ids: dict[str, str] = {}
    for node in ("under-way", "acted", "gave-back", "before", "never", "acted-before"):
        (ids[node],) = (await store.ingest(_delivery(_alert(f"fp-{node}", node)), T0)).opened
        await store.save_plan(ids[node], _plan(node), [], T0)
    window = T0 - timedelta(hours=1)
    for node in ("under-way", "acted", "gave-back"):
        await store.transition(ids[node], State.GUARDED, T0, guarded=True)
    for node in ("before", "acted-before"):
        await store.transition(ids[node], State.GUARDED, window - timedelta(minutes=1), guarded=True)
    for node in ("acted", "acted-before"):
        await store.record(ids[node], NewEvent(ACTION, step="slurm_down", detail="DOWN"), T0)
    for node, state in (
        ("acted", State.RESOLVED),
        ("gave-back", State.FAILED),
        ("acted-before", State.FAILED),
    ):
        await store.transition(ids[node], state, T0)
    assert await store.nodes_in_remediation(window) == frozenset({"under-way", "acted"})
    assert await store.nodes_in_remediation(window, exclude_node="acted") == frozenset({"under-way"})
    assert await store.nodes_in_remediation(window - timedelta(hours=1)) == frozenset(
        {"under-way", "acted", "before", "acted-before"}
    )


async def test_the_timeline_pages_and_the_audit_log_is_append_only(stores: Stores) -> None:
    store = await stores.open()
    (incident_id,) = (await store.ingest(_delivery(_alert("fp1", "gpu-001")), T0)).opened
    for n in range(5):
        await store.record(incident_id, NewEvent("note", detail=f"n{n}", actor="cli:ops"), T0)
    events = await store.events_of(incident_id)
    assert [e.kind for e in events] == ["incident_opened", "alert_firing"] + ["note"] * 5
    assert [e.seq for e in events] == sorted(e.seq for e in events)
    page = await store.events_page(incident_id, limit=3)
    assert [e.kind for e in page.items] == ["incident_opened", "alert_firing", "note"]
    assert page.next is not None
    rest = await store.events_page(incident_id, limit=10, after=page.next)
    assert [e.detail for e in rest.items] == ["n1", "n2", "n3", "n4"] and rest.next is None
    assert [e.detail for e in await store.events_since(events[-2].seq)] == ["n4"]

    with pytest.raises(Exception, match="append-only"):
        _tamper(store, "UPDATE events SET detail = 'rewritten'")
    with pytest.raises(Exception, match="append-only"):
        _tamper(store, "DELETE FROM events")
    assert [e.detail for e in await store.events_of(incident_id)] == [e.detail for e in events]


def _tamper(store: AnyStore, sql: str) -> None:
    """Change the audit log behind the store's back, as an operator with a SQL shell could."""
    if isinstance(store, SqliteStore):
        with sqlite3.connect(store.path) as db:
            db.execute(sql)
        return
    assert isinstance(store, PostgresStore) and store._password_file is not None
    password = store._password_file.read_text().strip()
    with psycopg.connect(store.url, password=password, autocommit=True) as db:
        db.execute(sql.encode())


async def test_alert_pages(stores: Stores) -> None:
    store = await stores.open()
    alerts = [_alert(f"fp{n:02d}", "gpu-001", starts=T0 + timedelta(seconds=n)) for n in range(5)]
    (incident_id,) = (await store.ingest(_delivery(*alerts), T0)).opened
    first = await store.alerts_page(incident_id, limit=2)
    assert [a.fingerprint for a in first.items] == ["fp00", "fp01"] and first.next is not None
    second = await store.alerts_page(incident_id, limit=10, after=first.next)
    assert [a.fingerprint for a in second.items] == ["fp02", "fp03", "fp04"] and second.next is None


async def test_the_alerts_of_some_nodes_latest_first(stores: Stores) -> None:
    """What a hung-job notice names: the nodes' alerts firing, or started or ended since the window's
    start, whatever their incident, latest first, bounded, none of the excluded name."""
    store = await stores.open()
    hour = timedelta(hours=1)
    ended = [_alert(fp, "gpu-001", starts=T0 - 3 * hour) for fp in ("old", "gone")]  # end at T0+5m
    stuck = _alert("stuck", "gpu-002", starts=T0 - 5 * hour)  # still firing: always shown
    recent = [_alert(f"r{n}", "gpu-001", starts=T0 + timedelta(minutes=n)) for n in range(3)]
    elsewhere = _alert("elsewhere", "gpu-003", starts=T0)
    for alert in (*ended, stuck, *recent, elsewhere):
        await store.ingest(_delivery(alert), T0)
    for fp in ("old", "gone"):
        await store.ingest(_delivery(_alert(fp, "gpu-001", starts=T0 - 3 * hour, status="resolved")), T0)
    found = await store.alerts_on(("gpu-001", "gpu-002"), T0, limit=10)
    assert [a.fingerprint for a in found] == ["r2", "r1", "r0", "gone", "old", "stuck"]
    assert [a.status for a in found[3:5]] == ["resolved", "resolved"]
    later = await store.alerts_on(("gpu-001",), T0 + hour, limit=10)  # the two ended before it
    assert [a.fingerprint for a in later] == ["r2", "r1", "r0"]
    assert [a.fingerprint for a in await store.alerts_on(("gpu-001",), T0, limit=2)] == ["r2", "r1"]
    assert await store.alerts_on(("gpu-001", "gpu-002"), T0, limit=10, other_than="GpuXid") == []
    assert await store.alerts_on((), T0, limit=10) == []


async def test_what_a_watch_remembers(stores: Stores) -> None:
    """Entries by watch and key: written, changed, forgotten (``None``) in one write each; another
    watch's are its own."""
    store = await stores.open()
    assert await store.memory("slurm") == {}
    await store.remember("slurm", {"gpu-001": {"jobs": ["4711"]}, "gpu-002": {"jobs": []}}, T0)
    await store.remember("hung", {"4711": {"value": 7.0}}, T0)
    await store.remember("slurm", {"gpu-001": {"jobs": ["4712"]}, "gpu-002": None, "gpu-404": None}, T0)
    await store.remember("slurm", {}, T0)  # nothing changed: nothing written
    assert await store.memory("slurm") == {"gpu-001": {"jobs": ["4712"]}}
    assert await store.memory("hung") == {"4711": {"value": 7.0}}


async def test_approvals_are_decided_once_and_rollbacks_recorded_once(stores: Stores) -> None:
    store = await stores.open()
    (incident_id,) = (await store.ingest(_delivery(_alert("fp1", "gpu-001")), T0)).opened
    deadline = T0 + timedelta(minutes=30)
    asked = await store.request_approval(incident_id, "approve", ["slack:U1"], deadline, T0)
    assert (asked.status, asked.approvers, asked.deadline) == ("pending", ("slack:U1",), deadline)
    decided = await store.decide_approval(incident_id, "approved", "slack:U1", T0 + timedelta(minutes=1))
    assert decided is not None and (decided.status, decided.decided_by) == ("approved", "slack:U1")
    assert await store.decide_approval(incident_id, "rejected", "slack:U2", T0) is None

    event = NewEvent("rollback_requested", actor="cli:ops")
    assert await store.request_rollback(incident_id, {"by": "cli:ops"}, event, T0)
    assert not await store.request_rollback(incident_id, {"by": "http:x"}, event, T0)
    assert await store.rollbacks_requested() == [incident_id]
    kinds = [e.kind for e in await store.events_of(incident_id)]
    assert kinds.count("rollback_requested") == 1
    # Undone, and cut before the incident ended rolled back: still listed, until it shows it.
    done = NewEvent("rollback_done", actor="cli:ops")
    await store.step_finished(incident_id, "rollback", "ok", T0, result={"by": "cli:ops"}, event=done)
    assert await store.rollbacks_requested() == [incident_id]
    await store.transition(incident_id, State.ROLLED_BACK, T0, outcome="rolled back by cli:ops")
    assert await store.rollbacks_requested() == []
    # Asked again (the rollback kept a change): a done one starts anew, once; never one under way.
    assert not await store.request_rollback(incident_id, {"by": "cli:x"}, event, T0)
    later = T0 + timedelta(hours=1)
    assert await store.request_rollback(incident_id, {"by": "cli:ops2"}, event, later, again=True)
    assert not await store.request_rollback(incident_id, {"by": "cli:ops3"}, event, later, again=True)
    anew = (await store.steps_of(incident_id))["rollback"]
    assert (anew.status, anew.result, anew.started_at) == ("running", {"by": "cli:ops2"}, later)
    assert await store.rollbacks_requested() == [incident_id]
    kinds = [e.kind for e in await store.events_of(incident_id)]
    assert kinds.count("rollback_requested") == 2

    await store.set_switch("pause", {"reason": "maintenance"}, "cli:ops", T0)
    assert await store.switch("pause") == {
        "reason": "maintenance",
        "set_by": "cli:ops",
        "set_at": T0.isoformat(timespec="microseconds"),
    }
    await store.set_switch("pause", None, "cli:ops", T0)
    assert await store.switch("pause") is None


async def test_the_outbox_and_the_references(stores: Stores) -> None:
    store = await stores.open()
    woken: list[str] = []
    store.route_events(frozenset({"step_ok"}), "slack", wake=lambda: woken.append("slack"))
    (incident_id,) = (await store.ingest(_delivery(_alert("fp1", "gpu-001")), T0)).opened
    seq = await store.enqueue(
        incident_id, NewEvent("notice"), "incident", {"title": "XID 79"}, ["slack", "grafana"], T0
    )
    (slack,) = await store.outbox_pending("slack")
    (grafana,) = await store.outbox_pending("grafana")
    assert (slack.event_seq, slack.payload, slack.kind) == (seq, {"title": "XID 79"}, "incident")
    assert grafana.id != slack.id and woken == []

    await store.step_finished(
        incident_id, "notify", "ok", T0, event=NewEvent("step_ok", step="notify", detail="posted")
    )
    assert woken == ["slack"]  # woken once the routed event committed
    routed = (await store.outbox_pending("slack"))[-1]
    assert routed.kind == "step_ok" and routed.payload["detail"] == "posted"

    await store.outbox_attempt(slack.id, T0)
    await store.outbox_defer(slack.id, T0 + timedelta(seconds=30), "ratelimited " * 100)
    deferred = await store.outbox_item(slack.id)
    assert deferred is not None and deferred.attempts == 1
    assert deferred.not_before == T0 + timedelta(seconds=30) and len(deferred.last_error) == 500
    await store.outbox_delivered(slack.id, "C0GPUOPS/1.000100", T0 + timedelta(seconds=31))
    done = await store.outbox_item(slack.id)
    assert done is not None and done.delivered_at is not None and done.ref == "C0GPUOPS/1.000100"
    assert [i.id for i in await store.outbox_pending("slack")] == [routed.id]
    assert await store.outbox_item(10_000) is None

    assert await store.outbox_ref("slack", f"thread:{incident_id}") is None
    await store.set_outbox_ref("slack", f"thread:{incident_id}", "C0GPUOPS/1.000100", T0)
    await store.set_outbox_ref("slack", f"thread:{incident_id}", "C0GPUOPS/1.000200", T0)
    assert await store.outbox_ref("slack", f"thread:{incident_id}") == "C0GPUOPS/1.000200"
    await store.set_outbox_ref("slack", link_key(incident_id), "https://slack.example/p1", T0)
    await store.set_outbox_ref("grafana", link_key(incident_id), "https://grafana.example/d", T0)
    assert await store.incident_links(incident_id) == {
        "slack": "https://slack.example/p1",
        "grafana": "https://grafana.example/d",
    }


async def test_a_routed_event_s_outbox_rows_name_that_event(stores: Stores) -> None:
    """The outbox rows of a routed event, one a destination, carry its ``seq``, which the write
    never reads back (``{event_seq}``), between other events of the same and other writes."""
    store = await stores.open()
    store.route_events(frozenset({"step_ok"}), "slack")
    store.route_events(frozenset({"step_ok"}), "grafana")
    (incident_id,) = (await store.ingest(_delivery(_alert("fp1", "gpu-001")), T0)).opened
    for n, step in enumerate(["notify", "cordon"]):
        await store.record(incident_id, NewEvent("note", detail=f"before {n}"), T0)
        await store.step_finished(incident_id, step, "ok", T0, event=NewEvent("step_ok", step=step))
        await store.step_started(incident_id, step, 2, T0, acted=True)
    oks = [e.seq for e in await store.events_of(incident_id) if e.kind == "step_ok"]
    assert len(oks) == 2
    for destination in ("slack", "grafana"):
        pending = await store.outbox_pending(destination)
        assert [i.event_seq for i in pending] == oks and [i.kind for i in pending] == ["step_ok"] * 2


async def test_a_notice_a_step_posts_once_is_posted_once_per_run_of_the_step(stores: Stores) -> None:
    store = await stores.open()
    (incident_id, second) = (
        await store.ingest(_delivery(_alert("fp1", "gpu-001"), _alert("fp2", "gpu-002")), T0)
    ).opened
    notice = NewEvent("notice", step="notify", outcome="incident", detail="XID 79")

    async def post(once: str, step: str = "notify", incident: str = incident_id) -> int:
        event = replace(notice, step=step)
        return await store.enqueue(incident, event, "incident", {"title": "XID 79"}, ["slack"], T0, once=once)

    assert await store.told(incident_id, "notify", "incident") is None
    first = await post("incident")
    assert await post("incident") == first  # the step again after a crash: the notice it posted
    assert await store.told(incident_id, "notify", "incident") == first
    [event] = [e for e in await store.events_of(incident_id) if e.kind == "notice"]
    assert (event.seq, event.step, event.data[ONCE]) == (first, "notify", "incident")
    posted = {first, await post("incident:2"), await post("incident", step="close")}
    posted.add(await post("incident", incident=second))
    assert len(posted) == 4  # another key, another step, another incident: other notices
    assert len(await store.outbox_pending("slack")) == 4

    # A superseded step runs afresh: what it posts is news, once again.
    await store.step_finished(
        incident_id, "notify", "superseded", T0, event=NewEvent(SUPERSEDED, step="notify")
    )
    assert await store.told(incident_id, "notify", "incident") is None
    again = await post("incident")
    assert again not in posted and await post("incident") == again
    assert await store.told(incident_id, "close", "incident") in posted  # not another step's run
    assert len(await store.outbox_pending("slack")) == 5

    # Without ``once`` every call posts (a flow's notices); ``once`` needs a step.
    plain = NewEvent("notice", outcome="incident")
    seqs = {await store.enqueue(incident_id, plain, "incident", {}, ["slack"], T0) for _ in range(2)}
    assert len(seqs) == 2
    with pytest.raises(ValueError, match="a step"):
        await store.enqueue(incident_id, plain, "incident", {}, ["slack"], T0, once="x")
    assert len(await store.outbox_pending("slack")) == 7


async def test_a_notice_about_pitcrew_as_a_whole_posted_once_is_posted_once_for_good(stores: Stores) -> None:
    """The breaker's notice names no incident: its key says what it is about, and it holds even
    after a step of that name ran afresh somewhere (no incident-less step is ever superseded)."""
    store = await stores.open()
    (incident_id,) = (await store.ingest(_delivery(_alert("fp1", "gpu-001")), T0)).opened
    notice = NewEvent("notice", step="guards", outcome="breaker", detail="breaker opened")

    async def post(once: str, incident: str | None = None) -> int:
        return await store.enqueue(incident, notice, "breaker", {"title": "open"}, ["slack"], T0, once=once)

    assert await store.told(None, "guards", f"breaker:{incident_id}") is None
    first = await post(f"breaker:{incident_id}")
    assert await post(f"breaker:{incident_id}") == first
    assert await store.told(None, "guards", f"breaker:{incident_id}") == first
    await store.step_finished(
        incident_id, "guards", "superseded", T0, event=NewEvent(SUPERSEDED, step="guards")
    )
    assert await post(f"breaker:{incident_id}") == first
    # Another key is another notice; the incident's own notice under the same key is its own.
    others = {await post("breaker:other"), await post(f"breaker:{incident_id}", incident_id)}
    assert len(others | {first}) == 3
    assert await store.told(incident_id, "guards", f"breaker:{incident_id}") in others
    assert len(await store.outbox_pending("slack")) == 3


async def test_two_processes_on_one_store_see_each_other(stores: Stores) -> None:
    a, b = await stores.open(), await stores.open()
    assert await a.ping() and await b.ping()
    opened = (await a.ingest(_delivery(_alert("fp1", "gpu-001")), T0)).opened
    # The other process's delivery of the same alert is a repeat, of the same incident.
    out = await b.ingest(_delivery(_alert("fp1", "gpu-001"), _alert("fp2", "gpu-001")), T0)
    assert (out.repeated_alerts, out.new_alerts, out.attached) == (1, 1, opened)
    await b.record(opened[0], NewEvent("note", detail="from b"), T0)
    assert (await a.events_of(opened[0]))[-1].detail == "from b"


async def test_both_stores_have_the_same_tables_and_columns(stores: Stores) -> None:
    store = await stores.open()
    if isinstance(store, SqliteStore):
        with sqlite3.connect(store.path) as db:
            version = db.execute("PRAGMA user_version").fetchone()[0]
            tables = [
                r[0]
                for r in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")
                if not r[0].startswith("sqlite_") and r[0] != "pitcrew_schema"  # bookkeeping, as below
            ]
            columns = {t: sorted(r[1] for r in db.execute(f"PRAGMA table_info({t})")) for t in tables}
    else:
        assert isinstance(store, PostgresStore)
        version = await store.schema_version()
        rows = await store._read(
            single(
                sql.rows(
                    "SELECT table_name, column_name FROM information_schema.columns"
                    " WHERE table_schema = 'public' AND table_name != 'pitcrew_schema'"
                )
            )
        )
        columns = {}
        for r in rows:
            columns.setdefault(r["table_name"], []).append(r["column_name"])
        columns = {t: sorted(c) for t, c in columns.items()}
    assert version == SCHEMA_VERSION
    assert columns == EXPECTED_COLUMNS


EXPECTED_COLUMNS = {
    "incidents": sorted(
        [
            "id",
            "seq",
            "node",
            "state",
            "playbook",
            "mode",
            "plan_json",
            "step_index",
            "acted",
            "faults_changed",
            "opened_at",
            "updated_at",
            "first_alert_at",
            "guarded_at",
            "closed_at",
            "outcome",
            "group_key",
        ]
    ),
    "alerts": sorted(
        [
            "fingerprint",
            "starts_at",
            "ends_at",
            "status",
            "alertname",
            "node",
            "incident_id",
            "fault_key",
            "fault_json",
            "labels_json",
            "annotations_json",
            "group_key",
            "first_seen",
        ]
    ),
    "alert_deliveries": sorted(["fingerprint", "starts_at", "deliveries", "last_seen"]),
    "steps": sorted(["incident_id", "step", "status", "attempts", "started_at", "ended_at", "result_json"]),
    "approvals": sorted(
        [
            "incident_id",
            "step",
            "requested_at",
            "deadline",
            "approvers_json",
            "status",
            "decided_by",
            "decided_at",
        ]
    ),
    "switches": sorted(["name", "value_json", "set_by", "set_at"]),
    # ``audit``: which events are the audit log (migration 7).
    "events": sorted(
        [
            "seq",
            "incident_id",
            "at",
            "kind",
            "step",
            "outcome",
            "attempt",
            "actor",
            "detail",
            "data_json",
            "audit",
        ]
    ),
    "outbox": sorted(
        [
            "id",
            "destination",
            "incident_id",
            "event_seq",
            "kind",
            "payload_json",
            "created_at",
            "attempts",
            "not_before",
            "delivered_at",
            "ref",
            "last_error",
        ]
    ),
    "outbox_refs": sorted(["destination", "key", "ref", "updated_at"]),
    "leadership": sorted(["id", "holder", "epoch", "acquired_at", "renewed_at", "expires_at"]),
    "watch_memory": sorted(["watch", "key", "value_json", "updated_at"]),
}


def test_pitcrew_incidents_says_who_leads(
    stores: Stores, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """``pitcrew incidents`` reads the store the configuration names, either kind, and its lease."""
    if stores.database is not None:
        monkeypatch.setenv("PITCREW_STORE__URL", stores.database.url)
        monkeypatch.setenv("PITCREW_STORE__PASSWORD_FILE", str(stores.database.password_file))
    else:
        monkeypatch.setenv("PITCREW_STORE__PATH", str(tmp_path / "pitcrew.db"))

    async def lead() -> None:
        store = stores.make()
        await store.open()
        try:
            await store.ingest(_delivery(_alert("fp1", "gpu-001")), T0)
            await store.acquire_lease("vm/1/abc", timedelta(minutes=5))
        finally:
            await store.close()

    asyncio.run(lead())
    assert main(["incidents"]) == 0
    out = capsys.readouterr().out
    assert "pc-00001" in out and "gpu-001" in out
    assert "leader: vm/1/abc (epoch 1, since " in out


async def test_a_refused_write_fails_alone(stores: Stores) -> None:
    """Writes that reach the store at once commit or fail each on its own: one the database refuses
    (a step of an incident that does not exist) takes none of the others with it, a delivery among
    them included (SQLite's writer runs them in one transaction, rolls it back and runs each again
    alone)."""
    store = await stores.open()
    (incident_id,) = (await store.ingest(_delivery(_alert("fp1", "gpu-001")), T0)).opened
    results = await asyncio.gather(
        store.record(incident_id, NewEvent("note", detail="first"), T0),
        store.step_progress("pc-99999", "drain", {"evicting": "x"}, T0),
        store.set_switch("pause", {"paused": True}, "cli:alice", T0),
        store.ingest(_delivery(_alert("fp2", "gpu-002")), T0),  # SQLite: begun on the loop's thread
        store.step_progress(incident_id, "drain", {"evicted": ["ml/a"]}, T0),
        return_exceptions=True,
    )
    assert [isinstance(r, Exception) for r in results] == [False, True, False, False, False], results
    assert sorted(i.node for i in await store.incidents()) == ["gpu-001", "gpu-002"]
    assert (await store.events_of(incident_id))[-1].detail == "first"
    assert (await store.switch("pause") or {}).get("paused") is True
    assert (await store.steps_of(incident_id))["drain"].result == {"evicted": ["ml/a"]}
