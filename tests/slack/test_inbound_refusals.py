"""Requests to ``POST /slack/events`` that Slack did not send, or sent broken, change nothing.

Cases: a forged signature → 401; a malformed timestamp, signature or body → 401 without a
traceback; a body over 512 KiB (a click carries its whole message: 100 KB at most) → 413; Slack's ssl_check probe → 200; a replayed signed command or click → 401; a correctly signed request older than 5 minutes → 401; a signed
body that is neither an interactive payload nor a slash command, a payload that is not JSON, a
block_actions payload without its user → 400. After each: the incident still awaits approval, no
approval or refusal event was written, nothing reached the far side, no Slack call was made for it.
A valid approver click after all that still works (the refusals did not break anything).
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path

import pytest

from bot.integrations.slack.messages import APPROVE, REJECT
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
        huge = signing.sign(SIGNING_SECRET, signing.form_body({"payload": "x" * (512 * 1024)}))
        cases.append(("over 512 KiB, signed", huge.body, huge.headers, 413))
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


async def test_malformed_headers_and_bodies_are_401_quietly(
    slack: SlackStandin, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A timestamp ``abc``, ``1.7e9`` or empty, a non-ASCII signature, a body that is not UTF-8 (with a
    signature made over its bytes, or none): 401, and no error or traceback in the log (before: 500,
    raised inside slack_sdk's verifier)."""
    async with SlackPitcrew(tmp_path / "p", slack, transport="http", config={"mode": "observe"}) as pitcrew:
        payload = click(APPROVE, "pc-00001", "U0ALICE", "alice")
        good = signing.interactive(SIGNING_SECRET, payload)
        binary = b"payload=\xff\xfe\xfa"
        now = str(int(time.time()))
        cases = [
            ("timestamp abc", good.body, {**good.headers, "X-Slack-Request-Timestamp": "abc"}),
            ("timestamp 1.7e9", good.body, {**good.headers, "X-Slack-Request-Timestamp": "1.7e9"}),
            ("timestamp empty", good.body, {**good.headers, "X-Slack-Request-Timestamp": ""}),
            ("non-ASCII signature", good.body, {**good.headers, "X-Slack-Signature": "v0=é" + "0" * 63}),
            ("non-UTF-8 body, signed", binary, {**good.headers, "X-Slack-Request-Timestamp": now,
                                                 "X-Slack-Signature": signing.signature(SIGNING_SECRET, now, binary)}),
            ("non-UTF-8 body, any signature", binary, good.headers),
        ]  # fmt: skip
        caplog.clear()
        for what, body, headers in cases:
            status, raw = await pitcrew.request("POST", "/slack/events", body, headers)
            assert status == 401, (what, status, raw)
        noisy = [r for r in caplog.records if r.levelno >= logging.ERROR or r.exc_info]
        assert not noisy, [r.getMessage() for r in noisy]


async def test_ssl_check_is_answered_as_bolt_does(slack: SlackStandin, tmp_path: Path) -> None:
    """Slack's unsigned ``ssl_check=1`` probe of the request URL: 200 with an empty body, as bolt's
    ssl-check middleware answers it before any signature check (before: 401)."""
    async with SlackPitcrew(tmp_path / "p", slack, transport="http", config={"mode": "observe"}) as pitcrew:
        ssl_check = signing.form_body({"ssl_check": "1", "token": "Zx9PqR4sT7uV2wY5aB8cD1eF"})
        status, raw = await pitcrew.request(
            "POST", "/slack/events", ssl_check, {"Content-Type": "application/x-www-form-urlencoded"}
        )
        assert (status, raw) == (200, b"")
        assert not pitcrew.calls()


async def test_a_replayed_command_or_click_is_refused(slack: SlackStandin, tmp_path: Path) -> None:
    """Alice's signed ``/pitcrew resume``, re-sent byte for byte within Slack's 5 minutes after the
    operators paused again, is refused (401) and the pause stands; a replayed Approve click is
    refused too and decides nothing. Before: both were accepted, and the replay turned the pause off."""
    config = {"mode": "approve", "approvals": {"approvers": ["alice"], "timeout": "5m"}}
    async with SlackPitcrew(tmp_path / "p", slack, transport="http", config=config) as pitcrew:
        pause = signing.slash_command(SIGNING_SECRET, signing.slash_fields("pause maintenance"))
        resume = signing.slash_command(SIGNING_SECRET, signing.slash_fields("resume"))
        for request in (pause, resume):
            status, raw = await pitcrew.request("POST", "/slack/events", request.body, request.headers)
            assert status == 200, raw
        again = signing.slash_command(SIGNING_SECRET, signing.slash_fields("pause again"))
        status, _ = await pitcrew.request("POST", "/slack/events", again.body, again.headers)
        assert status == 200
        status, raw = await pitcrew.request("POST", "/slack/events", resume.body, resume.headers)
        assert status == 401, raw
        paused = await _paused(pitcrew)
        assert paused, "the replayed resume turned the pause off"

        reject = click(REJECT, "pc-none", "U0ALICE", "alice")
        signed = signing.interactive(SIGNING_SECRET, reject)
        first, _ = await pitcrew.request("POST", "/slack/events", signed.body, signed.headers)
        second, _ = await pitcrew.request("POST", "/slack/events", signed.body, signed.headers)
        assert (first, second) == (200, 401)


async def _paused(pitcrew: SlackPitcrew) -> bool:
    status, raw = await pitcrew.request(
        "GET", "/api/v1/status", headers={"Authorization": "Bearer test-admin-token"}
    )
    assert status == 200, raw
    return bool(json.loads(raw)["paused"])
