"""Commands over HTTP against the real service: serialised per incident, checked actors.

Cases (each a defect the adversarial pass found): a rollback POSTed right after the delivery
that opened the incident ends it ``rolled_back`` once — no loop, one notice, the next fault
on the node is remediated; ten rollback requests at once, once ``cordon`` reached the far
side (50 ms round trips), bring one ``uncordon`` and one ``slurm_resume`` to the far side and
nine 409s; approve, reject and rollback at once on an incident awaiting approval: one 200,
two 409; a rollback while paused is a 409 that changes nothing, unless ``"force": true``
(audited); ``mallory:alice`` is not ``alice``; actors with control characters or 100 KB are
a 400 and nothing is audited.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections import Counter
from pathlib import Path
from typing import Any

import aiohttp

from tests.harness.pitcrew import Pitcrew
from tests.harness.scenarios import delivery, destructive_calls, gpu_node, inventory, notices

RELAXED = {"breaker": {"max_nodes": 10, "max_fraction": 1.0}, "node": {"cooldown": "0s"}}
NODE = "gpu-node-01"


def _server(factory: Any, tmp_path: Path, name: str, **config: Any) -> Pitcrew:
    world = inventory(
        tmp_path / f"{name}.yaml",
        {NODE: gpu_node("ml-train/a", "ml-train/b"), "gpu-node-02": gpu_node(), "gpu-node-03": gpu_node()},
        [],
    )
    settings = {"mode": "auto", "guards": RELAXED, **config}
    server: Pitcrew = factory(name, config=settings, world={"inventory": str(world), "latency": "50ms"})
    return server.start()


def _at_once(server: Pitcrew, requests: list[tuple[str, dict[str, Any]]]) -> list[int]:
    """POST every (path, body) at the same moment; the status codes, in order."""

    async def run() -> list[int]:
        headers = {"Authorization": f"Bearer {server.admin_token}"}
        async with aiohttp.ClientSession(headers=headers) as session:

            async def one(path: str, body: dict[str, Any]) -> int:
                async with session.post(server.url + path, json=body) as response:
                    await response.read()
                    return response.status

            return list(await asyncio.gather(*(one(path, body) for path, body in requests)))

    return asyncio.run(run())


def test_rolling_back_an_open_incident_ends_it_once(pitcrew_factory: Any, tmp_path: Path) -> None:
    server = _server(pitcrew_factory, tmp_path, "open-rollback")
    _, body = server.post_alerts(delivery(node=NODE))
    [incident] = body["opened"]
    status, answer = server.command(f"/api/v1/incidents/{incident}/rollback", "alice")
    assert status == 200, answer
    done = server.wait_incident(incident, "rolled_back", timeout=20)
    time.sleep(1.5)  # several engine polls: nothing runs the rollback again
    again = server.incident(incident)
    assert again["state"] == "rolled_back"
    assert sum(e["kind"] == "rollback_done" for e in again["events"]) == 1
    assert (
        len([n for n in notices(server.journal_records(), "rollback") if n["incident_id"] == incident]) == 1
    )
    assert done["outcome"] == "rolled back by alice"
    _, later = server.post_alerts(delivery(node=NODE))  # a new occurrence: a new incident, remediated
    [fresh] = later["opened"]
    assert fresh != incident
    assert server.wait_incident(fresh, "resolved", "failed", timeout=60)["state"] == "resolved"


def test_ten_rollbacks_at_once_undo_once(pitcrew_factory: Any, tmp_path: Path) -> None:
    server = _server(pitcrew_factory, tmp_path, "ten-rollbacks")
    _, body = server.post_alerts(delivery(node=NODE))
    [incident] = body["opened"]
    server.wait_call("cordon", NODE)
    codes = _at_once(
        server, [(f"/api/v1/incidents/{incident}/rollback", {"actor": f"u{i}"}) for i in range(10)]
    )
    assert Counter(codes) == {200: 1, 409: 9}, codes
    server.wait_incident(incident, "rolled_back", timeout=20)
    calls = destructive_calls(server.journal_records())
    assert calls[("uncordon", NODE)] == 1 and calls[("slurm_resume", NODE)] == 1


def test_approve_reject_and_rollback_at_once_carry_out_one(pitcrew_factory: Any, tmp_path: Path) -> None:
    server = _server(
        pitcrew_factory, tmp_path, "decide-at-once", mode="approve", approvals={"approvers": ["alice"]}
    )
    _, body = server.post_alerts(delivery(node=NODE))
    [incident] = body["opened"]
    server.wait_incident(incident, "awaiting_approval", timeout=20)
    codes = _at_once(
        server,
        [
            (f"/api/v1/incidents/{incident}/{verb}", {"actor": "alice"})
            for verb in ("approve", "reject", "rollback")
        ],
    )
    assert sorted(codes) == [200, 409, 409], codes


def test_rollback_while_paused_needs_force(pitcrew_factory: Any, tmp_path: Path) -> None:
    server = _server(pitcrew_factory, tmp_path, "paused-rollback")
    _, body = server.post_alerts(delivery(node=NODE))
    [incident] = body["opened"]
    server.wait_call("cordon", NODE)
    assert server.command("/api/v1/pause", "ops", reason="fabric check")[0] == 200
    before = destructive_calls(server.journal_records())
    status, answer = server.command(f"/api/v1/incidents/{incident}/rollback", "alice")
    assert status == 409 and "paused" in answer["message"]
    assert destructive_calls(server.journal_records()) == before
    status, answer = server.command(f"/api/v1/incidents/{incident}/rollback", "alice", force=True)
    assert status == 200, answer
    assert destructive_calls(server.journal_records())[("uncordon", NODE)] == 1
    assert [e["actor"] for e in server.incident(incident)["events"] if e["kind"] == "rollback_forced"] == [
        "alice"
    ]
    assert server.command(f"/api/v1/incidents/{incident}/rollback", "alice", force="yes")[0] == 400


def test_actors_are_whole_and_bounded(pitcrew_factory: Any, tmp_path: Path) -> None:
    server = _server(
        pitcrew_factory,
        tmp_path,
        "actors",
        mode="approve",
        approvals={"approvers": ["alice", "slack:U0ALICE"]},
    )
    _, body = server.post_alerts(delivery(node=NODE))
    [incident] = body["opened"]
    server.wait_incident(incident, "awaiting_approval", timeout=20)
    path = f"/api/v1/incidents/{incident}/approve"
    for actor in ("alice\x00", "a" * 100_000, "al\nice", "   "):
        status, answer = server.command(path, actor)
        assert status == 400, (actor[:20], answer)
    status, answer = server.command(path, "mallory:alice")
    assert status == 403, answer
    events = server.incident(incident)["events"]
    assert [e["actor"] for e in events if e["kind"] == "approve_refused"] == ["mallory:alice"]
    assert server.command(path, "cli:alice")[0] == 200
    assert json.dumps(events).count("\\u0000") == 0
