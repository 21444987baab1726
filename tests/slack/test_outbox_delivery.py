"""Slack down, then rate limiting: remediation does not wait, and the thread ends up whole and in order.

Cases: with Slack answering 503 to every call (scaled down from the issue's 60 s to 8 s, longer than
the whole remediation takes here) an XID 79 incident in auto mode resolves while Slack is still
down; then Slack answers 429 with Retry-After a few times; afterwards the incident's thread holds
the parent and every reply exactly once (one message per outbox item), in the order the events
happened, the summary broadcast to the channel; nothing is left in the outbox.
Without Slack configured the same notices are timeline events and log records only.
"""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path

from tests.harness.scenarios import delivery
from tests.slack.methods import PITCREW_METHODS
from tests.slack.pitcrew_app import SlackPitcrew, until
from tests.slack.server import SlackStandin

OUTAGE = 8.0


def _pending(db: Path) -> int:
    with sqlite3.connect(db) as conn:
        return int(conn.execute("SELECT COUNT(*) FROM outbox WHERE delivered_at IS NULL").fetchone()[0])


async def test_outage_then_429_delays_messages_but_never_remediation(
    slack: SlackStandin, tmp_path: Path
) -> None:
    config = {"mode": "auto"}
    async with SlackPitcrew(tmp_path / "p", slack, transport="http", config=config) as pitcrew:
        slack.api.outage(OUTAGE)
        down_since = time.monotonic()
        incident = (await pitcrew.post_alerts(delivery(node="gpu-node-02")))["opened"][0]
        done = await pitcrew.wait_incident(incident, "resolved", timeout=OUTAGE)
        assert time.monotonic() - down_since < OUTAGE, "remediation waited for Slack"
        assert not slack.api.messages  # nothing got through while down
        assert {c.status for c in slack.api.calls} == {503}

        await until(lambda: time.monotonic() - down_since > OUTAGE, timeout=OUTAGE + 1)
        slack.api.fail("*", 429, count=3, retry_after=1)
        await until(lambda: _pending(pitcrew.workdir / "pitcrew.db") == 0, timeout=60, what="outbox drained")

        thread = pitcrew.thread(incident)
        assert thread, "no parent"
        parent, replies = thread[0], thread[1:]
        ids = [m.metadata["event_payload"]["outbox_id"] for m in thread if m.metadata]
        assert len(ids) == len(thread) and len(set(ids)) == len(ids), "a message was posted twice"
        assert ids == sorted(ids), "thread out of order"
        assert any(c.status == 429 for c in slack.api.calls)
        # Every step that finished has its one reply, in the order of the timeline.
        finished = [e["step"] for e in done["events"] if e["kind"] in {"step_finished", "step_skipped"}]
        steps_in_thread = [
            m.text.split(" ", 1)[1].split(":", 1)[0]
            for m in replies
            if m.text.startswith(":") and ":" in m.text.split(" ", 1)[1]
        ]
        assert [s for s in steps_in_thread if s in finished] == finished
        assert {c.method for c in slack.api.calls} <= PITCREW_METHODS  # the manifest grants these
        broadcast = [m for m in replies if m.reply_broadcast]
        assert len(broadcast) == 1 and "finished" in broadcast[0].text  # the summary
        assert "resolved" in repr(parent.blocks)
        channel = slack.api.channel_view("C0GPUOPS")
        assert [m.ts for m in channel] == [parent.ts, broadcast[0].ts]


async def test_without_slack_notices_are_timeline_events(tmp_path: Path, slack: SlackStandin) -> None:
    config = {"mode": "auto", "integrations": {"notifier": "log"}}
    async with SlackPitcrew(tmp_path / "p", slack, transport="http", config=config) as pitcrew:
        incident = (await pitcrew.post_alerts(delivery(node="gpu-node-02")))["opened"][0]
        done = await pitcrew.wait_incident(incident, "resolved")
        notices = [e for e in done["events"] if e["kind"] == "notice"]
        assert [e["outcome"] for e in notices] == ["incident", "summary"]
        assert notices[0]["detail"].startswith("gpu-node-02: ")
        assert not slack.api.calls
        assert _pending(pitcrew.workdir / "pitcrew.db") == 0
