"""Retention (``store.retention``), the same cases on SQLite and on a real PostgreSQL (``tests.harness.stores``).

Cases: a closed incident past the cut-off goes with its alerts, delivery counters, what they said
in its timeline, steps, approval, delivered notices and references, while its audit log (every
other event, the destructive actions included) stays, and the database refuses any other delete
of an event, and every update; an open incident, however old, never goes; a closed incident with a
notice not yet delivered stays until it is delivered; an incident closed after the cut-off stays;
the newest incident stays (the next one never takes its number); a pruned alert delivered again
is a new alert; another firing of a pruned alert (same fingerprint, another startsAt, in an open
incident) keeps its delivery counter; a prune is cut into bounded transactions; on Postgres a prune
takes no write lock (it goes through while another session holds it); on SQLite it runs on the
event loop, commits without an fsync of its own, starts small, and every statement of a prune
searches an index (query plans: no table scan, no sort); a standby cannot prune (the fence);
the worker counts what it removed in ``pitcrew_store_pruned_rows_total``; the service runs it
among the leader's workers only, and not at all when ``store.retention`` is null.
"""

from __future__ import annotations

import asyncio
import sqlite3
import threading
from datetime import timedelta
from pathlib import Path

import psycopg
import pytest
from prometheus_client import CollectorRegistry

from bot.config import load_config
from bot.domain.incident import State
from bot.engine.leadership import Leadership
from bot.engine.metrics import Metrics
from bot.engine.retention import Retention
from bot.runtime import build_app
from bot.store import retention
from bot.store.base import ACTION, NewEvent
from bot.store.ingest import ALERT_EVENTS
from bot.store.lease import Deposed, Fence
from bot.store.postgres import _WRITE_LOCK
from bot.store.schema import compatible_from, migrations
from bot.store.sql import SQLITE, Stmt
from bot.store.sqlite import SqliteStore
from bot.web.app import DEPS
from tests.harness.postgres import PostgresDatabase
from tests.harness.stores import (
    AnyStore,
    Stores,
    before_audit_column,
    before_check_function,
    before_guarded_indexes,
    newer_schema,
)
from tests.integration.test_store_contract import T0, _alert, _delivery, _plan
from tests.simulator.serve import WorldFile, simulated_ports

KEEP = timedelta(days=180)
LATER = T0 + timedelta(days=200)
CUTOFF = LATER - KEEP
#: What the Slack destination keeps of an incident (its thread, link, parent's payload, and the
#: parent it replaced and why, and the one it stopped editing): retention takes them all with it.
SLACK_REFS = (
    ("thread", "1.000300"),
    ("link", "https://example.slack.com/archives/C0GPUOPS/p1000300"),
    ("parent", '{"title": "XID 79"}'),
    ("replaced", "1.000100"),
    ("replaced-why", "uneditable"),
    ("frozen", "1.000300"),
)


async def _incident(store: AnyStore, fp: str, node: str, *, close: bool = True, deliver: bool = True) -> str:
    """An incident with a bit of everything: alerts, a plan, a step that acted, an approval, a
    notice and a reference; closed at T0 unless ``close`` is false."""
    (incident_id,) = (await store.ingest(_delivery(_alert(fp, node), _alert(f"{fp}b", node)), T0)).opened
    await store.ingest(_delivery(_alert(fp, node)), T0)  # a repeat: a delivery counter
    await store.save_plan(incident_id, _plan(node), [NewEvent("planned")], T0)
    await store.step_started(incident_id, "slurm_down", 1, T0, acted=True)
    await store.record(incident_id, NewEvent(ACTION, step="slurm_down", detail="DOWN gpu-001"), T0)
    await store.step_finished(
        incident_id,
        "slurm_down",
        "ok",
        T0,
        result={"down": True},
        event=NewEvent("step_ok", step="slurm_down"),
    )
    await store.request_approval(incident_id, "replace", ["alice"], T0 + timedelta(hours=1), T0)
    await store.enqueue(incident_id, NewEvent("notice"), "incident", {"title": "XID 79"}, ["slack"], T0)
    # What the Slack destination keeps of an incident whose parent was replaced, and Grafana's region.
    for what, ref in SLACK_REFS:
        await store.set_outbox_ref("slack", f"{what}:{incident_id}", ref, T0)
    await store.set_outbox_ref("grafana", f"region:{incident_id}", "42", T0)
    if deliver:
        for item in await store.outbox_pending("slack"):
            if item.incident_id == incident_id:
                await store.outbox_delivered(item.id, "C0GPUOPS/1.000100", T0)
    if close:
        await store.ingest(
            _delivery(_alert(fp, node, status="resolved"), _alert(f"{fp}b", node, status="resolved")), T0
        )
        await store.transition(incident_id, State.RESOLVED, T0, outcome="resolved")
    return incident_id


async def _gone(store: AnyStore, incident_id: str) -> bool:
    return (
        await store.incident(incident_id) is None
        and await store.alerts_of(incident_id) == []
        and await store.steps_of(incident_id) == {}
        and await store.approval(incident_id) is None
        and all([await store.outbox_ref("slack", f"{what}:{incident_id}") is None for what, _ in SLACK_REFS])
        and await store.outbox_ref("grafana", f"region:{incident_id}") is None
    )


async def test_old_closed_incidents_go_and_the_audit_log_stays(stores: Stores) -> None:
    store = await stores.open()
    old = await _incident(store, "fp1", "gpu-001")
    still_open = await _incident(store, "fp2", "gpu-002", close=False)
    undelivered = await _incident(store, "fp3", "gpu-003", deliver=False)
    recent = await _incident(store, "fp4", "gpu-004", close=False)
    await store.transition(recent, State.RESOLVED, CUTOFF + timedelta(days=1), outcome="resolved")
    timeline = [(e.kind, e.detail) for e in await store.events_of(old)]
    assert (ACTION, "DOWN gpu-001") in timeline
    said = [(kind, detail) for kind, detail in timeline if kind in ALERT_EVENTS]
    assert [kind for kind, _ in said] == ["alert_firing", "alert_firing", "alert_resolved", "alert_resolved"]

    pruned = await store.prune(CUTOFF)

    assert await _gone(store, old)
    assert pruned.counts == {
        "incidents": 1,
        "alerts": 2,
        "alert_deliveries": 2,
        "events": 4,
        "steps": 1,
        "approvals": 1,
        "outbox": 1,
        "outbox_refs": len(SLACK_REFS) + 1,
    }
    # The audit log stays: every event but what the alerts said, the destructive action included.
    audit = [(e.kind, e.detail) for e in await store.events_of(old)]
    assert audit == [entry for entry in timeline if entry not in said] and (ACTION, "DOWN gpu-001") in audit
    for kept in (still_open, undelivered, recent):
        assert await store.incident(kept) is not None, kept
        assert len(await store.alerts_of(kept)) == 2 and await store.steps_of(kept), kept
    assert [i for i, _, _ in await store.active()] == [still_open]

    # Once its notice is delivered, the closed incident goes at the next prune.
    for item in await store.outbox_pending("slack"):
        await store.outbox_delivered(item.id, "C0GPUOPS/1.000200", LATER)
    again = await store.prune(CUTOFF)
    assert again.counts["incidents"] == 1 and await _gone(store, undelivered)
    assert await store.incident(still_open) is not None and await store.incident(recent) is not None

    # An alert of a pruned incident delivered again is new (no cache remembers it), and opens an
    # incident with a number never used before.
    out = await store.ingest(_delivery(_alert("fp1", "gpu-001")), LATER)
    assert (out.new_alerts, out.repeated_alerts) == (1, 0)
    assert out.attached == [] and out.opened == ["pc-00005"]


async def test_an_alert_its_peer_pruned_is_new_to_the_other_replica(stores: Stores) -> None:
    """Only the leader prunes, and only it forgets what it pruned: the other replica still remembers
    those alerts as stored. Delivered to it again, such an alert is new all the same, because no
    replica answers from memory for an alert that started before a prune's cut-off could reach it
    (``bot.store.repeats``). The same rule closes the pruning replica's own race: a delivery that
    looked a key up just before the prune's delete, remembering it just after the prune forgot it."""
    leader = await stores.open(retention=KEEP)
    other = await stores.open(retention=KEEP)
    old = await _incident(leader, "fp1", "gpu-001")
    await leader.ingest(_delivery(_alert("fp9", "gpu-009")), T0)  # the newest incident, which stays
    seen = await other.ingest(_delivery(_alert("fp1", "gpu-001", status="resolved")), T0 + timedelta(hours=1))
    assert seen.repeated_alerts == 1  # the other replica now remembers fp1, stored and resolved

    await leader.prune(CUTOFF)
    assert await _gone(leader, old)

    # The other replica commits a write first, so Postgres lets its memory answer (``FRESH``); then
    # fp1 comes as the intake hands it over: memory first, the database if memory cannot answer.
    await other.ingest(_delivery(_alert("fresh", "gpu-002")), LATER)
    assert await other.count_repeats([("fp1", T0, "firing")], LATER) is None, "memory answered"
    out = await other.ingest(_delivery(_alert("fp1", "gpu-001")), LATER)
    assert (out.new_alerts, out.repeated_alerts) == (1, 0), "a pruned alert was answered as a repeat"
    assert len(out.opened) == 1 and out.opened[0] not in (old,)


async def test_an_open_incident_is_never_pruned(stores: Stores) -> None:
    store = await stores.open()
    ancient = await _incident(store, "fp1", "gpu-001", close=False)
    await store.transition(ancient, State.AWAITING_APPROVAL, T0)
    await _incident(store, "fp2", "gpu-002")  # a closed one after it, so it is not the newest
    pruned = await store.prune(LATER + timedelta(days=3650))
    assert pruned.counts["incidents"] == 0
    assert (await store.incident(ancient)) is not None and len(await store.alerts_of(ancient)) == 2


async def test_an_undelivered_notice_is_never_pruned(stores: Stores) -> None:
    store = await stores.open()
    waiting = await _incident(store, "fp1", "gpu-001", deliver=False)
    await _incident(store, "fp2", "gpu-002")
    await store.prune(LATER + timedelta(days=3650))
    assert await store.incident(waiting) is not None
    pending = await store.outbox_pending("slack")
    assert pending and {i.incident_id for i in pending} == {waiting}


async def test_the_newest_incident_keeps_its_number(stores: Stores) -> None:
    store = await stores.open()
    first = await _incident(store, "fp1", "gpu-001")
    newest = await _incident(store, "fp2", "gpu-002")
    await store.prune(CUTOFF)
    assert await _gone(store, first) and await store.incident(newest) is not None
    assert (await store.ingest(_delivery(_alert("fp9", "gpu-009")), LATER)).opened == ["pc-00003"]


async def test_another_firing_of_a_pruned_alert_keeps_its_counter(stores: Stores) -> None:
    store = await stores.open()
    old = await _incident(store, "fp1", "gpu-001")
    again = T0 + timedelta(days=100)  # the same alert fires again, in a new incident
    (live,) = (await store.ingest(_delivery(_alert("fp1", "gpu-001", starts=again)), again)).opened
    await store.ingest(_delivery(_alert("fp1", "gpu-001", starts=again)), again)  # and is redelivered

    pruned = await store.prune(CUTOFF)

    assert await _gone(store, old) and pruned.counts["alert_deliveries"] == 2
    [kept] = await store.alerts_of(live)
    assert (kept.fingerprint, kept.starts_at, kept.deliveries) == ("fp1", again, 2)


async def test_the_database_lets_go_only_of_what_alerts_said_of_closed_incidents(stores: Stores) -> None:
    """The audit log is append-only in the database itself, whoever writes to it: an update of any
    event is refused, and a delete of an audit row (an action, here a destructive one), or of
    anything an incident not closed holds; what an alert said of a closed incident may go."""
    store = await stores.open()
    closed = await _incident(store, "fp1", "gpu-001")
    still_open = await _incident(store, "fp2", "gpu-002", close=False)
    ids = {
        kind: [e.seq for e in await store.events_of(i) if e.kind == kind]
        for kind, i in (
            (ACTION, closed),
            ("alert_firing", still_open),
        )
    }
    said = [e.seq for e in await store.events_of(closed) if e.kind == "alert_firing"]
    refused = sqlite3.Error if stores.database is None else psycopg.Error
    for statement in (
        f"DELETE FROM events WHERE seq = {ids[ACTION][0]}",  # noqa: S608 - an int
        f"DELETE FROM events WHERE seq = {ids['alert_firing'][0]}",  # noqa: S608
        f"UPDATE events SET detail = 'edited' WHERE seq = {said[0]}",  # noqa: S608
        f"UPDATE events SET audit = 0 WHERE seq = {ids[ACTION][0]}",  # noqa: S608
    ):
        with pytest.raises(refused, match="append-only"):
            stores.sql(statement)
    stores.sql(f"DELETE FROM events WHERE seq = {said[0]}")  # noqa: S608
    assert [e.seq for e in await store.events_of(closed) if e.kind == "alert_firing"] == said[1:]


async def test_what_alerts_of_no_incident_said_goes_once_older_than_the_cut_off(stores: Stores) -> None:
    store = await stores.open()
    await store.ingest(_delivery(_alert("lone-old", None)), T0)
    await store.ingest(_delivery(_alert("lone-new", None)), LATER)
    await _incident(store, "fp9", "gpu-009", close=False)  # the newest, kept
    await store.record(None, NewEvent("paused", actor="alice"), T0)  # an action of no incident

    pruned = await store.prune(CUTOFF)

    assert pruned.counts["events"] == 1 and pruned.counts["alerts"] == 1
    left = [(e.kind, e.at) for e in await store.events_since(0, 1000) if e.incident_id is None]
    assert sorted(left) == [("alert_unroutable", LATER), ("paused", T0)]


def _at_schema_6(stores: Stores) -> None:
    """The store as a pitcrew of schema 6 left it: no ``audit`` column, the delete guard refusing
    every delete, no check function, no indexes for the breaker's count."""
    sqlite = stores.database is None
    stores.sql(
        *before_guarded_indexes(),
        *before_check_function(sqlite),
        *before_audit_column(sqlite),
        *newer_schema(sqlite, 6, compatible_from(6)),
    )


async def test_what_alerts_said_before_the_migration_is_kept(stores: Stores) -> None:
    """Events stored by a pitcrew before the audit column (and by one still running on the older
    schema during a rolling update) are kept as audit rows: nothing said which were the alerts'."""
    store = await stores.open()
    old = await _incident(store, "fp1", "gpu-001")
    await store.close()
    _at_schema_6(stores)
    store = await stores.open()  # migrated to this pitcrew's schema
    timeline = [(e.kind, e.detail) for e in await store.events_of(old)]
    await _incident(store, "fp2", "gpu-002")  # the newest, kept

    pruned = await store.prune(CUTOFF)

    assert await _gone(store, old) and pruned.counts["events"] == 0
    assert [(e.kind, e.detail) for e in await store.events_of(old)] == timeline


def test_every_prune_statement_searches_an_index(tmp_path: Path) -> None:
    """SQLite's plans, read from EXPLAIN QUERY PLAN over the real schema: without statistics its
    planner once took the state index for the closed incidents and sorted them (25 ms a prune
    transaction at 10,000 incidents)."""
    db = sqlite3.connect(tmp_path / "plans.db")
    for migration in migrations(SQLITE):
        db.executescript(migration)
    statements: list[Stmt] = []
    op = retention.prune_batch(CUTOFF, 10)
    key = {"incident_id": "pc-00001", "fingerprint": "f", "starts_at": "s"}
    told = {"incident_id": "pc-00001", "seq": 7}
    # The incidents, what their alerts said, their alerts, those deleted; what alerts of no
    # incident said (before the cut-off).
    answers = iter([[{"id": "pc-00001"}], [told], 1, [key], [key]])
    said = [{"seq": 3, "at": "2026-01-01T00:00:00.000000+00:00"}]
    try:
        stmt = next(op)
        while True:
            statements.append(stmt)
            unrouted = "incident_id IS NULL AND audit = 0 ORDER BY" in stmt.sql
            stmt = op.send(said if unrouted else next(answers, 1 if stmt.kind == "run" else []))
    except StopIteration:
        pass
    assert len(statements) == 15 and "alert_deliveries" in statements[5].sql
    assert sum(s.sql.startswith("DELETE FROM events") for s in statements) == 2
    for stmt in statements:
        sql, params = SQLITE.bind(stmt.sql, stmt.params if stmt.kind != "many" else stmt.params[0])
        plan = [row[3] for row in db.execute(f"EXPLAIN QUERY PLAN {sql}", params)]
        assert plan, sql
        for step in plan:
            assert not step.startswith("SCAN") and "TEMP B-TREE" not in step, (sql, plan)


async def _closed_of(store: AnyStore, alerts: int) -> str:
    """An incident of ``alerts`` alerts closed at T0 (and a newer one, kept): its id."""
    (big,) = (await store.ingest(_delivery(*(_alert(f"fp{n}", "gpu-001") for n in range(alerts))), T0)).opened
    await store.transition(big, State.RESOLVED, T0, outcome="resolved")
    await store.ingest(_delivery(_alert("other", "gpu-002")), T0)  # the newest, kept
    return big


def _traced(sql: str) -> tuple[int, str]:
    return threading.get_ident(), sql.strip()


async def _trace(store: SqliteStore) -> list[tuple[int, str]]:
    """Every statement SQLite runs on the writer's connection from now on, with its thread."""
    said: list[tuple[int, str]] = []
    await store._writer.submit(lambda conn: conn.set_trace_callback(lambda sql: said.append(_traced(sql))))
    return said


async def test_a_prune_is_cut_into_bounded_transactions(stores: Stores) -> None:
    store = await stores.open()
    big = await _closed_of(store, 5)

    # What its five alerts said first, two at a time; then the alerts, two at a time; then it.
    first = await store._write(lambda: retention.prune_batch(CUTOFF, 2))
    assert (first.counts["events"], first.counts["alerts"], first.counts["incidents"], first.more) == (
        2,
        0,
        0,
        True,
    )
    assert await store.incident(big) is not None and len(await store.alerts_of(big)) == 5

    rest = await store.prune(CUTOFF, batch=2)
    assert (rest.counts["events"], rest.counts["alerts"], rest.counts["incidents"], rest.more) == (
        3,
        5,
        1,
        False,
    )
    assert await store.incident(big) is None
    assert [e.kind for e in await store.events_of(big)] == ["incident_opened"]  # the audit log


async def test_a_sqlite_prune_commits_without_an_fsync_of_its_own(tmp_path: Path) -> None:
    """On SQLite a delivery that comes while a prune transaction holds the one writer waits for all
    of it: a prune's transactions run on the event loop, as the engine's writes do, and commit
    without an fsync (``synchronous=NORMAL``; a prune lost in a power cut is done again); every
    other write's as configured (``full``), before and after it."""
    store = SqliteStore(tmp_path / "pitcrew.db", synchronous="full")  # the default (the harness: off)
    await store.open()
    try:
        old = await _incident(store, "fp1", "gpu-001")
        await _incident(store, "fp2", "gpu-002")  # the newest, kept
        said = await _trace(store)
        pruned = await store.prune(CUTOFF, batch=1)
        assert pruned.counts["incidents"] == 1 and await _gone(store, old)
        await store.ingest(_delivery(_alert("fp3", "gpu-003")), LATER)

        levels = []  # each transaction: its statements' threads, whether it deletes, its durability
        level = "FULL"
        for n, (_, sql) in enumerate(said):
            if sql.startswith("PRAGMA synchronous="):
                level = sql.removeprefix("PRAGMA synchronous=")
            elif sql.startswith("BEGIN"):
                end = next(k for k in range(n, len(said)) if said[k][1] == "COMMIT")
                body = said[n : end + 1]
                levels.append(({t for t, _ in body}, any(q.startswith("DELETE") for _, q in body), level))
        prunes = [entry for entry in levels if entry[1]]
        assert len(prunes) >= 3  # one transaction an alert at least
        assert {(frozenset(threads), level) for threads, _, level in prunes} == {
            (frozenset({threading.get_ident()}), "NORMAL")
        }
        assert levels[-1][1:] == (False, "FULL")  # the delivery after it
    finally:
        await store.close()


async def test_a_sqlite_prune_starts_small(tmp_path: Path) -> None:
    """SQLite's prune runs on the event loop: its first transaction is of ``MIN_BATCH`` alerts'
    worth, not ``BATCH`` (then sized by how long its statements took)."""
    store = SqliteStore(tmp_path / "pitcrew.db", synchronous="off")
    await store.open()
    try:
        await _closed_of(store, 3 * retention.MIN_BATCH)
        said = await _trace(store)
        pruned = await store.prune(CUTOFF)
        assert (pruned.counts["events"], pruned.counts["alerts"], pruned.counts["incidents"]) == (30, 30, 1)
        transactions = " ".join(sql for _, sql in said).split("BEGIN")[1:]
        # What the alerts said goes first: in one transaction had the first been of 200 alerts.
        assert len([t for t in transactions if "DELETE FROM events" in t]) >= 2
    finally:
        await store.close()


async def test_a_postgres_prune_takes_no_write_lock(postgres_db: PostgresDatabase, tmp_path: Path) -> None:
    """On Postgres a prune runs beside the other writes: while another session holds the write lock
    (as a batch of deliveries or an engine write does), a prune still goes through, so it never
    holds a delivery back either. (On SQLite a prune is one more write of the one writer.)"""
    stores = Stores("postgres", tmp_path, postgres_db)
    try:
        await _prune_beside_the_write_lock(stores)
    finally:
        await stores.close()


async def _prune_beside_the_write_lock(stores: Stores) -> None:
    store = await stores.open()
    old = await _incident(store, "fp1", "gpu-001")
    await _incident(store, "fp2", "gpu-002")  # the newest, kept
    database = stores.database
    assert database is not None
    url = database.server.url(database.name)
    async with await psycopg.AsyncConnection.connect(url, password=database.server.password) as other:
        await other.execute("BEGIN")
        await other.execute("SELECT pg_advisory_xact_lock(%s)", (_WRITE_LOCK,))
        async with asyncio.timeout(10):  # under the lock it would wait for as long as the lock is held
            pruned = await store.prune(CUTOFF)
        await other.execute("ROLLBACK")
    assert (pruned.counts["incidents"], pruned.counts["alerts"]) == (1, 2)
    assert await _gone(store, old)


async def test_only_the_leader_prunes(stores: Stores) -> None:
    store = await stores.open()
    old = await _incident(store, "fp1", "gpu-001")
    await _incident(store, "fp2", "gpu-002")
    standby = store.fenced(Fence("standby"))  # never granted the lease
    with pytest.raises(Deposed):
        await standby.prune(CUTOFF)
    assert await store.incident(old) is not None

    fence = Fence("leader")
    lease = await store.acquire_lease("leader", timedelta(minutes=5))
    fence.grant(lease.epoch, valid_until=float("inf"))
    metrics = Metrics(CollectorRegistry())
    worker = Retention(store.fenced(fence), metrics, lambda: LATER, keep=KEEP, every=timedelta(hours=1))
    await worker.prune()
    assert await _gone(store, old)
    sample = metrics.registry.get_sample_value
    assert sample("pitcrew_store_pruned_rows_total", {"table": "incidents"}) == 1
    assert sample("pitcrew_store_pruned_rows_total", {"table": "alerts"}) == 2
    assert sample("pitcrew_store_pruned_rows_total", {"table": "outbox_refs"}) == len(SLACK_REFS) + 1


@pytest.mark.parametrize(("retention", "keep"), [("30d", [timedelta(days=30)]), (None, [])])
async def test_the_service_prunes_only_while_it_leads(
    tmp_path: Path, retention: str | None, keep: list[timedelta]
) -> None:
    (tmp_path / "webhook").write_text("webhook-token\n")
    config = load_config(
        None,
        store={"path": str(tmp_path / "pitcrew.db"), "retention": retention},
        server={"auth": {"bearer_token_file": str(tmp_path / "webhook")}},
    )
    app = build_app(
        config, ports=simulated_ports(config, WorldFile(journal=tmp_path / "j.jsonl")), allow_simulated=True
    )
    background = app[DEPS].background
    assert not any(isinstance(worker, Retention) for worker in background)  # never on a standby
    leading = [worker for worker in background if isinstance(worker, Leadership)]
    assert [w.keep for each in leading for w in each.workers if isinstance(w, Retention)] == keep
