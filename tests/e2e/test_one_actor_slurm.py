"""One actor per store against the real Slurm cluster: two pitcrew processes, one store, one slurmctld.

Both processes run ``serve`` in auto mode (``integrations.scheduler: slurm``, scontrol) on one
SQLite store, against the session's real cluster (gpu-001..003); Kubernetes is simulated, one
journal for both (a replacement NotReady for a few seconds). The far side's own record of what
reached it is slurmctld's log: one ``update_node`` line per state change it was asked for.

Case: XID 79 on all three nodes, delivered to both processes; the leader is SIGKILLed right after
its first DOWN reached slurmctld; the standby takes over once the lease lapses, the killed one
comes back as a standby, and a rollback of one incident sent to both at once is carried out once.
Every node was set DOWN exactly once, DRAIN exactly once (the DOWN's, completed by the process
that took over where the killed one stopped between the two), and RESUMEd exactly once (by its
playbook, or by the rollback), every cordon and replacement reached the simulated Kubernetes once.
"""

from __future__ import annotations

import json
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from proving_ground.slurm import NODE_UPDATE, NODES, SlurmCluster
from tests.harness.pitcrew import Pitcrew
from tests.harness.proc import wait_until
from tests.harness.scenarios import delivery, destructive_calls

pytestmark = pytest.mark.slow
#: How slurmctld logs a DRAIN: DRAINED on a node without jobs, DRAINING on one with them.
DRAIN = {"DRAINED", "DRAINING"}


def _role(server: Pitcrew) -> str | None:
    status, raw = server.request("GET", "/readyz")
    if status != 200:
        return None
    role: str | None = json.loads(raw).get("leadership", {}).get("role")
    return role


def _slurm_changes(log: Path, offset: int) -> Counter[tuple[str, str]]:
    """State changes slurmctld logged since ``offset``, by (node, state set)."""
    with log.open("rb") as file:
        file.seek(offset)
        text = file.read().decode(errors="replace")
    return Counter((node, state) for node, state in NODE_UPDATE.findall(text))


def _k8s_calls(journal: Path) -> Counter[tuple[str, str]]:
    text = journal.read_text() if journal.exists() else ""
    return destructive_calls([json.loads(line) for line in text.splitlines() if line.strip()])


def test_two_processes_on_real_slurm_set_each_node_down_once(
    slurm: SlurmCluster, pitcrew_factory: Any, tmp_path: Path
) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    journal = shared / "kubernetes.jsonl"
    config = {
        "mode": "auto",
        "guards": {"breaker": {"max_nodes": 10, "max_fraction": 1.0}},
        **slurm.pitcrew_settings("scontrol", command_timeout=5),
        "store": {"path": str(shared / "pitcrew.db"), "lease": {"ttl": "3s", "renew_every": "1s"}},
    }
    world = {"journal": journal, "replace_seconds": "4s"}
    log = slurm.run_dir / "log" / "slurmctld.log"
    offset = log.stat().st_size
    # The first's joins the simulated machines to the cluster: one for the shared journal.
    first: Pitcrew = pitcrew_factory("first", config=config, world=world, slurm=slurm).start()
    wait_until(lambda: _role(first) == "leader", timeout=20, what="the first process to lead")
    second: Pitcrew = pitcrew_factory("second", config=config, world=world).start()
    assert _role(second) == "standby"

    opened = {}
    for index, node in enumerate(NODES):
        status, body = (first, second)[index % 2].post_alerts(delivery("xid79-firing.json", node=node))
        assert status == 200, body
        opened[node] = body["opened"][0]
    wait_until(
        lambda: any(state == "DOWN" for _, state in _slurm_changes(log, offset)),
        timeout=60,
        interval=0.01,
        what="the first DOWN to reach slurmctld",
    )
    first.kill()
    wait_until(lambda: _role(second) == "leader", timeout=60, what="the standby to take over")
    first.start()  # back, as a standby
    assert _role(first) == "standby"

    target = opened[NODES[1]]
    wait_until(lambda: ("replace", NODES[1]) in _k8s_calls(journal), timeout=60, what="a replacement")
    with ThreadPoolExecutor(2) as pool:
        answers = list(
            pool.map(lambda s: s.command(f"/api/v1/incidents/{target}/rollback", "ops"), (first, second))
        )
    assert {code for code, _ in answers} <= {200, 409} and 200 in {code for code, _ in answers}, answers
    for incident in opened.values():
        final = second.wait_incident(incident, "resolved", "rolled_back", "failed", timeout=120)
        assert final["state"] == ("rolled_back" if incident == target else "resolved"), final["outcome"]

    changes = _slurm_changes(log, offset)
    downs = {node: n for (node, state), n in changes.items() if state == "DOWN"}
    assert downs == dict.fromkeys(NODES, 1), changes
    # Each DOWN's DRAIN (ReturnToService=2), once: the killed leader's last DOWN had none yet, and
    # the process that took over added it.
    drains = {node: n for (node, state), n in changes.items() if state in DRAIN}
    assert drains == dict.fromkeys(NODES, 1), changes
    resumed = Counter(
        node
        for (node, state), n in changes.items()
        if state != "DOWN" and state not in DRAIN
        for _ in range(n)
    )
    assert resumed == Counter(dict.fromkeys(NODES, 1)), changes
    calls = _k8s_calls(journal)
    assert {c: n for c, n in calls.items() if n > 1} == {}, calls
    for node in NODES:
        assert calls[("cordon", node)] == 1 and calls[("replace", node)] == 1, calls
    # Back in service (a resumed node is NOT_RESPONDING until its slurmd registers again).
    wait_until(lambda: all(slurm.node(n).in_service for n in NODES), timeout=60, what="every node in service")
    print(f"\n  slurmctld: {dict(changes)}")
