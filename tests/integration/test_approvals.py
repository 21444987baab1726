"""Approvals, end to end through the command API: nothing destructive runs unapproved.

Cases: approve mode waits with the request persisted; an approval from someone not on the
allowlist is refused (403) and audited; an allowed approver lets it run; a rejection and a
deadline both end the incident with nothing done and humans told; the approval survives a
restart of pitcrew; pause holds mutating steps until resume.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.harness.engine_scans import scrape, wait_scans
from tests.harness.pitcrew import Pitcrew
from tests.harness.scenarios import delivery, destructive_calls, gpu_node, inventory, notices


def _approving(pitcrew_factory: Any, tmp_path: Path, name: str, timeout: str) -> Pitcrew:
    world = inventory(
        tmp_path / f"{name}-inventory.yaml",
        {f"gpu-node-0{n}": gpu_node(f"ml-train/worker-{n}") for n in range(1, 7)},
        [{"job_id": "201", "name": "llm", "user": "dana", "node": "gpu-node-02"}],
    )
    server: Pitcrew = pitcrew_factory(
        name,
        config={
            "mode": "approve",
            "approvals": {"approvers": ["alice", "slack:U0ALICE"], "timeout": timeout},
            "guards": {"breaker": {"max_nodes": 10, "max_fraction": 1.0}, "node": {"cooldown": "0s"}},
        },
        world={"inventory": world},
    )
    return server.start()


@pytest.fixture
def server(pitcrew_factory: Any, tmp_path: Path) -> Pitcrew:
    """Approvals that wait a minute: on a loaded machine no test races the deadline by accident."""
    return _approving(pitcrew_factory, tmp_path, "approve", "60s")


def _events(server: Pitcrew, incident: str, kind: str) -> list[dict[str, Any]]:
    return [e for e in server.incident(incident)["events"] if e["kind"] == kind]


def test_unapproved_steps_never_run_and_strangers_are_refused(server: Pitcrew) -> None:
    _, body = server.post_alerts(delivery(node="gpu-node-02"))
    incident = body["opened"][0]
    waiting = server.wait_incident(incident, "awaiting_approval")
    assert waiting["approval"]["status"] == "pending"
    assert waiting["approval"]["approvers"] == ["alice", "slack:U0ALICE"]
    wait_scans(scrape(server))  # the engine looked again, three times: nothing was done
    assert not destructive_calls(server.journal_records())
    assert [n["actions"] for n in notices(server.journal_records(), "incident")] == [
        ["approve", "reject", "rollback"]
    ]

    code, answer = server.command(f"/api/v1/incidents/{incident}/approve", "mallory")
    assert code == 403, answer
    refused = _events(server, incident, "approve_refused")
    assert refused and refused[0]["actor"] == "http:mallory" and refused[0]["outcome"] == "refused"
    assert server.incident(incident)["state"] == "awaiting_approval"
    assert not destructive_calls(server.journal_records())

    # The channel is pitcrew's to record: an HTTP caller cannot claim a Slack identity.
    code, answer = server.command(f"/api/v1/incidents/{incident}/approve", "slack:U0ALICE")
    assert code == 400 and "bare name" in answer["error"], answer
    assert server.incident(incident)["state"] == "awaiting_approval"
    code, _ = server.command(f"/api/v1/incidents/{incident}/approve", "alice")
    assert code == 200
    done = server.wait_incident(incident, "resolved", timeout=30)
    assert done["approval"]["decided_by"] == "http:alice"
    assert _events(server, incident, "approved")[0]["actor"] == "http:alice"
    assert destructive_calls(server.journal_records())[("slurm_down", "gpu-node-02")] == 1
    # Approving twice is a conflict, audited too.
    code, _ = server.command(f"/api/v1/incidents/{incident}/approve", "alice")
    assert code == 409


def test_rejection_and_timeout_do_nothing_and_say_so(
    server: Pitcrew, pitcrew_factory: Any, tmp_path: Path
) -> None:
    expiring = _approving(pitcrew_factory, tmp_path, "expire", "4s")
    _, rejected = server.post_alerts(delivery(node="gpu-node-03"))
    _, expired = expiring.post_alerts(delivery(node="gpu-node-04"))
    server.wait_incident(rejected["opened"][0], "awaiting_approval")
    code, _ = server.command(f"/api/v1/incidents/{rejected['opened'][0]}/reject", "alice")
    assert code == 200
    gone = server.wait_incident(rejected["opened"][0], "suppressed")
    assert gone["outcome"] == "rejected by http:alice"

    timed_out = expiring.wait_incident(expired["opened"][0], "suppressed", timeout=30)
    assert timed_out["outcome"] == "approval timed out: nothing was done"
    assert timed_out["approval"]["status"] == "expired"
    assert [n["incident_id"] for n in notices(expiring.journal_records(), "approval_expired")] == [
        expired["opened"][0]
    ]
    assert not destructive_calls(server.journal_records())
    assert not destructive_calls(expiring.journal_records())


def test_a_pending_approval_survives_a_restart(server: Pitcrew) -> None:
    _, body = server.post_alerts(delivery(node="gpu-node-05"))
    incident = body["opened"][0]
    server.wait_incident(incident, "awaiting_approval")
    server.kill()
    server.start()
    assert server.incident(incident)["approval"]["status"] == "pending"
    assert server.command(f"/api/v1/incidents/{incident}/approve", "alice")[0] == 200
    assert server.wait_incident(incident, "resolved", timeout=30)["state"] == "resolved"
    assert destructive_calls(server.journal_records())[("cordon", "gpu-node-05")] == 1


def test_pause_is_a_kill_switch(pitcrew_factory: Any) -> None:
    server: Pitcrew = pitcrew_factory(
        "pause", config={"mode": "auto", "guards": {"breaker": {"max_nodes": 10, "max_fraction": 1.0}}}
    ).start()
    assert server.command("/api/v1/pause", "oncall", reason="maintenance")[0] == 200
    _, body = server.post_alerts(delivery(node="gpu-node-06"))
    incident = server.wait_incident(body["opened"][0], "suppressed")
    assert "paused" in incident["outcome"]
    assert not destructive_calls(server.journal_records())
    assert server.command("/api/v1/resume", "oncall")[0] == 200
    _, later = server.post_alerts(delivery(node="gpu-node-01"))
    assert server.wait_incident(later["opened"][0], "resolved", timeout=30)["state"] == "resolved"
    status, raw = server.request(
        "GET", "/api/v1/status", headers={"Authorization": f"Bearer {server.admin_token}"}
    )
    assert status == 200 and b'"paused": false' in raw
    code, _ = server.command("/api/v1/pause", "")
    assert code == 400  # who paused must be known


def test_pause_holds_a_running_incident_at_its_next_destructive_step(pitcrew_factory: Any) -> None:
    server: Pitcrew = pitcrew_factory(
        "hold",
        config={
            "mode": "auto",
            "guards": {"breaker": {"max_nodes": 10, "max_fraction": 1.0}},
        },
        world={"latency": "200ms"},
    ).start()
    _, body = server.post_alerts(delivery(node="gpu-node-02"))
    incident = body["opened"][0]
    server.wait_call("slurm_down", "gpu-node-02")
    assert server.command("/api/v1/pause", "oncall")[0] == 200
    server.wait_event(incident, "held")
    frozen = destructive_calls(server.journal_records())
    wait_scans(scrape(server))  # the engine looked again, three times: still held
    assert destructive_calls(server.journal_records()) == frozen  # nothing more while paused
    assert ("replace", "gpu-node-02") not in frozen
    assert server.command("/api/v1/resume", "oncall")[0] == 200
    assert server.wait_incident(incident, "resolved", timeout=30)["state"] == "resolved"
    assert destructive_calls(server.journal_records())[("replace", "gpu-node-02")] == 1


def test_cli_commands_reach_the_running_server(server: Pitcrew) -> None:
    import subprocess
    import sys

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [
                sys.executable,
                "-m",
                "bot.cli",
                *args,
                "--config",
                str(server.config_path),
                "--server",
                server.url,
            ],
            capture_output=True,
            text=True,
            check=False,
        )

    _, body = server.post_alerts(delivery(node="gpu-node-06"))
    incident = body["opened"][0]
    server.wait_incident(incident, "awaiting_approval")
    refused = cli("approve", incident, "--as", "mallory")
    assert refused.returncode == 1 and "may not approve" in refused.stdout
    approved = cli("approve", incident, "--as", "alice")
    assert approved.returncode == 0, approved.stderr
    assert server.wait_incident(incident, "resolved", timeout=30)["approval"]["decided_by"] == "cli:alice"
    assert cli("pause", "--reason", "drill", "--as", "oncall").returncode == 0
    assert (
        b'"paused": true'
        in server.request("GET", "/api/v1/status", headers={"Authorization": f"Bearer {server.admin_token}"})[
            1
        ]
    )
    assert cli("resume", "--as", "oncall").returncode == 0
    assert cli("breaker", "reset", "--as", "oncall").returncode == 0
    rolled = cli("rollback", incident, "--as", "alice")
    assert rolled.returncode == 0 and "rolled back by cli:alice" in rolled.stdout
    assert "cordon:" in rolled.stdout  # the report of what was undone
