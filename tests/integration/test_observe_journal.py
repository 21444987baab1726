"""Observe mode on the dry-run journal: the real ``pitcrew serve``, no simulator anywhere.

Cases: with the default integrations (scheduler and cluster: the journal; notifier: the
log) pitcrew starts in observe mode; an XID 79 delivery opens a replace-node incident whose
node steps are skipped, each saying what it would have done; the dry-run journal then holds
the notices humans were sent, each marked ``"dry_run": true``, and nothing else — no node,
no job, no state of any far side; the notices are in the log too.
"""

from __future__ import annotations

import json
from typing import Any

from tests.harness.pitcrew import Pitcrew
from tests.harness.proc import wait_until
from tests.harness.scenarios import delivery, events, notices

NODE_STEPS = ["slurm_down", "cordon", "drain", "replace", "wait_ready", "slurm_resume", "confirm_resumed"]


def test_observe_mode_writes_down_what_it_would_do_and_holds_no_state(pitcrew_factory: Any) -> None:
    server: Pitcrew = pitcrew_factory("observe", config={"mode": "observe"}, simulated=False).start()
    assert server.argv[2:4] == ["bot.cli", "serve"]
    _, body = server.post_alerts(delivery("xid79-firing.json", node="gpu-node-02"))
    [incident_id] = body["opened"]

    def all_skipped() -> bool:
        return {e["step"] for e in events(server.incident(incident_id), "step_skipped")} >= set(NODE_STEPS)

    wait_until(all_skipped, timeout=30, interval=0.1, what="every node step of replace-node skipped")
    incident = server.incident(incident_id)
    assert incident["playbook"] == "replace-node" and incident["mode"] == "observe"
    skipped = {e["step"]: e["detail"] for e in events(incident, "step_skipped")}
    assert skipped["slurm_down"] == (
        "observe mode: would set the Slurm node DOWN with pitcrew's reason (after recording its jobs)"
    )
    assert skipped["replace"] == "observe mode: would start a replacement of the node"
    assert all(detail.startswith("observe mode: would ") for detail in skipped.values())
    assert not events(incident, "action")

    wait_until(
        lambda: bool(notices(server.journal_records(), "incident")), timeout=10, what="incident notice"
    )
    records = server.journal_records()
    assert {r["op"] for r in records} == {"notice"}  # what would have been said; nothing was done
    assert all(r["dry_run"] is True for r in records)
    [notice] = notices(records, "incident")
    assert notice["incident_id"] == incident_id
    assert notice["title"].startswith("gpu-node-02: ") and notice["title"].endswith("→ replace-node")
    assert any("Plan: replace-node" in line and "(mode observe)" in line for line in notice["lines"])
    assert notice["actions"] == []  # observe mode changes nothing, so there is nothing to roll back

    logged = [json.loads(line) for line in server.log.read_text().splitlines() if line.startswith("{")]
    [entry] = [e for e in logged if e.get("logger") == "pitcrew.notice" and e.get("kind") == "incident"]
    assert entry["incident"] == incident_id and entry["title"] == notice["title"]
    assert entry["lines"] == notice["lines"] and entry["severity"] == notice["severity"]
