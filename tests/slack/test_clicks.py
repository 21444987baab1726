"""A person's click through the stand-in (``proving_ground.slack.clicks``), as ``scripts/demo`` makes it.

Cases, against pitcrew's whole service in HTTP mode: the stand-in's ``POST /demo/click`` finds the
Approve button on the incident's parent, sends pitcrew the signed ``block_actions`` Slack would
send, and reports pitcrew's 200 and the ephemeral answer; pitcrew's audit log holds the approval
by ``slack:U0ALICE`` and the incident goes on; a non-approver's click is refused and audited; a
click on a button no message shows is 404 and sends nothing; a malformed click body is 400; with no
request URL configured the stand-in answers 409; a click signed with another secret is refused by
pitcrew (401) and changes nothing. The transcript of the channel then reads as people see it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import aiohttp
from slack_sdk.web.async_client import AsyncWebClient

from bot.integrations.slack import messages
from bot.integrations.slack.messages import ParentView
from proving_ground.slack import signing
from proving_ground.slack.clicks import Interactivity, block_actions, find_button
from proving_ground.slack.server import SlackStandin
from proving_ground.slack.transcript import channel_lines
from proving_ground.slack.world import SIGNING_SECRET
from tests.harness.scenarios import delivery, gpu_node, inventory
from tests.slack.pitcrew_app import CHANNEL, SlackPitcrew, until


async def _click(slack: SlackStandin, body: Any) -> tuple[int, dict[str, Any]]:
    async with aiohttp.ClientSession() as session, session.post(slack.click_url, json=body) as response:
        return response.status, await response.json()


def _person(button: str, incident: str, user: str) -> dict[str, str]:
    return {"channel": CHANNEL, "button": button, "value": incident, "user": user}


async def test_a_click_through_the_standin_is_a_signed_slack_click(
    slack: SlackStandin, tmp_path: Path
) -> None:
    world = inventory(tmp_path / "inventory.yaml", {"gpu-node-02": gpu_node("ml-train/worker-2")}, [])
    config = {"mode": "approve", "approvals": {"approvers": ["nobody-local"], "timeout": "5m"}}
    async with SlackPitcrew(tmp_path / "pitcrew", slack, config=config, inventory=world) as pitcrew:
        incident = (await pitcrew.post_alerts(delivery(node="gpu-node-02")))["opened"][0]
        await pitcrew.wait_incident(incident, "awaiting_approval")

        assert await _click(slack, _person("Approve", incident, "U0ALICE")) == (
            409,
            {"error": "no interactivity request URL is configured"},
        )
        wrong = Interactivity(slack.api, f"{pitcrew.url}/slack/events", "not-the-signing-secret")
        slack.interactivity = wrong
        await until(
            lambda: bool(pitcrew.thread(incident)) and "Approve" in repr(pitcrew.thread(incident)[0].blocks)
        )
        status, answer = await _click(slack, _person("Approve", incident, "U0ALICE"))
        assert (status, answer["status"], answer["answer"]) == (200, 401, "")
        assert (await pitcrew.incident(incident))["state"] == "awaiting_approval"

        slack.interactivity = Interactivity(slack.api, f"{pitcrew.url}/slack/events", SIGNING_SECRET)
        assert (await _click(slack, {"channel": CHANNEL}))[0] == 400
        await pitcrew.quiet()  # the outbox has posted what it had: no call below is its own
        calls = len(slack.api.calls)
        status, answer = await _click(slack, _person("Approve", "pc-99999", "U0ALICE"))
        assert status == 404 and "no message" in answer["error"] and len(slack.api.calls) == calls

        status, answer = await _click(slack, _person("Approve", incident, "U0MALLORY"))
        assert (status, answer["status"]) == (200, 200) and "Sorry" in answer["answer"]
        refused = await pitcrew.events(incident, "approve_refused")
        assert [e["actor"] for e in refused] == ["slack:U0MALLORY"]

        status, answer = await _click(slack, _person("approve", incident, "U0ALICE"))
        assert (status, answer["status"]) == (200, 200), answer
        assert answer["answer"] == f"{incident} approved by slack:U0ALICE"
        assert answer["message_ts"] == pitcrew.thread(incident)[0].ts
        [approved] = await pitcrew.events(incident, "approved")
        assert approved["actor"] == "slack:U0ALICE"
        await pitcrew.wait_incident(incident, "remediating", "verifying", "resolved")
        await until(lambda: "approved by <@U0ALICE>" in repr(pitcrew.thread(incident)[0].blocks))
        await pitcrew.quiet()

    transcript = "\n".join(channel_lines(slack.api, CHANNEL))
    assert transcript.startswith("#gpu-ops (C0GPUOPS)")
    parent = pitcrew.thread(incident)[0]
    assert f"pitcrew (edited {len(parent.updates)}x): " in transcript
    assert "approved by @alice" in transcript and "<@U0ALICE>" not in transcript
    assert "    ↳ [" in transcript  # the thread's replies under their parent
    assert f"(only alice sees this) {incident} approved by slack:U0ALICE" in transcript
    assert "(only mallory sees this) Sorry @mallory" in transcript


async def test_a_click_on_a_parent_full_of_text_in_any_script_is_taken(
    slack: SlackStandin, bot: AsyncWebClient, tmp_path: Path
) -> None:
    """Slack sends the whole message with a click, its every UTF-8 byte beyond ASCII's letters
    form-encoded as ``%XX``: a parent at pitcrew's total of text in a script of three- and four-byte
    characters (Japanese job names, an emoji) makes a click body of about 100 KB. pitcrew refused
    bodies over 64 KiB with 413, and the click was lost."""
    world = inventory(tmp_path / "inventory.yaml", {"gpu-node-02": gpu_node("ml-train/worker-2")}, [])
    config = {"mode": "approve", "approvals": {"approvers": ["nobody-local"], "timeout": "5m"}}
    async with SlackPitcrew(tmp_path / "pitcrew", slack, config=config, inventory=world) as pitcrew:
        incident = (await pitcrew.post_alerts(delivery(node="gpu-node-02")))["opened"][0]
        await pitcrew.wait_incident(incident, "awaiting_approval")
        await until(
            lambda: bool(pitcrew.thread(incident)) and "Approve" in repr(pitcrew.thread(incident)[0].blocks)
        )
        wide = "訓練ジョブ🚀"
        view = ParentView(
            incident, "gpu-node-02", wide * 30, tuple(wide * 80 for _ in range(12)), "critical", "approve",
            wide * 300, wide * 300, "awaiting_approval", wide * 300,
            jobs=tuple(wide * 80 for _ in range(10)), capacity=wide * 500, offer=("approve", "reject"),
        )  # fmt: skip
        big = messages.parent(view)
        await bot.chat_postMessage(channel=CHANNEL, text=big.text, blocks=big.blocks)
        message, block_id, button = find_button(slack.api, CHANNEL, "Approve", incident)
        click = signing.interactive(
            SIGNING_SECRET, block_actions(slack.api, message, block_id, button, "U0ALICE")
        )
        assert len(click.body) > 90_000, len(click.body)

        slack.interactivity = Interactivity(slack.api, f"{pitcrew.url}/slack/events", SIGNING_SECRET)
        status, answer = await _click(slack, _person("Approve", incident, "U0ALICE"))
        assert (status, answer["status"]) == (200, 200), answer
        assert answer["answer"] == f"{incident} approved by slack:U0ALICE"
        await pitcrew.quiet()


async def test_a_clicker_outside_the_channel_is_answered_through_the_click_s_response_url(
    slack: SlackStandin, tmp_path: Path
) -> None:
    """An approver reading the public channel without having joined it clicks Approve: the decision
    is taken, and the answer reaches them through the click's ``response_url`` (ephemeral, the
    parent left as it is), where ``chat.postEphemeral`` answers ``user_not_in_channel``."""
    world = inventory(tmp_path / "inventory.yaml", {"gpu-node-02": gpu_node("ml-train/worker-2")}, [])
    config = {"mode": "approve", "approvals": {"approvers": ["nobody-local"], "timeout": "5m"}}
    async with SlackPitcrew(tmp_path / "pitcrew", slack, config=config, inventory=world) as pitcrew:
        slack.interactivity = Interactivity(slack.api, f"{pitcrew.url}/slack/events", SIGNING_SECRET)
        incident = (await pitcrew.post_alerts(delivery(node="gpu-node-02")))["opened"][0]
        await pitcrew.wait_incident(incident, "awaiting_approval")
        await until(
            lambda: bool(pitcrew.thread(incident)) and "Approve" in repr(pitcrew.thread(incident)[0].blocks)
        )
        await pitcrew.quiet()
        slack.world.channels[CHANNEL].members.discard("U0ALICE")

        status, answer = await _click(slack, _person("Approve", incident, "U0ALICE"))
        assert (status, answer["status"]) == (200, 200), answer
        assert answer["answer"] == f"{incident} approved by slack:U0ALICE"
        [approved] = await pitcrew.events(incident, "approved")
        assert approved["actor"] == "slack:U0ALICE"
        await pitcrew.quiet()

    [told] = [a for a in slack.responses.answered if a["user"] == "U0ALICE"]
    assert (told["response_type"], told["replace_original"]) == ("ephemeral", False)
    refused = [c for c in slack.api.calls_to("chat.postEphemeral") if (c.answer or {}).get("ok") is False]
    assert not refused
