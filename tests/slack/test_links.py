"""The parent message's links: each made by one rule, from the settings that own it.

Cases: an alert whose rule names a ``runbook_url`` links that runbook (the one Alertmanager shows),
not ``slack.runbook_url``; with neither, the parent links no runbook at all; the Grafana link is the incidents dashboard (``grafana.url`` +
``grafana.incidents_dashboard_uid``) over the incident's time, from 30 minutes before the fault.
"""

from __future__ import annotations

import json
from datetime import datetime, timedelta
from pathlib import Path

from proving_ground.slack.server import SlackStandin
from tests.harness.scenarios import delivery
from tests.slack.pitcrew_app import SlackPitcrew, until

RUNBOOK = "https://docs.example/pitcrew/alerting#gpuxidcritical"


async def test_the_rule_s_runbook_and_the_incident_s_dashboard(slack: SlackStandin, tmp_path: Path) -> None:
    body = json.loads(delivery(node="gpu-node-02"))
    for alert in body["alerts"]:
        alert["annotations"]["runbook_url"] = RUNBOOK
    config = {"mode": "observe", "grafana": {"incidents_dashboard_uid": "site-incidents"}}
    async with SlackPitcrew(tmp_path / "p", slack, config=config) as pitcrew:
        incident = (await pitcrew.post_alerts(json.dumps(body).encode()))["opened"][0]
        await until(lambda: bool(pitcrew.thread(incident)), what="the parent message")
        found = await pitcrew.incident(incident)
        await until(lambda: bool(pitcrew.thread(incident)[0].updates), what="the parent updated")

    shown = repr(pitcrew.thread(incident)[0].blocks)
    assert RUNBOOK in shown and "runbooks.example" not in shown
    start = datetime.fromisoformat(found["first_alert_at"].replace("Z", "+00:00")) - timedelta(minutes=30)
    # In mrkdwn a link's address has its & as &amp; (Slack reads it back as &).
    assert f"<https://grafana.example/d/site-incidents?from={int(start.timestamp() * 1000)}&amp;to=" in shown


async def test_no_runbook_link_without_the_rule_s_or_the_configured_one(
    slack: SlackStandin, tmp_path: Path
) -> None:
    body = json.loads(delivery(node="gpu-node-03"))
    for alert in body["alerts"]:
        alert["annotations"].pop("runbook_url", None)
    config = {"mode": "observe", "slack": {"runbook_url": None}}
    async with SlackPitcrew(tmp_path / "p", slack, config=config) as pitcrew:
        incident = (await pitcrew.post_alerts(json.dumps(body).encode()))["opened"][0]
        await until(lambda: bool(pitcrew.thread(incident)), what="the parent message")
        await until(lambda: bool(pitcrew.thread(incident)[0].updates), what="the parent updated")

    shown = repr(pitcrew.thread(incident)[0].blocks)
    assert "Runbook" not in shown and "grafana.example/d/pitcrew-incidents" in shown
