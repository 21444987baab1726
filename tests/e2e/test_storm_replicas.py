"""A 1,000-node storm on two replicas sharing one PostgreSQL database, in auto mode.

Alertmanager's peers split the storm: half the deliveries reach one replica, half the other, at
once. Only the leader acts, and the breaker counts the whole fleet whichever replica took an
alert: at most ``max_nodes`` nodes are touched (each once), every other incident is suppressed
by the breaker, one breaker notice is sent (not one per replica, not one per node), and every
alert delivered is in the store, one incident per node.
"""

from __future__ import annotations

import json
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psycopg
import pytest

from tests.harness.pitcrew import Pitcrew
from tests.harness.postgres import PostgresDatabase
from tests.harness.proc import wait_until
from tests.harness.scenarios import delivery, destructive_calls, notices

pytestmark = pytest.mark.slow
NODES = [f"gpu-node-{n:04d}" for n in range(1000)]
MAX_NODES = 3


def _records(journal: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in journal.read_text().splitlines() if line.strip()]


def test_a_storm_split_over_two_replicas_is_held_by_one_breaker(
    pitcrew_factory: Any, tmp_path: Path, postgres_db: PostgresDatabase
) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    journal = shared / "far-side.jsonl"
    config = {
        "mode": "auto",
        "guards": {"breaker": {"max_nodes": MAX_NODES, "max_fraction": 0.5, "window": "10m"}},
        "store": {
            "path": str(shared / "unused.db"),
            "url": postgres_db.url,
            "password_file": str(postgres_db.password_file),
        },
    }
    world = {"journal": journal, "latency": "50ms"}
    replicas: tuple[Pitcrew, Pitcrew] = (
        pitcrew_factory("first", config=config, world=world).start(),
        pitcrew_factory("second", config=config, world=world).start(),
    )
    started = datetime.now(UTC)
    bodies = [delivery("xid79-firing.json", node=node, starts=started) for node in NODES]
    began = time.monotonic()
    with ThreadPoolExecutor(2) as pool:
        halves = list(pool.map(lambda i: replicas[i].post_many(bodies[i::2]), (0, 1)))
    took = time.monotonic() - began
    assert [status for half in halves for status, _ in half] == [200] * len(NODES)

    # Read from the database itself: 1,000 incidents are more than one page of the API.
    with psycopg.connect(postgres_db.url, password=postgres_db.server.password) as conn:

        def states() -> dict[str, int]:
            rows = conn.execute("SELECT state, count(*) FROM incidents GROUP BY state").fetchall()
            conn.commit()
            return {str(state): int(n) for state, n in rows}

        wait_until(lambda: "open" not in states(), timeout=300, interval=1, what="every incident planned")
        nodes = [row[0] for row in conn.execute("SELECT node FROM incidents ORDER BY node").fetchall()]
        by_breaker = conn.execute(
            "SELECT count(*) FROM incidents WHERE state = 'suppressed' AND outcome LIKE '%breaker%'"
        ).fetchone()
        final = states()
    assert nodes == NODES, "one incident per node, none lost"
    calls = destructive_calls(_records(journal))
    assert {c: n for c, n in calls.items() if n > 1} == {}, calls
    touched = {target for (op, target) in calls if op == "slurm_down"}
    assert 1 <= len(touched) <= MAX_NODES, touched
    assert by_breaker is not None and by_breaker[0] == final["suppressed"] >= len(NODES) - MAX_NODES, final
    records = _records(journal)
    assert len(notices(records, "breaker")) == 1, "one summary for the fleet, not one per replica or node"
    assert len(notices(records, "incident")) <= MAX_NODES
    print(
        f"\n  {len(NODES)} deliveries over two replicas accepted and stored in {took:.1f}s; touched {len(touched)}; {final}"
    )
