"""A transaction updates delivery counters in one statement (``bot.store.ingest.bump_seen``), on a
real SQLite schema: a batch of deliveries with repeat checks, repeats and resolutions among its
new deliveries counts them all at once. On Postgres the counts of repeats answered from memory
commit beside such a batch, without the write lock, and two statements in one transaction could
deadlock with them."""

from __future__ import annotations

import sqlite3
from collections.abc import Generator
from datetime import UTC, datetime, timedelta
from typing import Any

from bot.domain.alerts import AlertStatus
from bot.domain.faults import Fault
from bot.store.base import Delivery, IncomingAlert
from bot.store.group_commit import Ingest, Item, Repeats, deliveries
from bot.store.ingest import ingest
from bot.store.schema import migrations
from bot.store.sql import SQLITE, Op, Stmt, run_sync

T0 = datetime(2026, 12, 5, 9, 0, tzinfo=UTC)
LATER = T0 + timedelta(minutes=1)


def _alert(fp: str, status: AlertStatus = "firing") -> IncomingAlert:
    fault = Fault(
        "xid", "gpu-001", "3", 79, "RESTART_BM", "fatal", "replace-node", True, "fell off the bus", True
    )
    ends = LATER if status == "resolved" else None
    return IncomingAlert(fp, T0, ends, status, "GpuXid", "gpu-001", {"node": "gpu-001"}, {}, fault)


def _delivery(*alerts: IncomingAlert) -> Delivery:
    return Delivery("pitcrew", "{}:{node=gpu-001}", "firing", 0, alerts)


def _recorded(op: Op[Any], statements: list[Stmt]) -> Generator[Stmt, Any, Any]:
    """``op``, each statement it yields kept in ``statements``."""
    answer: Any = None
    try:
        while True:
            stmt = op.send(answer)
            statements.append(stmt)
            answer = yield stmt
    except StopIteration as done:
        return done.value


def _counters(db: sqlite3.Connection) -> dict[str, int]:
    return dict(db.execute("SELECT fingerprint, deliveries FROM alert_deliveries").fetchall())


def test_a_batch_counts_its_repeats_and_resolutions_in_one_statement() -> None:
    db = sqlite3.connect(":memory:", isolation_level=None)
    for script in migrations(SQLITE):
        db.executescript(script)
    run_sync(db, ingest([(_delivery(_alert("fp-a"), _alert("fp-b"), _alert("fp-c")), T0)], {}))

    statements: list[Stmt] = []
    batch: list[Item] = [
        Repeats((("fp-c", T0, "firing"),), LATER),  # a repeat check
        Ingest(_delivery(_alert("fp-a"), _alert("fp-b", "resolved"), _alert("fp-d")), LATER),
    ]
    results = run_sync(db, _recorded(deliveries(batch), statements)).result

    assert results[0] == 1  # the repeat check counted
    counting = [s for s in statements if s.sql.startswith("UPDATE alert_deliveries")]
    assert len(counting) == 1, [s.sql for s in statements]
    assert _counters(db) == {"fp-a": 2, "fp-b": 2, "fp-c": 2, "fp-d": 1}
    assert db.execute("SELECT status FROM alerts WHERE fingerprint = 'fp-b'").fetchone() == ("resolved",)
