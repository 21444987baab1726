"""Incident annotations through the durable outbox: the whole service in this process, Grafana's stand-in over HTTP.

Cases: an XID 79 incident in auto mode opens one region annotation at the fault (tags
``pitcrew``, node, fault class, playbook, ``incident:<id>``; text with the incident id and the
fault) and, once resolved, patches its end to the close and its text to the outcome — a POST then
a PATCH, nothing else written; with Grafana unreachable (its port closed) and Slack answering 503
for a whole minute the incident resolves on time, and once both are back (Slack rate-limiting a
few times first) the annotation arrives, opened and closed, exactly once, and the Slack thread
holds every message exactly once, in order; a token Grafana refuses
is audited in the incident's timeline and counted, and remediation is untouched.
"""

from __future__ import annotations

import sqlite3
import time
from datetime import datetime
from pathlib import Path
from typing import Any

from proving_ground.slack.server import SlackStandin
from tests.grafana.server import TOKEN, GrafanaStandin
from tests.harness.scenarios import delivery
from tests.slack.pitcrew_app import SlackPitcrew, assert_thread_whole, until

#: The issue's "Grafana unreachable for a minute", in real time.
OUTAGE = 60.0


def _config(tmp_path: Path, grafana: GrafanaStandin, token: str = TOKEN) -> dict[str, Any]:
    token_file = tmp_path / "grafana.token"
    token_file.write_text(token + "\n")
    return {
        "mode": "auto",
        "grafana": {"url": grafana.url, "token_file": str(token_file), "retry_backoff_max": "1s"},
    }


def _pending(db: Path, destination: str) -> int:
    with sqlite3.connect(db) as conn:
        query = "SELECT COUNT(*) FROM outbox WHERE destination = ? AND delivered_at IS NULL"
        return int(conn.execute(query, (destination,)).fetchone()[0])


def _ms(stamp: str) -> int:
    return int(datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp() * 1000)


def _writes(grafana: GrafanaStandin) -> list[tuple[str, str]]:
    return [(m, p) for m, p, _ in grafana.world.requests if m != "GET"]


async def test_a_region_is_opened_at_the_fault_and_closed_at_the_end(
    grafana: GrafanaStandin, slack: SlackStandin, tmp_path: Path
) -> None:
    async with SlackPitcrew(tmp_path / "p", slack, config=_config(tmp_path, grafana)) as pitcrew:
        incident = (await pitcrew.post_alerts(delivery(node="gpu-node-02")))["opened"][0]
        done = await pitcrew.wait_incident(incident, "resolved")
        await until(lambda: _pending(pitcrew.workdir / "pitcrew.db", "grafana") == 0, timeout=20)
        await until(
            lambda: any(a.time_end for a in grafana.world.annotations.values()), timeout=20, what="the end"
        )

    assert len(grafana.world.annotations) == 1
    made = next(iter(grafana.world.annotations.values()))
    fault = done["faults"][0]
    assert made.tags == ["pitcrew", "gpu-node-02", fault["class"], done["playbook"], f"incident:{incident}"]
    assert made.time == _ms(done["first_alert_at"])
    assert made.time_end == _ms(done["closed_at"])
    assert made.text.startswith(f"pitcrew {incident}: XID 79") and made.text.endswith(done["outcome"])
    assert made.dashboard_uid == "pitcrew-incidents"
    assert _writes(grafana) == [("POST", "/api/annotations"), ("PATCH", f"/api/annotations/{made.id}")]


async def test_slack_and_grafana_down_for_a_minute_delay_messages_never_remediation(
    grafana: GrafanaStandin, slack: SlackStandin, tmp_path: Path
) -> None:
    """The issues' outage, in real time and at once: Slack answers 503 to every call and Grafana's
    port is closed for a whole minute; then Slack rate-limits (429, Retry-After) a few times."""
    config = _config(tmp_path, grafana)
    await grafana.stop()
    async with SlackPitcrew(tmp_path / "p", slack, transport="http", config=config) as pitcrew:
        down_since = time.monotonic()  # before the stand-in's own clock starts the outage
        slack.api.outage(OUTAGE)
        incident = (await pitcrew.post_alerts(delivery(node="gpu-node-02")))["opened"][0]
        done = await pitcrew.wait_incident(incident, "resolved", timeout=OUTAGE)
        resolved_after = time.monotonic() - down_since
        assert resolved_after < OUTAGE / 2, f"remediation waited for Slack or Grafana ({resolved_after:.1f}s)"
        assert _pending(pitcrew.workdir / "pitcrew.db", "grafana") > 0  # waiting in the outbox
        assert _pending(pitcrew.workdir / "pitcrew.db", "slack") > 0

        # Looked at while Slack is still down (a look just after its end raced the sender's retry).
        await until(lambda: time.monotonic() - down_since > OUTAGE - 5, timeout=OUTAGE)
        assert not grafana.world.annotations and not slack.api.messages  # nothing got through
        assert {c.status for c in slack.api.calls} == {503}
        await until(lambda: time.monotonic() - down_since > OUTAGE, timeout=10)
        slack.api.fail("*", 429, count=3, retry_after=1)
        await grafana.start()  # back on the same port
        db = pitcrew.workdir / "pitcrew.db"
        await until(lambda: _pending(db, "grafana") == 0, timeout=60, what="annotations delivered")
        await until(lambda: _pending(db, "slack") == 0, timeout=60, what="Slack messages delivered")
        retried = await _retries(pitcrew)
        unreachable = await _sample(
            pitcrew, 'pitcrew_integration_errors_total{reason="unreachable",system="grafana"}'
        )
        assert_thread_whole(pitcrew, slack, incident, done)

    assert retried >= 3, "the sender did not keep trying while Grafana was down"
    assert unreachable == retried  # each failed try counted against Grafana
    assert len(grafana.world.annotations) == 1
    made = next(iter(grafana.world.annotations.values()))
    assert (made.time, made.time_end) == (_ms(done["first_alert_at"]), _ms(done["closed_at"]))
    assert [m for m, _ in _writes(grafana)] == ["POST", "PATCH"]


async def _sample(pitcrew: SlackPitcrew, series: str) -> float:
    status, raw = await pitcrew.request("GET", "/metrics")
    assert status == 200
    for line in raw.decode().splitlines():
        if line.startswith(series + " "):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


async def _retries(pitcrew: SlackPitcrew) -> float:
    return await _sample(pitcrew, 'pitcrew_notices_total{destination="grafana",outcome="retried"}')


async def test_a_refused_token_is_audited_and_remediation_goes_on(
    grafana: GrafanaStandin, slack: SlackStandin, tmp_path: Path
) -> None:
    config = _config(tmp_path, grafana, token="glsa_revoked")
    async with SlackPitcrew(tmp_path / "p", slack, config=config) as pitcrew:
        incident = (await pitcrew.post_alerts(delivery(node="gpu-node-02")))["opened"][0]
        await pitcrew.wait_incident(incident, "resolved")
        await until(lambda: _pending(pitcrew.workdir / "pitcrew.db", "grafana") == 0, timeout=20)
        failed = await pitcrew.events(incident, "notice_failed")
        refused = await _sample(
            pitcrew, 'pitcrew_integration_errors_total{reason="unauthorized",system="grafana"}'
        )

    assert failed and all(e["detail"].startswith("grafana: Grafana refused") for e in failed)
    assert "glsa_revoked" not in str(failed)
    assert refused == len(failed)
    assert not grafana.world.annotations
    assert {s for _, _, s in grafana.world.requests} == {401}
