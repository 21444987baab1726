"""Alert storm: 500 nodes alert within one second, in auto mode.

At most ``max_nodes`` nodes are touched, the breaker opens with one summary notification
(not 500), every alert and incident is in the store; after a human resets the breaker,
redeliveries are not replayed and alerts older than the stale cutoff are skipped, while a
fresh fault is handled again.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from tests.e2e.slurm_engine import TERMINAL
from tests.harness.pitcrew import Pitcrew
from tests.harness.proc import wait_until
from tests.harness.scenarios import delivery, destructive_calls, notices

NODES = [f"gpu-node-{n:03d}" for n in range(500)]


def test_storm_of_500_nodes_is_stopped_by_the_breaker(pitcrew_factory: Any, tmp_path: Path) -> None:
    server: Pitcrew = pitcrew_factory(
        "storm",
        config={
            "mode": "auto",
            "guards": {
                "breaker": {"max_nodes": 3, "max_fraction": 0.5, "window": "4s", "stale_after": "30s"}
            },
        },
        world={"latency": "50ms"},
    ).start()
    started = datetime.now(UTC)
    bodies = [delivery("xid79-firing.json", node=node, starts=started) for node in NODES]
    began = time.monotonic()
    answers = server.post_many(bodies)
    took = time.monotonic() - began
    assert [status for status, _ in answers] == [200] * len(NODES)
    print(f"\n  500 deliveries (1500 alerts) accepted and stored in {took:.2f}s")

    def all_ended() -> bool:
        """Every incident planned, and the few let through carried out: their DOWNs are all in
        the journal before it is counted (planned is not yet acted on, on a loaded machine)."""
        return all(i["state"] in TERMINAL for i in server.incidents())

    wait_until(all_ended, timeout=120, interval=0.5, what="every storm incident planned and ended")
    incidents = server.incidents()
    assert len(incidents) == 500, "one incident per node, none lost"
    assert sum(len(server.incident(i["id"])["alerts"]) for i in incidents[:20]) == 60

    touched = {target for (op, target) in destructive_calls(server.journal_records()) if op == "slurm_down"}
    assert 1 <= len(touched) <= 3, touched
    suppressed = [i for i in incidents if i["state"] == "suppressed"]
    assert len(suppressed) >= 497
    assert all("breaker" in i["outcome"] for i in suppressed)
    records = server.journal_records()
    assert len(notices(records, "breaker")) == 1, "one summary, not one notice per node"
    assert notices(records, "suppressed") == []
    assert len(notices(records, "incident")) <= 3
    status, state = server.request(
        "GET", "/api/v1/status", headers={"Authorization": f"Bearer {server.admin_token}"}
    )
    assert status == 200 and b'"open": true' in state

    # A human resets the breaker; wait out the window so the three remediated nodes no longer count.
    code, answer = server.command("/api/v1/breaker/reset", "alice")
    assert code == 200, answer
    time.sleep(4.5)

    # Alertmanager redelivers the storm: nothing is replayed.
    redelivered = server.post_many(bodies[:100])
    assert all(body["repeated"] == 3 and not body["opened"] for _, body in redelivered)

    # A new occurrence that started long before the reset is skipped as stale...
    _, stale = server.post_alerts(
        delivery("xid79-firing.json", node=NODES[400], starts=started - timedelta(minutes=10))
    )
    stale_incident = server.wait_incident(stale["opened"][0], "suppressed", timeout=30)
    assert "stale" in stale_incident["outcome"]
    # ...while a fresh fault is handled.
    _, fresh = server.post_alerts(delivery("xid79-firing.json", node=NODES[401]))
    assert server.wait_incident(fresh["opened"][0], "resolved", timeout=60)["state"] == "resolved"
    after = destructive_calls(server.journal_records())
    assert ("slurm_down", NODES[400]) not in after
    assert after[("slurm_down", NODES[401])] == 1
    assert len({t for (op, t) in after if op == "slurm_down"}) == len(touched) + 1
