"""Signed interactivity and slash-command requests, checked against the fixtures and the real verifiers.

Cases:
- the builder reproduces the fixtures' raw bodies and signatures byte for byte (block_actions, slash);
- slack_sdk's SignatureVerifier accepts a fresh request and refuses a forged one, a tampered body,
  another secret, and a timestamp older than 5 minutes;
- slack_bolt's AsyncApp (what pitcrew will mount) routes a signed click to its action handler and a
  signed slash command to its command handler, and answers 401 to a forged one; its authorize step
  calls auth.test on the Web API stand-in.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from pathlib import Path

from slack_bolt.async_app import AsyncApp
from slack_bolt.request.async_request import AsyncBoltRequest
from slack_sdk.signature import SignatureVerifier
from slack_sdk.web.async_client import AsyncWebClient

from proving_ground.slack import signing
from proving_ground.slack.server import SlackStandin
from proving_ground.slack.world import SIGNING_SECRET, TESTER_TOKEN

FIXTURES = Path(__file__).parent / "fixtures"


def raw_request(name: str) -> tuple[dict[str, str], bytes]:
    raw = (FIXTURES / name).read_text().split("=== RAW REQUEST ===\n", 1)[1]
    head, body = raw.split("\n\n", 1)
    headers = dict(line.split(": ", 1) for line in head.splitlines()[1:])
    return headers, body.encode()


def bolt_request(signed: signing.SignedRequest) -> AsyncBoltRequest:
    headers: dict[str, str | Sequence[str]] = dict(signed.headers)
    return AsyncBoltRequest(body=signed.text, headers=headers)


def test_block_actions_body_and_signature_match_the_fixture() -> None:
    headers, body = raw_request("block-actions-request.txt")
    payload = json.loads((FIXTURES / "block-actions-approve.json").read_text())
    ts = int(headers["X-Slack-Request-Timestamp"])
    built = signing.interactive(SIGNING_SECRET, payload, timestamp=ts)
    assert built.body == body
    assert built.headers["X-Slack-Signature"] == headers["X-Slack-Signature"]


def test_slash_command_body_and_signature_match_the_fixture() -> None:
    headers, body = raw_request("slash-command.txt")
    ts = int(headers["X-Slack-Request-Timestamp"])
    built = signing.slash_command(SIGNING_SECRET, signing.slash_fields("status gpu-node-02"), timestamp=ts)
    assert built.body == body
    assert built.headers["X-Slack-Signature"] == headers["X-Slack-Signature"]


def test_signature_verifier_accepts_fresh_and_refuses_forged_tampered_and_old() -> None:
    verifier = SignatureVerifier(SIGNING_SECRET)
    payload = json.loads((FIXTURES / "block-actions-approve.json").read_text())
    good = signing.interactive(SIGNING_SECRET, payload)
    assert verifier.is_valid_request(good.body, good.headers)
    forged = signing.interactive("not-the-secret", payload)
    assert not verifier.is_valid_request(forged.body, forged.headers)
    assert not verifier.is_valid_request(good.body.replace(b"U0ALICE", b"U0MALLO"), good.headers)
    old = signing.interactive(SIGNING_SECRET, payload, timestamp=int(time.time()) - 301)
    assert not verifier.is_valid_request(old.body, old.headers)
    slash = signing.slash_command(SIGNING_SECRET, signing.slash_fields("approve pc-00042"))
    assert verifier.is_valid_request(slash.body, slash.headers)


async def test_bolt_routes_signed_requests_and_refuses_forged_ones(slack: SlackStandin) -> None:
    client = AsyncWebClient(token=TESTER_TOKEN, base_url=slack.base_url)
    app = AsyncApp(signing_secret=SIGNING_SECRET, client=client)
    seen: list[tuple[str, str]] = []

    @app.action("pitcrew_approve")
    async def approve(ack, body) -> None:  # type: ignore[no-untyped-def]
        seen.append((body["user"]["id"], body["actions"][0]["value"]))
        await ack()

    @app.command("/pitcrew")
    async def command(ack, command) -> None:  # type: ignore[no-untyped-def]
        seen.append((command["user_id"], command["text"]))
        await ack(response_type="ephemeral", text=f"ok: {command['text']}")

    payload = json.loads((FIXTURES / "block-actions-approve-by-non-approver.json").read_text())
    click = signing.interactive(SIGNING_SECRET, payload)
    answer = await app.async_dispatch(bolt_request(click))
    assert answer.status == 200
    slash = signing.slash_command(SIGNING_SECRET, signing.slash_fields("status gpu-node-02"))
    answer = await app.async_dispatch(bolt_request(slash))
    assert answer.status == 200 and json.loads(answer.body)["text"] == "ok: status gpu-node-02"
    forged = signing.interactive("wrong", payload)
    answer = await app.async_dispatch(bolt_request(forged))
    assert answer.status == 401
    assert [c.method for c in slack.api.calls] == ["auth.test"]  # bolt's authorize, against the stand-in
    assert seen == [("U0MALLORY", "pc-00042"), ("U0ALICE", "status gpu-node-02")]
