"""Commands over HTTP against the real service: serialised per incident, checked actors.

Cases (each a defect the adversarial pass found): a rollback POSTed right after the delivery
that opened the incident ends it ``rolled_back`` once — no loop, one notice, the next fault
on the node is remediated; ten rollback requests at once, once ``cordon`` reached the far
side (50 ms round trips), bring one ``uncordon`` and one ``slurm_resume`` to the far side and
nine 409s; approve, reject and rollback at once on an incident awaiting approval: one 200,
two 409; a rollback while paused is a 409 that changes nothing, unless ``"force": true``
(audited); actors with control characters or 10,000 characters are a 400, of 100 KB a 413, and nothing
is audited; an actor
is a bare name, audited as ``http:NAME`` (``cli:NAME`` when pitcrew's CLI says it is the caller),
so a body naming a channel (``slack:U0ALICE``, ``cli:alice``, ``mallory:alice``) is a 400, never
audited as that identity; a body nested 5,000 deep (10 KB) is a 400 (not a 500), a reason of 501
characters a 400 naming the limit, of 1 MB a 413, and neither pauses anything.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import sqlite3
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
    assert done["outcome"] == "rolled back by http:alice"
    _, later = server.post_alerts(delivery(node=NODE))  # a new occurrence: a new incident, remediated
    [fresh] = later["opened"]
    assert fresh != incident
    assert server.wait_incident(fresh, "resolved", "failed", timeout=60)["state"] == "resolved"
    # A whole playbook on the node has run since: nothing ran the rollback again.
    again = server.incident(incident)
    assert again["state"] == "rolled_back"
    assert sum(e["kind"] == "rollback_done" for e in again["events"]) == 1
    assert (
        len([n for n in notices(server.journal_records(), "rollback") if n["incident_id"] == incident]) == 1
    )


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
    """Whichever of the three is carried out first, the others see its outcome: approve and reject
    never both succeed, and what ran is consistent with what was answered. (A rollback arriving
    after an approval has been carried out is a rollback of an approved incident, not a race.)"""
    server = _server(
        pitcrew_factory, tmp_path, "decide-at-once", mode="approve", approvals={"approvers": ["alice"]}
    )
    _, body = server.post_alerts(delivery(node=NODE))
    [incident] = body["opened"]
    server.wait_incident(incident, "awaiting_approval", timeout=20)
    verbs = ("approve", "reject", "rollback")
    codes = dict(
        zip(
            verbs,
            _at_once(
                server, [(f"/api/v1/incidents/{incident}/{verb}", {"actor": "alice"}) for verb in verbs]
            ),
            strict=True,
        )
    )
    assert set(codes.values()) <= {200, 409} and 200 in codes.values(), codes
    assert not (codes["approve"] == codes["reject"] == 200), codes
    done = server.wait_incident(incident, "resolved", "failed", "rolled_back", "suppressed", timeout=60)
    calls = destructive_calls(server.journal_records())
    if codes["approve"] != 200:  # rejected or rolled back before any decision: nothing was done
        assert not calls, calls
        assert done["state"] in {"suppressed", "rolled_back"}, done["state"]
    elif codes["rollback"] == 200:  # approved, then undone: each change undone once
        assert done["state"] == "rolled_back", done["state"]
        assert calls[("uncordon", NODE)] == calls[("cordon", NODE)] <= 1, calls
    else:
        assert done["state"] == "resolved", done["state"]
    decisions = [e["kind"] for e in done["events"] if e["kind"] in {"approved", "rejected"}]
    assert decisions == [verb + "d" for verb in ("approve", "reject") if codes[verb] == 200], decisions


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
        "http:alice"
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
    for actor in ("alice\x00", "a" * 10_000, "al\nice", "   "):
        status, answer = server.command(path, actor)
        assert status == 400, (actor[:20], answer)
    assert server.command(path, "a" * 100_000)[0] == 413  # above the command body's bound
    # The channel is pitcrew's to record: a body naming one (a Slack user, the CLI, any prefix) is
    # refused, not audited as that identity.
    for actor in ("slack:U0ALICE", "cli:alice", "http:alice", "mallory:alice"):
        status, answer = server.command(path, actor)
        assert status == 400 and "bare name" in answer["error"], (actor, answer)
    status, answer = server.command(path, "mallory")
    assert status == 403, answer
    events = server.incident(incident)["events"]
    assert [e["actor"] for e in events if e["kind"] == "approve_refused"] == ["http:mallory"]
    assert server.command(path, "alice")[0] == 200
    assert server.incident(incident)["approval"]["decided_by"] == "http:alice"
    assert json.dumps(events).count("\\u0000") == 0


def test_the_cli_is_audited_as_cli_and_http_as_http(pitcrew_factory: Any, tmp_path: Path) -> None:
    server = _server(pitcrew_factory, tmp_path, "channels")
    cli = {"Authorization": f"Bearer {server.admin_token}", "Pitcrew-Client": "cli"}
    status, _ = server.request("POST", "/api/v1/pause", json.dumps({"actor": "ops"}).encode(), cli)
    assert status == 200
    assert server.command("/api/v1/resume", "ops")[0] == 200
    kinds = {"paused", "resumed"}
    audited = [(e["kind"], e["actor"]) for e in _global_events(server) if e["kind"] in kinds]
    assert audited == [("paused", "cli:ops"), ("resumed", "http:ops")]


def test_command_bodies_are_bounded(pitcrew_factory: Any, tmp_path: Path) -> None:
    server = _server(pitcrew_factory, tmp_path, "bodies")
    admin = {"Authorization": f"Bearer {server.admin_token}", "Content-Type": "application/json"}
    deep = b'{"actor": "ops", "reason": "x", "extra": ' + b"[" * 5_000 + b"]" * 5_000 + b"}"
    status, raw = server.request("POST", "/api/v1/pause", deep, admin)
    assert status == 400 and b"body must be JSON" in raw, raw[:200]
    status, answer = server.command("/api/v1/pause", "ops", reason="r" * 501)
    assert status == 400 and "at most 500" in answer["error"], answer
    status, answer = server.command("/api/v1/pause", "ops", reason="r" * 1_000_000)
    assert status == 413 and "16384 bytes" in answer["error"], answer
    status, answer = server.command("/api/v1/pause", "ops", reason={"nested": "text"})
    assert status == 400 and "reason must be a string" in answer["error"], answer
    assert b'"paused": false' in server.request("GET", "/api/v1/status", headers=admin)[1]
    status, answer = server.command("/api/v1/pause", "ops", reason="r" * 500)
    assert status == 200, answer
    assert [e["detail"] for e in _global_events(server) if e["kind"] == "paused"] == ["r" * 500]


def _global_events(server: Pitcrew) -> list[dict[str, Any]]:
    """The audit events that belong to no incident (pause, resume, breaker), oldest first, read
    from the store's file (the read API lists incidents' events only)."""
    with contextlib.closing(sqlite3.connect(f"file:{server.store}?mode=ro", uri=True)) as db:
        db.row_factory = sqlite3.Row
        rows = db.execute("SELECT kind, actor, detail FROM events WHERE incident_id IS NULL ORDER BY seq")
        return [dict(row) for row in rows]
