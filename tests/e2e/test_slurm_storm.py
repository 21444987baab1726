"""A correlated storm on a small Slurm-only cluster: XID 79 on all four nodes at once.

The real ``pitcrew serve`` in auto mode with its default guards (max_nodes 3, max_fraction
5%), ``integrations.scheduler: slurm`` and ``integrations.cluster: none`` — no Kubernetes to
count the fleet — against a real 4-node Slurm cluster of its own (gpu-001..004, partition
gpu), started in a directory of its own and stopped at its end. Four deliveries arrive
together. Cases: exactly one Slurm node goes DOWN, with pitcrew's reason; the other three
incidents are suppressed, each outcome naming the fleet the breaker used ("fleet of 4 nodes
from Slurm partitions gpu"); the let-through incident's guard decision names it too; one
breaker notice (not three), whose reason names the fleet; the three other nodes stay in
service.

Nodes others took out count: with gpu-001 and gpu-002 drained by hand (``admin: bios
update``) and gpu-003 by a simulated health check (``NHC: …``), a storm on gpu-004 takes
nothing; its incident is suppressed, and its outcome, the breaker notice and the breaker's
state name the three nodes out and who took them out; their drains are left as they were.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from proving_ground.slurm import SlurmCluster
from tests.harness.pitcrew import Pitcrew
from tests.harness.proc import wait_until
from tests.harness.scenarios import delivery, events, notices
from tests.harness.slurm import require_slurm

pytestmark = [pytest.mark.slow, pytest.mark.every_slurm]  # 22.05 and 24.11 in CI
NODES = ("gpu-001", "gpu-002", "gpu-003", "gpu-004")
FLEET = "fleet of 4 nodes from Slurm partitions gpu"


@pytest.fixture
def four_nodes(slurm_version: str) -> Iterator[SlurmCluster]:
    """A cluster of its own (the session's has three nodes), of the test's Slurm version, built as
    the session's is: under a fresh ``mkdtemp`` directory, since munged refuses a socket below
    pytest's private tmp."""
    require_slurm(slurm_version)
    run_dir = Path(tempfile.mkdtemp(prefix="pitcrew-slurm4-"))
    cluster = SlurmCluster(run_dir, nodes=NODES, rest=False, version=slurm_version).start()
    try:
        yield cluster
    finally:
        cluster.stop()
        shutil.rmtree(run_dir, ignore_errors=True)


def test_a_storm_on_every_node_takes_one_node_out(four_nodes: SlurmCluster, pitcrew_factory: Any) -> None:
    settings = four_nodes.pitcrew_settings("scontrol", command_timeout=5)
    settings["integrations"] = {"scheduler": "slurm", "cluster": "none"}
    server: Pitcrew = pitcrew_factory("storm-4", config={"mode": "auto", **settings}, simulated=False).start()

    answers = server.post_many([delivery("xid79-firing.json", node=node) for node in NODES])
    assert [status for status, _ in answers] == [200] * 4
    wait_until(
        lambda: len(server.incidents()) == 4 and all(i["state"] != "open" for i in server.incidents()),
        timeout=60,
        what="every storm incident planned",
    )
    incidents = {i["node"]: server.incident(i["id"]) for i in server.incidents()}
    suppressed = {node: i for node, i in incidents.items() if i["state"] == "suppressed"}
    let_through = sorted(set(incidents) - set(suppressed))
    assert len(let_through) == 1, f"nodes let through the breaker: {let_through}"
    acted_node, acted = let_through[0], incidents[let_through[0]]

    # The one let through is taken out of Slurm with pitcrew's reason; nothing else is.
    server.wait_event(acted["id"], "action", timeout=30)
    down = four_nodes.node(acted_node)
    assert down.down and down.reason.startswith(f"pitcrew: {acted['id']} "), down
    for node in set(NODES) - {acted_node}:
        assert four_nodes.node(node).in_service, node
    [guards] = events(acted, "guards")
    [breaker] = [d for d in guards["data"]["decisions"] if d["guard"] == "breaker"]
    assert breaker["ok"] and f"25.0% of the {FLEET}" in breaker["words"], breaker

    # The others wait, and say why: the fleet the breaker measured them against, and its source.
    assert len(suppressed) == 3
    for node, incident in suppressed.items():
        assert "breaker" in incident["outcome"] and FLEET in incident["outcome"], (node, incident["outcome"])
    [notice] = notices(server.journal_records(), "breaker")
    assert any("2 of 4 nodes (50.0%)" in line and FLEET in line for line in notice["lines"]), notice


#: Taken out before the storm, not by pitcrew: two by hand, one by a (simulated) health check.
OUT_BEFORE = {
    "gpu-001": "admin: bios update",
    "gpu-002": "admin: bios update",
    "gpu-003": "NHC: check_gpu failed (simulated health check)",
}


def test_nodes_others_took_out_leave_no_room(four_nodes: SlurmCluster, pitcrew_factory: Any) -> None:
    """3 of 4 nodes already drained by others: a storm on the fourth takes nothing, and the
    breaker opens saying which three are out and who took them out."""
    for node, reason in OUT_BEFORE.items():
        four_nodes.run("scontrol", "update", f"NodeName={node}", "State=DRAIN", f"Reason={reason}")
    settings = four_nodes.pitcrew_settings("scontrol", command_timeout=5)
    settings["integrations"] = {"scheduler": "slurm", "cluster": "none"}
    server: Pitcrew = pitcrew_factory(
        "storm-out", config={"mode": "auto", **settings}, simulated=False
    ).start()

    storm = [delivery("xid79-firing.json", node="gpu-004", starts=_starts(n)) for n in range(5)]
    answers = server.post_many(storm)
    assert [status for status, _ in answers] == [200] * len(storm)
    wait_until(
        lambda: server.incidents() and all(i["state"] not in {"open", "guarded"} for i in server.incidents()),
        timeout=60,
        what="every storm incident planned",
    )
    said = (
        "3 of 4 nodes already out: 2 by an administrator (gpu-001: admin: bios update, gpu-002: admin: bios "
        "update), 1 by Slurm's health check (gpu-003: NHC: check_gpu failed (simulated health check))"
    )
    fourth = [server.incident(i["id"]) for i in server.incidents() if i["node"] == "gpu-004"]
    assert fourth and all(i["state"] == "suppressed" for i in fourth), [i["state"] for i in fourth]
    assert said in fourth[0]["outcome"], fourth[0]["outcome"]
    assert not any(events(server.incident(i["id"]), "action") for i in server.incidents())
    assert four_nodes.node("gpu-004").in_service  # nothing taken
    for node, reason in OUT_BEFORE.items():  # and nothing of theirs touched
        state = four_nodes.node(node)
        assert state.drained and state.reason == reason, state
    [notice] = notices(server.journal_records(), "breaker")
    assert said in notice["lines"][0], notice
    status, raw = server.request(
        "GET", "/api/v1/status", headers={"Authorization": f"Bearer {server.admin_token}"}
    )
    assert status == 200 and said in json.loads(raw)["breaker"]["reason"], raw


def _starts(minute: int) -> datetime:
    return datetime.now(UTC) - timedelta(minutes=minute)
