"""Requests to ``POST /slack/events`` that Slack did not send, or sent broken, change nothing.

Cases: a forged signature → 401; a correctly signed request older than 5 minutes → 401; a signed
body that is neither an interactive payload nor a slash command, a payload that is not JSON, a
block_actions payload without its user → 400. After each: the incident still awaits approval, no
approval or refusal event was written, nothing reached the far side, no Slack call was made for it.
A valid approver click after all that still works (the refusals did not break anything).
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from bot.integrations.slack.messages import APPROVE
from proving_ground.slack import signing
from proving_ground.slack.server import SlackStandin
from proving_ground.slack.world import SIGNING_SECRET
from tests.harness.scenarios import delivery
from tests.slack.pitcrew_app import SlackPitcrew, click, until


async def test_forged_stale_and_malformed_requests_are_refused(slack: SlackStandin, tmp_path: Path) -> None:
    config = {"mode": "approve", "approvals": {"approvers": ["alice"], "timeout": "5m"}}
    async with SlackPitcrew(tmp_path / "p", slack, transport="http", config=config) as pitcrew:
        incident = (await pitcrew.post_alerts(delivery(node="gpu-node-02")))["opened"][0]
        await pitcrew.wait_incident(incident, "awaiting_approval")
        await until(lambda: bool(pitcrew.thread(incident)))
        await pitcrew.quiet()
        before = await pitcrew.incident(incident)
        calls_before = len(slack.api.calls)
        payload = click(APPROVE, incident, "U0ALICE", "alice")

        forged = signing.interactive("not-the-signing-secret", payload)
        stale = signing.interactive(SIGNING_SECRET, payload, timestamp=int(time.time()) - 301)
        tampered = signing.interactive(SIGNING_SECRET, payload)
        tampered_body = tampered.body.replace(b"U0ALICE", b"U0MALLO", 1)
        cases = [
            ("forged signature", forged.body, forged.headers, 401),
            ("older than 5 minutes", stale.body, stale.headers, 401),
            ("body changed after signing", tampered_body, tampered.headers, 401),
        ]
        for what, body in (
            ("not a Slack request", signing.form_body({"hello": "world"})),
            ("payload is not JSON", signing.form_body({"payload": "{not json"})),
            (
                "block_actions without user",
                signing.form_body({"payload": json.dumps({"type": "block_actions"})}),
            ),
        ):
            signed = signing.sign(SIGNING_SECRET, body)
            cases.append((what, signed.body, signed.headers, 400))
        no_headers = signing.interactive(SIGNING_SECRET, payload)
        cases.append(
            (
                "no signature headers",
                no_headers.body,
                {"Content-Type": "application/x-www-form-urlencoded"},
                401,
            )
        )

        for what, body, headers, expected in cases:
            status, raw = await pitcrew.request("POST", "/slack/events", body, headers)
            assert status == expected, (what, status, raw)

        after = await pitcrew.incident(incident)
        assert after["state"] == "awaiting_approval"
        assert after["approval"] == before["approval"]
        assert not [e for e in after["events"] if e["kind"] in {"approved", "approve_refused", "rejected"}]
        assert not pitcrew.calls()
        assert len(slack.api.calls) == calls_before  # nothing was answered or audited in Slack

        assert await pitcrew.interact(payload) == 200
        await until(lambda: ("cordon", "gpu-node-02") in pitcrew.calls(), what="the genuine click runs")
