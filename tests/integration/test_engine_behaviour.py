"""Engine behaviour that operators rely on, through the real service.

Cases: a resolved alert arriving mid-playbook is recorded and shown but aborts and undoes
nothing; a more severe fault arriving on a node under way replans the incident (reset-gpu
→ replace-node) without repeating what was done; a far side that refuses a call escalates
to humans at once (transient failures are retried: see the Slurm outage tests); every step and action is counted in /metrics; a
user-defined playbook is validated and used.
"""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from tests.harness.pitcrew import Pitcrew
from tests.harness.scenarios import delivery, destructive_calls, gpu_node, inventory, notices

RELAXED = {"breaker": {"max_nodes": 10, "max_fraction": 1.0}}


def test_resolved_alert_mid_playbook_is_shown_but_changes_nothing(pitcrew_factory: Any) -> None:
    server: Pitcrew = pitcrew_factory(
        "resolved-mid",
        config={"mode": "auto", "guards": RELAXED},
        world={"latency": "200ms"},
    ).start()
    starts = datetime.now(UTC)
    _, body = server.post_alerts(delivery(node="gpu-node-02", starts=starts))
    incident = body["opened"][0]
    server.wait_call("cordon", "gpu-node-02")
    status, answer = server.post_alerts(delivery(node="gpu-node-02", starts=starts, status="resolved"))
    assert status == 200 and answer["resolved"] == 3
    done = server.wait_incident(incident, "resolved", timeout=60)
    assert sum(e["kind"] == "alert_resolved" for e in done["events"]) == 3
    assert {a["status"] for a in done["alerts"]} == {"resolved"}
    calls = destructive_calls(server.journal_records())
    assert calls[("replace", "gpu-node-02")] == 1  # the playbook went on to its end
    assert ("uncordon", "gpu-node-02") not in calls  # nothing was undone because of the resolution


def test_a_more_severe_fault_replans_without_repeating_work(pitcrew_factory: Any) -> None:
    server: Pitcrew = pitcrew_factory(
        "replan", config={"mode": "auto", "guards": RELAXED}, world={"latency": "250ms"}
    ).start()
    _, first = server.post_alerts(delivery("xid48-then-xid154-1-after-xid48.json", node="gpu-node-07"))
    incident = first["opened"][0]
    server.wait_call("cordon", "gpu-node-07")
    _, second = server.post_alerts(delivery("xid79-firing.json", node="gpu-node-07"))
    assert second["attached"] == [incident] and not second["opened"]
    done = server.wait_incident(incident, "resolved", timeout=60)
    assert done["playbook"] == "replace-node"
    assert any(e["kind"] == "replanned" and "reset-gpu → replace-node" in e["detail"] for e in done["events"])
    calls = destructive_calls(server.journal_records())
    assert calls[("slurm_down", "gpu-node-07")] == 1 and calls[("cordon", "gpu-node-07")] == 1
    assert calls[("replace", "gpu-node-07")] == 1
    assert ("reset_gpu", "gpu-node-07") not in calls
    assert len(notices(server.journal_records(), "incident")) == 2  # humans hear about the new plan


def test_a_refusing_far_side_escalates_to_humans(pitcrew_factory: Any, tmp_path: Path) -> None:
    world = inventory(tmp_path / "inventory.yaml", {"gpu-node-01": gpu_node()}, [])
    server: Pitcrew = pitcrew_factory(
        "escalate",
        config={
            "mode": "auto",
            "guards": RELAXED,
            "playbooks": {
                "replace-node": {
                    "steps": ["notify", {"step": "slurm_down", "attempts": 3}, "cordon", "close"],
                }
            },
        },
        world={"inventory": world},
    ).start()
    # gpu-node-09 is not in the inventory: every call about it is refused by the far side.
    _, body = server.post_alerts(delivery(node="gpu-node-09"))
    failed = server.wait_incident(body["opened"][0], "failed", timeout=30)
    assert failed["outcome"].startswith("slurm_down failed:")
    assert [n["incident_id"] for n in notices(server.journal_records(), "escalation")] == body["opened"]
    assert not destructive_calls(server.journal_records())
    text = server.request("GET", "/metrics")[1].decode()
    assert 'pitcrew_steps_total{outcome="escalated",step="slurm_down"} 1.0' in text
    assert 'pitcrew_incidents_closed_total{playbook="replace-node",state="failed"} 1.0' in text


def test_metrics_count_steps_actions_and_recovery(pitcrew_factory: Any) -> None:
    server: Pitcrew = pitcrew_factory("metrics", config={"mode": "auto", "guards": RELAXED}).start()
    _, body = server.post_alerts(delivery(node="gpu-node-02"))
    server.wait_incident(body["opened"][0], "resolved", timeout=30)
    text = server.request("GET", "/metrics")[1].decode()
    for line in (
        'pitcrew_steps_total{outcome="ok",step="slurm_down"} 1.0',
        'pitcrew_steps_total{outcome="ok",step="replace"} 1.0',
        'pitcrew_actions_total{action="slurm_down"} 1.0',
        'pitcrew_actions_total{action="cordon"} 1.0',
        'pitcrew_actions_total{action="replace"} 1.0',
        'pitcrew_time_to_recovery_seconds_count{playbook="replace-node"} 1.0',
        'pitcrew_step_duration_seconds_count{step="drain"} 1.0',
        "pitcrew_breaker_open 0.0",
        'pitcrew_incidents_closed_total{playbook="replace-node",state="resolved"} 1.0',
    ):
        assert line in text, line
    assert "pitcrew_incidents_active{" in text and "pitcrew_incident_oldest_active_seconds" in text


def test_a_user_playbook_is_validated_and_used(pitcrew_factory: Any) -> None:
    server: Pitcrew = pitcrew_factory(
        "custom",
        config={
            "mode": "auto",
            "guards": RELAXED,
            "playbooks": {
                "drain-and-reboot": {
                    "description": "site policy for XID 79",
                    "steps": [
                        "notify",
                        "slurm_down",
                        "cordon",
                        "drain",
                        {"step": "reboot", "timeout": "5m"},
                        "wait_ready",
                        "slurm_resume",
                        "confirm_resumed",
                        "close",
                    ],
                }
            },
            "catalog": {"overrides": {"79": {"playbook": "drain-and-reboot"}}},
        },
    ).start()
    _, body = server.post_alerts(delivery(node="gpu-node-02"))
    done = server.wait_incident(body["opened"][0], "resolved", timeout=30)
    assert done["playbook"] == "drain-and-reboot"
    calls = destructive_calls(server.journal_records())
    assert calls[("reboot", "gpu-node-02")] == 1 and ("replace", "gpu-node-02") not in calls
