"""A read the engine makes at every admission stays cheap as the store grows, on both databases'
own planners: the breaker's count of nodes in remediation (``queries.nodes_in_remediation``).

On PostgreSQL it once spent 200 ms a call compiling itself (JIT): its plan's estimate crossed
``jit_above_cost`` on a store of 524 incidents, none of them admitted, and the count found no row.
Under the ingest benchmark's stream that was most of PostgreSQL's time. Here a store of 20,000
incidents and 200,000 events, as a long-running fleet's, without statistics (as between two runs
of autovacuum), is asked as the engine asks: the count runs on its indexes and is never compiled.
"""

from __future__ import annotations

import sqlite3
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg

from bot.store import queries, schema
from bot.store.base import ACTION
from bot.store.postgres import PostgresStore
from bot.store.sql import POSTGRES, SQLITE
from tests.harness.postgres import PostgresDatabase

T0 = datetime(2026, 12, 1, tzinfo=UTC)
INCIDENTS, EVENTS_EACH = 20_000, 10
SINCE = T0 - timedelta(hours=24)
#: Incident ``n`` was admitted in the window if ``n % 40 == 0``, before it if ``n % 40 == 20``,
#: never otherwise; it has ended if ``n % 3 == 0``, and changed its node (an action event among its
#: ten) if ``n % 7 == 0``.
FILL = f"""
INSERT INTO incidents (id, seq, node, state, opened_at, updated_at, guarded_at)
SELECT 'pc-' || n, n, 'gpu-' || n, CASE WHEN n % 3 = 0 THEN 'resolved' ELSE 'guarded' END,
       '2026-01-01T00:00:00.000000+00:00', '2026-01-01T00:00:00.000000+00:00',
       CASE n % 40 WHEN 0 THEN '2026-11-30T12:00:00.000000+00:00'
                   WHEN 20 THEN '2026-01-01T00:00:00.000000+00:00' END
FROM generate_series(1, {INCIDENTS}) AS n;
INSERT INTO events (incident_id, at, kind, detail)
SELECT 'pc-' || n, '2026-01-01T00:00:00.000000+00:00',
       CASE WHEN k = 1 AND n % 7 = 0 THEN 'action' ELSE 'alert_firing' END, ''
FROM generate_series(1, {INCIDENTS}) AS n, generate_series(1, {EVENTS_EACH}) AS k;
"""  # noqa: S608 (this module's numbers only)
IN_WINDOW = [n for n in range(1, INCIDENTS + 1) if n % 40 == 0]
#: What the count must find: admitted in the window, and under way or ended having acted.
EXPECTED = frozenset(f"gpu-{n}" for n in IN_WINDOW if n % 3 != 0 or n % 7 == 0)
GAVE_BACK = frozenset(f"gpu-{n}" for n in IN_WINDOW if n % 3 == 0 and n % 7 != 0)


def _indexes(plan: Any) -> set[str]:
    """Every index a PostgreSQL plan (``EXPLAIN (FORMAT JSON)``) reads."""
    found: set[str] = set()
    if isinstance(plan, dict):
        if "Index Name" in plan:
            found.add(plan["Index Name"])
        for value in plan.values():
            found |= _indexes(value)
    elif isinstance(plan, list):
        for value in plan:
            found |= _indexes(value)
    return found


async def test_the_breaker_s_count_reads_by_index_and_is_never_jit_compiled_on_postgres(
    postgres_db: PostgresDatabase,
) -> None:
    store = PostgresStore(postgres_db.url, password_file=postgres_db.password_file)
    await store.open()  # migrated
    await store.close()
    password = postgres_db.password_file.read_text().strip()
    with psycopg.connect(postgres_db.url, password=password, autocommit=True) as conn:
        available = conn.execute("SELECT pg_jit_available()").fetchone()
        assert available == (True,), "this PostgreSQL cannot compile (JIT): the test would prove nothing"
        conn.execute(FILL.encode())
        stmt = next(queries.nodes_in_remediation(SINCE, "gpu-none"))
        text, params = POSTGRES.bind(stmt.sql, stmt.params)
        [(explained,)] = conn.execute(f"EXPLAIN (ANALYZE, FORMAT JSON) {text}".encode(), params).fetchall()
        found = {row[0] for row in conn.execute(text.encode(), params).fetchall()}
    [plan] = explained
    assert "JIT" not in plan, plan["JIT"]
    assert {"incidents_guarded", "events_action"} <= _indexes(plan["Plan"])
    assert found == EXPECTED and GAVE_BACK and not found & GAVE_BACK


def test_the_action_word_of_the_count_and_its_index_is_the_audit_log_s() -> None:
    stmt = next(queries.nodes_in_remediation(SINCE, None))
    assert f"e.kind = '{ACTION}'" in stmt.sql
    assert (
        f"CREATE INDEX events_action ON events(incident_id) WHERE kind = '{ACTION}'" in schema.MIGRATIONS[8]
    )


def test_the_breaker_s_count_reads_by_index_on_sqlite() -> None:
    conn = sqlite3.connect(":memory:")
    for migration in schema.migrations(SQLITE):
        conn.executescript(migration)
    stmt = next(queries.nodes_in_remediation(SINCE, "gpu-none"))
    text, params = SQLITE.bind(stmt.sql, stmt.params)
    plan = [row[3] for row in conn.execute(f"EXPLAIN QUERY PLAN {text}", params)]
    reads = [step for step in plan if step.startswith(("SCAN", "SEARCH"))]
    assert reads == [
        "SEARCH incidents USING INDEX incidents_guarded (guarded_at>?)",
        "SEARCH i USING INDEX incidents_guarded (guarded_at>?)",
        "SEARCH e USING INDEX events_action (incident_id=?)",
    ], plan
