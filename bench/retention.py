"""Retention under load: a store of ``--alerts`` historical alerts pruned while new alerts arrive.

The store (SQLite by default, ``--store postgres`` for a throwaway PostgreSQL cluster of the
proving ground, ``proving_ground.postgres``, with PostgreSQL's default durability as SQLite's
writer commits with ``synchronous=full``) is filled with closed incidents a year old —
``--alerts`` alerts in incidents of ``--per-incident`` alerts, fingerprints spread over the key
space as Alertmanager's label hashes are, each alert with the event the intake writes for it
(what it said: pruned with it) and each incident with one audit event of a destructive action
(kept) — and one open incident. Then, in the same run, webhook deliveries of one new alert each
are ingested one at a time: ``--deliveries`` with nothing else running, then for as long as the
store takes to prune everything past ``store.retention`` (180 days) in its bounded batches (at
least ``--deliveries``), so every moment of the prune is measured, then ``--deliveries`` alone again:
the baseline is both runs alone, before and after.

Printed: the ingest p50/p99 of both runs and their ratio (the issue's goal: within 2x), how long
the prune took and what it removed, and what survived: the open incident, every audit event
of a destructive action, and none of what the pruned alerts said.

    python bench/retention.py [--store sqlite|postgres] [--alerts 1000000] [--per-incident 100]
                              [--deliveries 2000]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import sqlite3
import statistics
import tempfile
import time
from collections.abc import Iterator, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from bot.domain.faults import Fault
from bot.store import codec
from bot.store.base import ACTION, Delivery, IncomingAlert
from bot.store.postgres import PostgresStore
from bot.store.sqlite import SqliteStore
from proving_ground.postgres import running_postgres

NOW = datetime(2026, 12, 1, tzinfo=UTC)
OLD = NOW - timedelta(days=365)
KEEP = timedelta(days=180)
Store = SqliteStore | PostgresStore


def _fault(node: str) -> Fault:
    return Fault("xid", node, "3", 79, "RESTART_BM", "fatal", "replace-node", True, "fell off the bus", True)


def _delivery(n: int) -> Delivery:
    """A new alert on one of 50 nodes, a fresh 50 every 1,000 deliveries: an incident gathers at
    most 20 alerts, so a delivery costs the same at the end of a long run as at its start."""
    node = f"live-{n // 1000}-{n % 50:02d}"
    alert = IncomingAlert(f"new{n}", NOW, None, "firing", "GpuXid", node, {"node": node}, {}, _fault(node))
    return Delivery("pitcrew", f"{{node={node}}}", "firing", 0, (alert,))


def _fingerprint(incident: int, alert: int) -> str:
    """Sixteen hex digits of a hash, as Alertmanager's: an incident's alerts are all over the key."""
    return hashlib.blake2b(f"{incident}/{alert}".encode(), digest_size=8).hexdigest()


def _history(alerts: int, per: int) -> Iterator[tuple[str, list[tuple[Any, ...]], list[tuple[Any, ...]]]]:
    """Closed incidents a year old: (incident row values, alert rows, delivery rows), ``per`` alerts each."""
    stamp = codec.ts(OLD)
    fault = codec.fault_json(_fault("old"))
    for i in range(alerts // per):
        incident = f"pc-{i + 1:05d}"
        rows = [
            (_fingerprint(i, k), stamp, stamp, "resolved", "GpuXid", f"old-{i}", incident, "xid:3:79", fault,
             '{"node": "old"}', "{}", "g", stamp)
            for k in range(per)
        ]  # fmt: skip
        yield incident, rows, [(r[0], r[1], 3, stamp) for r in rows]


_INCIDENT = (
    "INSERT INTO incidents (id, seq, node, state, opened_at, updated_at, closed_at, playbook, acted)"
    " VALUES ({p}, {p}, {p}, 'resolved', {p}, {p}, {p}, 'replace-node', 1)"
)
_ALERT = (
    "INSERT INTO alerts (fingerprint, starts_at, ends_at, status, alertname, node, incident_id, fault_key,"
    " fault_json, labels_json, annotations_json, group_key, first_seen) VALUES ({ps})"
)
_DELIVERY = "INSERT INTO alert_deliveries (fingerprint, starts_at, deliveries, last_seen) VALUES ({ps})"
_EVENT = "INSERT INTO events (incident_id, at, kind, detail) VALUES ({p}, {p}, {p}, 'DOWN old')"
#: What each alert said, as the intake tells it in the timeline (not the audit log: ``audit`` 0).
_SAID = (
    "INSERT INTO events (incident_id, at, kind, detail, audit) VALUES ({p}, {p}, 'alert_firing', 'GpuXid', 0)"
)


def _statements(p: str) -> tuple[str, str, str, str, str]:
    return (
        _INCIDENT.format(p=p),
        _ALERT.format(ps=", ".join([p] * 13)),
        _DELIVERY.format(ps=", ".join([p] * 4)),
        _EVENT.format(p=p),
        _SAID.format(p=p),
    )


def _fill_rows(alerts: int, per: int) -> Iterator[tuple[tuple[Any, ...], list[Any], list[Any]]]:
    stamp = codec.ts(OLD)
    for seq, (incident, rows, deliveries) in enumerate(_history(alerts, per), start=1):
        yield (incident, seq, f"old-{seq}", stamp, stamp, stamp), rows, deliveries


def fill_sqlite(path: Path, alerts: int, per: int) -> None:
    incident, alert, delivery, event, said = _statements("?")
    with contextlib.closing(sqlite3.connect(path)) as db, db:
        for values, rows, deliveries in _fill_rows(alerts, per):
            db.execute(incident, values)
            db.executemany(alert, rows)
            db.executemany(delivery, deliveries)
            db.executemany(said, [(values[0], values[3])] * len(rows))
            db.execute(event, (values[0], values[3], ACTION))


def fill_postgres(url: str, password: str, alerts: int, per: int) -> None:
    import psycopg

    incident, _, _, event, _ = _statements("%s")
    with psycopg.connect(url, password=password) as db, db.cursor() as cursor:
        for values, rows, deliveries in _fill_rows(alerts, per):
            cursor.execute(incident, values)
            with cursor.copy(
                "COPY alerts (fingerprint, starts_at, ends_at, status, alertname, node, incident_id, fault_key,"
                " fault_json, labels_json, annotations_json, group_key, first_seen) FROM STDIN"
            ) as copy:
                for row in rows:
                    copy.write_row(row)
            with cursor.copy(
                "COPY alert_deliveries (fingerprint, starts_at, deliveries, last_seen) FROM STDIN"
            ) as copy:
                for row in deliveries:
                    copy.write_row(row)
            with cursor.copy("COPY events (incident_id, at, kind, detail, audit) FROM STDIN") as copy:
                for _ in rows:
                    copy.write_row((values[0], values[3], "alert_firing", "GpuXid", 0))
            cursor.execute(event, (values[0], values[3], ACTION))
        # A database that took a year to grow this big has been analysed by autovacuum many times.
        cursor.execute("ANALYZE")


def _line(what: str, times: Sequence[float]) -> str:
    p99 = statistics.quantiles(times, n=100)[98]
    return f"  {what:34} p50 {statistics.median(times):7.2f} ms   p99 {p99:7.2f} ms"


async def _ingest(
    store: Store, first: int, count: int, until: asyncio.Task[Any] | None = None
) -> list[float]:
    """``count`` deliveries one after the other, and more until ``until`` is done; their times (ms)."""
    times = []
    n = first
    while n < first + count or (until is not None and not until.done()):
        started = time.perf_counter()
        await store.ingest(_delivery(n), NOW)
        times.append((time.perf_counter() - started) * 1000)
        n += 1
        # A delivery SQLite's idle writer commits at once returns without ever giving the loop up:
        # the prune's task then never ran, and a small store's run never ended.
        await asyncio.sleep(0)
    return times


async def measure(store: Store, deliveries: int, fill: Any) -> None:
    await store.open()  # the schema
    await store.close()
    started = time.perf_counter()
    fill()
    print(f"  filled in {time.perf_counter() - started:.1f} s")
    await store.open()
    try:
        (open_incident,) = (await store.ingest(_delivery(-1), OLD)).opened
        await _ingest(store, 0, 100)  # warm-up
        before = await _ingest(store, 1000, deliveries)
        started = time.perf_counter()
        pruning = asyncio.create_task(store.prune(NOW - KEEP))
        during = await _ingest(store, 1000 + deliveries, deliveries, until=pruning)
        pruned = await pruning
        took = time.perf_counter() - started
        after = await _ingest(store, 1000 + deliveries + len(during), deliveries)
        alone = before + after  # before and after the prune: a machine shared with others drifts
        print(_line(f"ingest, nothing else running ({len(alone)})", alone))
        print(_line(f"  of which before the prune ({len(before)})", before))
        print(_line(f"  of which after the prune ({len(after)})", after))
        print(_line(f"ingest while pruning ({len(during)})", during))
        ratio = statistics.quantiles(during, n=100)[98] / statistics.quantiles(alone, n=100)[98]
        print(f"  p99 while pruning / alone: {ratio:.2f}x (goal: within 2x)")
        print(
            f"  prune: {took:.1f} s, {pruned.took:.1f} s of it in its statements; rows removed {pruned.counts}"
        )
        kept = await store.incident(open_incident)
        events = await store.events_since(0, 10_000_000)
        actions = sum(1 for e in events if e.kind == ACTION)
        said = sum(
            1
            for e in events
            if e.kind == "alert_firing" and e.at < NOW - KEEP and e.incident_id != open_incident
        )
        print(
            f"  kept: the open incident {'yes' if kept else 'NO'}; audit events of destructive actions {actions};"
            f" what the pruned alerts said: {said} events left"
        )
    finally:
        await store.close()


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--store", choices=("sqlite", "postgres"), default="sqlite")
    parser.add_argument("--alerts", type=int, default=1_000_000)
    parser.add_argument("--per-incident", type=int, default=100)
    parser.add_argument("--deliveries", type=int, default=2000)
    args = parser.parse_args()
    print(f"retention: {args.alerts} historical alerts ({args.per_incident} an incident), {args.store}")
    if args.store == "sqlite":
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "pitcrew.db"
            store = SqliteStore(path)
            await measure(store, args.deliveries, lambda: fill_sqlite(path, args.alerts, args.per_incident))
        return
    with running_postgres(durable=True) as pg, tempfile.TemporaryDirectory() as tmp:
        password = Path(tmp) / "password"
        password.write_text(pg.password + "\n")
        url = pg.url(pg.create_database())
        store = PostgresStore(url, password_file=password)
        await measure(
            store, args.deliveries, lambda: fill_postgres(url, pg.password, args.alerts, args.per_incident)
        )


if __name__ == "__main__":
    asyncio.run(main())
