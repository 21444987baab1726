"""Races between two replicas on one PostgreSQL database: what reaches both at once is done once.

Two ``serve`` processes in approve mode on one real PostgreSQL database (the session's throwaway
cluster), in front of one simulated far side (its journal counts every destructive call).

Cases, in one run (two processes are the expensive part):
* the same alerts delivered to both replicas at once, 50 times concurrently (100 requests in
  flight, five nodes): every delivery answered 200, one incident per node, no more;
* on each incident, an Approve sent to one replica and a Reject to the other at the same moment:
  exactly one decision wins (200), the other gets a 409 whose message says the incident was
  already decided, and both are in the incident's audit log — the loser as ``*_refused``
  (``conflict``); every approved incident's destructive calls reach the far side once and a
  rejected one's none.
"""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from tests.harness.pitcrew import Pitcrew
from tests.harness.postgres import PostgresDatabase
from tests.harness.scenarios import delivery, destructive_calls, gpu_node, inventory

pytestmark = pytest.mark.slow
NODES = tuple(f"gpu-node-0{i}" for i in range(1, 6))
ROUNDS = 50


def _post_all(requests: list[tuple[Pitcrew, str, bytes | dict[str, Any]]]) -> list[tuple[int, Any]]:
    """Send every (server, path, body) at the same moment; (status, JSON answer) in order."""

    async def run() -> list[tuple[int, Any]]:
        async with aiohttp.ClientSession() as session:

            async def one(server: Pitcrew, path: str, body: bytes | dict[str, Any]) -> tuple[int, Any]:
                if isinstance(body, bytes):
                    token, data = server.token, body
                else:
                    token, data = server.admin_token, json.dumps(body).encode()
                headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
                async with session.post(server.url + path, headers=headers, data=data) as response:
                    return response.status, json.loads(await response.read())

            return list(await asyncio.gather(*(one(*request) for request in requests)))

    return asyncio.run(run())


def test_two_replicas_take_the_same_thing_at_once_and_do_it_once(
    pitcrew_factory: Any, tmp_path: Path, postgres_db: PostgresDatabase
) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    journal = shared / "far-side.jsonl"
    nodes = {node: gpu_node() for node in (*NODES, "gpu-node-07", "gpu-node-08")}
    world = {"journal": journal, "inventory": inventory(shared / "inventory.yaml", nodes, [])}
    config = {
        "mode": "approve",
        "approvals": {"approvers": ["alice", "bob"]},
        "guards": {"breaker": {"max_nodes": 10, "max_fraction": 1.0}},
        "store": {
            "path": str(shared / "unused.db"),
            "url": postgres_db.url,
            "password_file": str(postgres_db.password_file),
        },
    }
    first = pitcrew_factory("first", config=config, world=world).start()
    second = pitcrew_factory("second", config=config, world=world).start()
    replicas = (first, second)

    deliveries = [delivery("xid79-firing.json", node=NODES[i % len(NODES)]) for i in range(ROUNDS)]
    answers = _post_all([(server, "/api/v1/alerts", body) for body in deliveries for server in replicas])
    assert Counter(status for status, _ in answers) == {200: 2 * ROUNDS}, answers
    opened = [incident for _, answer in answers for incident in answer["opened"]]
    assert len(opened) == len(NODES) == len(set(opened)), opened
    by_node = {node: first.incidents(node) for node in NODES}
    assert {node: len(found) for node, found in by_node.items()} == dict.fromkeys(NODES, 1), by_node
    incidents = {node: found[0]["id"] for node, found in by_node.items()}
    for incident in incidents.values():
        first.wait_incident(incident, "awaiting_approval", timeout=60)

    races = _post_all(
        [
            request
            for incident in incidents.values()
            for request in (
                (first, f"/api/v1/incidents/{incident}/approve", {"actor": "alice"}),
                (second, f"/api/v1/incidents/{incident}/reject", {"actor": "bob"}),
            )
        ]
    )
    winners: dict[str, str] = {}
    for index, (node, incident) in enumerate(incidents.items()):
        (approve_status, approve), (reject_status, reject) = races[2 * index : 2 * index + 2]
        assert sorted((approve_status, reject_status)) == [200, 409], (node, approve, reject)
        won, lost, loser = (
            ("approved", reject, "bob") if approve_status == 200 else ("rejected", approve, "alice")
        )
        assert "decided" in lost["message"] or "no pending approval" in lost["message"], lost
        winners[node] = won
        events = first.incident(incident)["events"]
        decisions = [e for e in events if e["kind"] in {"approved", "rejected"}]
        assert [e["kind"] for e in decisions] == [won], decisions
        refused = [e for e in events if e["kind"].endswith("_refused")]
        assert [(e["actor"], e["outcome"]) for e in refused] == [(f"http:{loser}", "conflict")], events

    for node, incident in incidents.items():
        final = first.wait_incident(incident, "resolved", "suppressed", "failed", timeout=120)
        assert (final["state"] == "resolved") == (winners[node] == "approved"), (node, winners[node], final)
    calls = destructive_calls([json.loads(line) for line in journal.read_text().splitlines() if line.strip()])
    assert {c: n for c, n in calls.items() if n > 1} == {}, calls
    for node, won in winners.items():
        expected = 1 if won == "approved" else 0
        assert calls[("slurm_down", node)] == expected and calls[("cordon", node)] == expected, (node, calls)
    print(
        f"\n  {2 * ROUNDS} concurrent deliveries: {len(opened)} incidents; decisions {Counter(winners.values())}"
    )
