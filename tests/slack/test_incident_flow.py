"""An XID 79 incident in approve mode, decided from Slack, once over HTTP mode and once over Socket Mode.

Cases (each transport): the parent message and its thread appear, with the Grafana and runbook
links and Approve / Reject / Rollback buttons; a non-approver's click is refused politely, audited
with the Slack user id and shown in the thread; an allowlisted Approve runs the playbook; Rollback
(after a refused one) undoes what pitcrew did; Reject of a second incident stops its playbook with
nothing done; after each decision the parent says who did what and offers only what is still
possible; every click is in the audit log as ``slack:<user id>``; ``/pitcrew status`` answers
ephemerally.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from bot.integrations.slack.messages import APPROVE, REJECT, ROLLBACK
from proving_ground.slack.methods import PITCREW_METHODS
from proving_ground.slack.server import SlackStandin
from tests.harness.scenarios import delivery, gpu_node, inventory
from tests.slack.pitcrew_app import SlackPitcrew, click, until


def _world(tmp_path: Path) -> Path:
    return inventory(
        tmp_path / "inventory.yaml",
        {f"gpu-node-0{n}": gpu_node(f"ml-train/worker-{n}") for n in range(1, 7)},
        [{"job_id": "201", "name": "llm", "user": "dana", "node": "gpu-node-02"}],
    )


def _buttons(blocks: list[dict[str, Any]]) -> list[str]:
    return [e["action_id"] for b in blocks if b["type"] == "actions" for e in b["elements"]]


def _text(blocks: list[dict[str, Any]]) -> str:
    return repr(blocks)


@pytest.mark.parametrize("transport", ["http", "socket"])
async def test_xid79_approve_reject_rollback_from_slack(
    slack: SlackStandin, tmp_path: Path, transport: str
) -> None:
    config = {"mode": "approve", "approvals": {"approvers": ["alice"], "timeout": "5m"}}
    async with SlackPitcrew(
        tmp_path / "pitcrew",
        slack,
        transport=transport,
        config=config,
        inventory=_world(tmp_path),
        replace_seconds=30,
    ) as pitcrew:
        incident = (await pitcrew.post_alerts(delivery(node="gpu-node-02")))["opened"][0]
        await pitcrew.wait_incident(incident, "awaiting_approval")
        await until(lambda: bool(pitcrew.thread(incident)), what="the parent message")
        parent = pitcrew.thread(incident)[0]
        await until(lambda: _buttons(parent.blocks) == [APPROVE, REJECT, ROLLBACK], what="buttons")
        shown = _text(parent.blocks)
        assert "gpu-node-02" in shown and "XID 79" in shown
        assert "grafana.example/d/pitcrew-incidents?from=" in shown and "runbooks.example/gpu#xid-79" in shown
        assert "201 (llm, dana)" in shown  # the affected Slurm job
        assert all(
            e["value"] == incident for b in parent.blocks if b["type"] == "actions" for e in b["elements"]
        )
        # The thread's permalink (chat.getPermalink) is where the read API, `pitcrew incidents show`
        # and the Grafana table (the incident's info series) send people.
        permalink = f"https://{slack.world.domain}.slack.com/archives/C0GPUOPS/p{parent.ts.replace('.', '')}"
        deadline = time.monotonic() + 10
        while not (links := (await pitcrew.incident(incident))["links"]) and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        assert links == {"slack": permalink}
        _, exposed = await pitcrew.request(
            "GET", "/metrics", headers={"Authorization": "Bearer test-read-token"}
        )
        [info] = [ln for ln in exposed.decode().splitlines() if ln.startswith("pitcrew_incident_info{")]
        assert f'incident="{incident}"' in info and f'thread="{permalink}"' in info, info
        shown_cli = subprocess.run(
            [sys.executable, "-m", "bot.cli", "incidents", "show", incident, "-c", str(pitcrew.config_path)],
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        )
        assert f"slack thread: {permalink}" in shown_cli.stdout.splitlines(), shown_cli.stdout

        # A non-approver's click: refused politely, audited, told in the thread; nothing runs.
        assert await pitcrew.interact(click(APPROVE, incident, "U0MALLORY", "mallory")) == 200
        await until(lambda: any(e["user"] == "U0MALLORY" for e in slack.api.ephemeral), what="refusal")
        assert "Sorry <@U0MALLORY>" in slack.api.ephemeral[-1]["text"]
        refused = await pitcrew.events(incident, "approve_refused")
        assert [(e["actor"], e["outcome"]) for e in refused] == [("slack:U0MALLORY", "refused")]
        await until(
            lambda: any("refused" in m.text for m in pitcrew.thread(incident)[1:]), what="audit reply"
        )
        assert (await pitcrew.incident(incident))["state"] == "awaiting_approval"
        assert not pitcrew.calls()

        # The approver's click runs the playbook; the parent says who approved and drops the choice.
        assert await pitcrew.interact(click(APPROVE, incident, "U0ALICE", "alice")) == 200
        await until(lambda: ("cordon", "gpu-node-02") in pitcrew.calls(), what="cordon")
        approved = await pitcrew.events(incident, "approved")
        assert [e["actor"] for e in approved] == ["slack:U0ALICE"]
        await until(lambda: "approved by <@U0ALICE>" in _text(parent.blocks), what="parent shows approval")
        await until(lambda: _buttons(parent.blocks) == [ROLLBACK], what="only rollback offered")

        # The same Approve by another user now: refused (not an approver), audited.
        await pitcrew.interact(click(APPROVE, incident, "U0MALLORY", "mallory"))
        await until(lambda: len(slack.api.ephemeral) >= 3, what="second refusal")

        # Rollback: refused for a non-approver, then done for the approver; only pitcrew's own changes undone.
        await pitcrew.interact(click(ROLLBACK, incident, "U0MALLORY", "mallory"))
        await until(lambda: len(slack.api.ephemeral) >= 4, what="rollback refusal")
        assert [e["actor"] for e in await pitcrew.events(incident, "rollback_refused")] == ["slack:U0MALLORY"]
        await pitcrew.interact(click(ROLLBACK, incident, "U0ALICE", "alice"))
        done = await pitcrew.wait_incident(incident, "rolled_back")
        assert done["outcome"] == "rolled back by slack:U0ALICE"
        calls = pitcrew.calls()
        # The replacement had started (the old node is gone), so Slurm is resumed and nothing else touched.
        assert calls[("slurm_resume", "gpu-node-02")] == 1, dict(calls)
        report = [e["detail"] for e in done["events"] if e["kind"] == "rollback_done"]
        assert report and "gpu-node-02 resumed" in report[0]
        await until(lambda: _buttons(parent.blocks) == [], what="no buttons after rollback")
        await until(lambda: "rollback requested by <@U0ALICE>" in _text(parent.blocks), what="rollback shown")

        # Reject stops a second incident's playbook: nothing is done to its node.
        other = (await pitcrew.post_alerts(delivery(node="gpu-node-03")))["opened"][0]
        await pitcrew.wait_incident(other, "awaiting_approval")
        await until(lambda: bool(pitcrew.thread(other)), what="second parent")
        await pitcrew.interact(click(REJECT, other, "U0ALICE", "alice"))
        rejected = await pitcrew.wait_incident(other, "suppressed")
        assert rejected["outcome"] == "rejected by slack:U0ALICE"
        assert not [c for c in pitcrew.calls() if c[1] == "gpu-node-03"]
        other_parent = pitcrew.thread(other)[0]
        await until(lambda: "rejected by <@U0ALICE>" in _text(other_parent.blocks), what="rejection shown")
        await until(lambda: _buttons(other_parent.blocks) == [], what="nothing left to offer")

        # Every click is audited with the Slack user id.
        actors = {
            (e["kind"], e["actor"])
            for i in (incident, other)
            for e in (await pitcrew.incident(i))["events"]
            if e["actor"]
        }
        assert {
            ("approve_refused", "slack:U0MALLORY"),
            ("approved", "slack:U0ALICE"),
            ("rollback_refused", "slack:U0MALLORY"),
            ("rollback_requested", "slack:U0ALICE"),
            ("rejected", "slack:U0ALICE"),
        } <= actors

        assert {c.method for c in slack.api.calls} <= PITCREW_METHODS  # the manifest grants these
        status = await pitcrew.slash(f"status {other}")
        assert other in status and "suppressed" in status
        assert "mode *approve*" in await pitcrew.slash("status")
