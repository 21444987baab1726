"""What a batch of deliveries reads before it writes (``bot.store.ingest``), on a real SQLite schema.

Under Postgres's write lock every statement with an answer is a round trip, so what a batch must
know (which of its alerts are stored; the active incident of each node a new alert could join) is
asked in one statement when each list fits one query, and in a statement a chunk otherwise; the
outcomes are the same either way.
"""

from __future__ import annotations

import sqlite3
from datetime import UTC, datetime, timedelta

import pytest

from bot.domain.faults import Fault
from bot.store import ingest as ingest_module
from bot.store.base import Delivery, IncomingAlert
from bot.store.ingest import ingest
from bot.store.schema import migrations
from bot.store.sql import SQLITE, run_sync

T0 = datetime(2026, 12, 3, 9, 0, tzinfo=UTC)


def _alert(fp: str, node: str, starts: datetime = T0) -> IncomingAlert:
    fault = Fault("xid", node, "3", 79, "RESTART_BM", "fatal", "replace-node", True, "fell off the bus", True)
    return IncomingAlert(fp, starts, None, "firing", "GpuXid", node, {"node": node}, {}, fault)


def _delivery(*alerts: IncomingAlert) -> Delivery:
    return Delivery("pitcrew", "{}:{node=x}", "firing", 0, alerts)


def _database() -> tuple[sqlite3.Connection, list[str]]:
    db = sqlite3.connect(":memory:", isolation_level=None)
    for script in migrations(SQLITE):
        db.executescript(script)
    reads: list[str] = []  # the lookups (an incident's number, read when one opens, aside)

    def trace(sql: str) -> None:
        if sql.lstrip().upper().startswith("SELECT") and "MAX(seq)" not in sql:
            reads.append(sql)

    db.set_trace_callback(trace)
    return db, reads


@pytest.mark.parametrize(("alerts", "selects"), [(3, 1), (ingest_module._CHUNK + 1, 3)])
def test_a_batch_asks_what_it_must_know_in_one_statement_when_it_fits(alerts: int, selects: int) -> None:
    db, reads = _database()
    first = _delivery(*(_alert(f"fp{n}", "gpu-001") for n in range(alerts)))
    [opened] = run_sync(db, ingest([(first, T0)], {})).result
    assert len(opened.opened) == 1 and opened.new_alerts == alerts
    assert len(reads) == selects, reads

    # The same alerts again, one more firing on the node and one on another node: the stored ones
    # are repeats, the new firing joins the node's incident, the other node opens its own.
    reads.clear()
    later = T0 + timedelta(minutes=1)
    again = _delivery(*first.alerts, _alert("fp0", "gpu-001", later), _alert("other", "gpu-002"))
    [outcome] = run_sync(db, ingest([(again, later)], {})).result
    assert (outcome.repeated_alerts, outcome.new_alerts) == (alerts, 2)
    assert outcome.attached == opened.opened and len(outcome.opened) == 1
    assert len(reads) == selects, reads
