"""Retention under load: a store of ``--alerts`` historical alerts pruned while new alerts arrive.

The store (SQLite by default, ``--store postgres`` for a throwaway PostgreSQL cluster started as
the tests start it) is filled with closed incidents a year old — ``--alerts`` alerts in incidents
of ``--per-incident`` alerts, each incident with one audit event of a destructive action — and
one open incident. Then, in the same run, ``--deliveries`` webhook deliveries of one new alert
each are ingested one at a time twice: first with nothing else running (the baseline), then while
the store prunes everything past ``store.retention`` (180 days) in its bounded batches.

Printed: the ingest p50/p99 of both runs and their ratio (the issue's goal: within 2x), how long
the prune took and what it removed, and what survived: the open incident, and every audit event
of a destructive action.

    python bench/retention.py [--store sqlite|postgres] [--alerts 1000000] [--per-incident 100]
                              [--deliveries 2000]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
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
from tests.harness.postgres import running_postgres

NOW = datetime(2026, 12, 1, tzinfo=UTC)
OLD = NOW - timedelta(days=365)
KEEP = timedelta(days=180)
Store = SqliteStore | PostgresStore


def _fault(node: str) -> Fault:
    return Fault("xid", node, "3", 79, "RESTART_BM", "fatal", "replace-node", True, "fell off the bus", True)


def _delivery(n: int) -> Delivery:
    node = f"live-{n % 50:03d}"
    alert = IncomingAlert(f"new{n}", NOW, None, "firing", "GpuXid", node, {"node": node}, {}, _fault(node))
    return Delivery("pitcrew", f"{{node={node}}}", "firing", 0, (alert,))


def _history(alerts: int, per: int) -> Iterator[tuple[str, list[tuple[Any, ...]], list[tuple[Any, ...]]]]:
    """Closed incidents a year old: (incident row values, alert rows, delivery rows), ``per`` alerts each."""
    stamp = codec.ts(OLD)
    fault = codec.fault_json(_fault("old"))
    for i in range(alerts // per):
        incident = f"pc-{i + 1:05d}"
        rows = [
            (f"h{i}-{k}", stamp, stamp, "resolved", "GpuXid", f"old-{i}", incident, "xid:3:79", fault,
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


def _statements(p: str) -> tuple[str, str, str, str]:
    return (
        _INCIDENT.format(p=p),
        _ALERT.format(ps=", ".join([p] * 13)),
        _DELIVERY.format(ps=", ".join([p] * 4)),
        _EVENT.format(p=p),
    )


def _fill_rows(alerts: int, per: int) -> Iterator[tuple[tuple[Any, ...], list[Any], list[Any]]]:
    stamp = codec.ts(OLD)
    for seq, (incident, rows, deliveries) in enumerate(_history(alerts, per), start=1):
        yield (incident, seq, f"old-{seq}", stamp, stamp, stamp), rows, deliveries


def fill_sqlite(path: Path, alerts: int, per: int) -> None:
    incident, alert, delivery, event = _statements("?")
    with contextlib.closing(sqlite3.connect(path)) as db, db:
        for values, rows, deliveries in _fill_rows(alerts, per):
            db.execute(incident, values)
            db.executemany(alert, rows)
            db.executemany(delivery, deliveries)
            db.execute(event, (values[0], values[3], ACTION))


def fill_postgres(url: str, password: str, alerts: int, per: int) -> None:
    import psycopg

    incident, _, _, event = _statements("%s")
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
            cursor.execute(event, (values[0], values[3], ACTION))


def _line(what: str, times: Sequence[float]) -> str:
    p99 = statistics.quantiles(times, n=100)[98]
    return f"  {what:34} p50 {statistics.median(times):7.2f} ms   p99 {p99:7.2f} ms"


async def _ingest(store: Store, first: int, count: int) -> list[float]:
    times = []
    for n in range(first, first + count):
        started = time.perf_counter()
        await store.ingest(_delivery(n), NOW)
        times.append((time.perf_counter() - started) * 1000)
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
        alone = await _ingest(store, 1000, deliveries)
        started = time.perf_counter()
        pruning = asyncio.create_task(store.prune(NOW - KEEP))
        during = await _ingest(store, 1000 + deliveries, deliveries)
        overlapped = pruning.done()
        pruned = await pruning
        took = time.perf_counter() - started
        print(_line("ingest, nothing else running", alone))
        print(_line("ingest while pruning", during))
        ratio = statistics.quantiles(during, n=100)[98] / statistics.quantiles(alone, n=100)[98]
        print(f"  p99 while pruning / alone: {ratio:.2f}x (goal: within 2x)")
        print(f"  prune: {took:.1f} s, rows removed {pruned.counts}")
        if overlapped:
            print("  (the prune ended before the second run's last delivery: only its first part overlapped)")
        else:
            print("  (the prune outlasted the second run: every one of its deliveries ran while it pruned)")
        kept = await store.incident(open_incident)
        actions = sum(1 for e in await store.events_since(0, 10_000_000) if e.kind == ACTION)
        print(
            f"  kept: the open incident {'yes' if kept else 'NO'}; audit events of destructive actions {actions}"
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
    with running_postgres() as pg, tempfile.TemporaryDirectory() as tmp:
        password = Path(tmp) / "password"
        password.write_text(pg.password + "\n")
        url = pg.url(pg.create_database())
        store = PostgresStore(url, password_file=password)
        await measure(
            store, args.deliveries, lambda: fill_postgres(url, pg.password, args.alerts, args.per_incident)
        )


if __name__ == "__main__":
    asyncio.run(main())
