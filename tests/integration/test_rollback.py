"""Rollback undoes, in reverse, only what pitcrew itself did.

Cases: after cordon-and-ask, rollback puts the node back exactly as before (schedulable,
no pitcrew taint or annotation, its own annotations and labels untouched, Slurm back in
service); a cordon and a Slurm DOWN someone else set are never undone; a rollback in the
middle of replace-node stops the playbook before the replacement and reports the
irreversible drain; rollback is audited with its actor and refused for nonsense.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

from tests.harness.pitcrew import Pitcrew
from tests.harness.scenarios import delivery, destructive_calls, gpu_node, inventory
from tests.simulator.cluster import SimulatedCluster
from tests.simulator.world import SimulatedWorld


def _node_state(server: Pitcrew, inventory_path: Path, node: str) -> dict[str, Any]:
    """The far side's view of a node, replayed from pitcrew's journal over the inventory."""
    world = SimulatedWorld.from_paths(server.journal, inventory_path)

    async def read() -> dict[str, Any]:
        k8s = await SimulatedCluster(world).node(node)
        slurm = await world.node(node)
        assert k8s is not None
        return {
            "unschedulable": k8s.unschedulable,
            "taints": sorted(t.key for t in k8s.taints),
            "annotations": dict(k8s.annotations),
            "labels": dict(k8s.labels),
            "slurm": sorted(slurm.states),
            "reason": slurm.reason,
        }

    return asyncio.run(read())


def _health_fail(node: str) -> bytes:
    body = json.loads(delivery("row-remap-failure-firing.json", node=node))
    for alert in body["alerts"]:
        alert["labels"].update({"alertname": "GpuHealthFail", "fault": "health-fail"})
    return json.dumps(body).encode()


def _world(tmp: Path) -> Path:
    return inventory(
        tmp / "inventory.yaml",
        {
            "gpu-node-01": gpu_node("ml-train/a", annotations={"team": "ml"}, labels={"pool": "h100"}),
            "gpu-node-02": gpu_node("ml-train/b"),
            "gpu-node-03": gpu_node(
                "ml-train/c", unschedulable=True, slurm_state="DOWN", slurm_reason="ops: fan check"
            ),
            "gpu-node-04": gpu_node("ml-train/d", "ml-train/e"),
        },
        [{"job_id": "301", "name": "train", "user": "erin", "node": "gpu-node-04"}],
    )


def _server(pitcrew_factory: Any, world: Path, **extra: Any) -> Pitcrew:
    server: Pitcrew = pitcrew_factory(
        "rollback",
        config={"mode": "auto", "guards": {"breaker": {"max_nodes": 10, "max_fraction": 1.0}}},
        world={"inventory": world, **extra},
    )
    return server.start()


def test_rollback_after_cordon_restores_the_node_exactly(pitcrew_factory: Any, tmp_path: Path) -> None:
    world = _world(tmp_path)
    server = _server(pitcrew_factory, world)
    before = _node_state(server, world, "gpu-node-01")
    _, body = server.post_alerts(_health_fail("gpu-node-01"))
    incident = body["opened"][0]
    done = server.wait_incident(incident, "resolved")
    assert done["playbook"] == "cordon-and-ask"
    during = _node_state(server, world, "gpu-node-01")
    assert during["unschedulable"] and during["taints"] == ["pitcrew.dev/gpu-fault"]
    assert during["annotations"]["pitcrew.dev/incident"] == incident
    assert during["slurm"] == ["DRAIN"] and during["reason"].startswith(f"pitcrew: {incident} ")

    code, answer = server.command(f"/api/v1/incidents/{incident}/rollback", "alice")
    assert code == 200, answer
    assert any("uncordoned" in line for line in answer["report"])
    assert any("gpu-node-01 resumed" in line for line in answer["report"])
    assert _node_state(server, world, "gpu-node-01") == before
    rolled = server.incident(incident)
    assert rolled["state"] == "rolled_back"
    assert rolled["outcome"] == "rolled back by http:alice"
    assert {e["kind"] for e in rolled["events"]} >= {"rollback_requested", "step_undone", "rollback_done"}
    assert all(e["actor"] == "http:alice" for e in rolled["events"] if e["kind"].startswith("rollback"))
    # Twice is harmless and refused.
    assert server.command(f"/api/v1/incidents/{incident}/rollback", "alice")[0] == 409


def test_what_someone_else_set_is_never_undone(pitcrew_factory: Any, tmp_path: Path) -> None:
    world = _world(tmp_path)
    server = _server(pitcrew_factory, world)
    before = _node_state(server, world, "gpu-node-03")
    _, body = server.post_alerts(_health_fail("gpu-node-03"))
    incident = body["opened"][0]
    done = server.wait_incident(incident, "resolved")
    kinds = [e["detail"] for e in done["events"] if e["kind"] == "not_owned"]
    assert any("ops: fan check" in k for k in kinds) and any("cordoned by someone else" in k for k in kinds)
    calls = destructive_calls(server.journal_records())
    assert ("slurm_drain", "gpu-node-03") not in calls and ("cordon", "gpu-node-03") not in calls
    _, answer = server.command(f"/api/v1/incidents/{incident}/rollback", "alice")
    assert _node_state(server, world, "gpu-node-03") == before  # still cordoned, still DOWN with their reason
    assert any("is not pitcrew's" in line for line in answer["report"])
    assert any("someone else" in line for line in answer["report"])
    calls = destructive_calls(server.journal_records())
    assert ("slurm_resume", "gpu-node-03") not in calls and ("uncordon", "gpu-node-03") not in calls


def test_rollback_in_the_middle_stops_the_playbook(pitcrew_factory: Any, tmp_path: Path) -> None:
    world = _world(tmp_path)
    server = _server(pitcrew_factory, world, latency="300ms")
    _, body = server.post_alerts(delivery(node="gpu-node-04"))
    incident = body["opened"][0]
    server.wait_call("evict", "ml-train/d")
    code, answer = server.command(f"/api/v1/incidents/{incident}/rollback", "bob")
    assert code == 200, answer
    assert server.incident(incident)["state"] == "rolled_back"
    # Another node's playbook, started now, reaches its replace: the stopped one had every chance to.
    assert server.post_alerts(delivery(node="gpu-node-02"))[0] == 200
    server.wait_call("replace", "gpu-node-02")
    calls = destructive_calls(server.journal_records())
    assert ("replace", "gpu-node-04") not in calls  # the playbook stopped
    assert calls[("slurm_resume", "gpu-node-04")] == 1 and calls[("uncordon", "gpu-node-04")] == 1
    assert any(line.startswith("drain: irreversible") for line in answer["report"])
    state = _node_state(server, world, "gpu-node-04")
    assert not state["unschedulable"] and state["slurm"] == ["IDLE"]


def test_rollback_of_unknown_or_suppressed_incidents_is_refused(pitcrew_factory: Any, tmp_path: Path) -> None:
    server = _server(pitcrew_factory, _world(tmp_path))
    assert server.command("/api/v1/incidents/pc-99999/rollback", "alice")[0] == 404
    status, _ = server.request("POST", "/api/v1/incidents/pc-00001/rollback", b'{"actor": "x"}')
    assert status == 401  # the command API needs the admin token
