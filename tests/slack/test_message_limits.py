"""Every message pitcrew can build stays inside Slack's Block Kit limits, whatever the input.

A table over every notice kind the engine posts and every timeline event Slack shows, each with
long inputs (a 10,000-character node name and title, a thousand 5,000-character lines), plus the
parent message with every button and a thousand decisions, and a 5,000-node digest. Each message is
checked by the stand-in's validator and then really posted to the stand-in (which refuses anything
over a limit with ``invalid_blocks``). Long timelines end with a pointer to ``pitcrew incidents show``.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from slack_sdk.web.async_client import AsyncWebClient

from bot.integrations.slack import messages
from bot.integrations.slack.messages import Decision, DigestEntry, Message, ParentView
from bot.integrations.slack.outbound import EVENTS, SlackDestination, SlackLinks
from bot.store.base import OutboxItem
from proving_ground.slack import blocks as blockkit

NOTICE_KINDS = (
    "incident", "summary", "escalation", "approval_expired", "breaker", "rollback",
    "job_lost", "job_running", "handover", "suppressed",
)  # fmt: skip
LONG = "x" * 10_000
LINES = [f"line {n}: " + "y" * 5_000 for n in range(1_000)]
AT = datetime(2026, 11, 29, 8, 46, 39, tzinfo=UTC)


def _item(kind: str, payload: dict[str, Any], number: int) -> OutboxItem:
    return OutboxItem(number, "slack", "pc-" + LONG, kind, payload, AT)


def _built() -> list[tuple[str, Message]]:
    destination = SlackDestination(AsyncWebClient(token="unused"), None, SlackLinks("C0GPUOPS"), lambda: AT)  # type: ignore[arg-type]
    built: list[tuple[str, Message]] = []
    for n, kind in enumerate(NOTICE_KINDS):
        payload: dict[str, Any] = {
            "incident_id": "pc-" + LONG,
            "kind": kind,
            "title": LONG,
            "lines": LINES,
            "severity": "critical",
        }
        message = destination.reply_for(_item(kind, payload, n))
        assert message is not None
        built.append((f"notice {kind}", message))
    for n, kind in enumerate(sorted(EVENTS - {"state"})):
        payload = {"event": True, "step": LONG, "outcome": LONG, "actor": "slack:" + LONG, "detail": LONG}
        message = destination.reply_for(_item(kind, payload, 100 + n))
        assert message is not None
        built.append((f"event {kind}", message))
    view = ParentView(
        incident_id="pc-" + LONG,
        node=LONG,
        title=LONG,
        lines=tuple(LINES),
        severity="critical",
        mode="approve",
        plan=" → ".join(["step"] * 2_000),
        gpu=LONG,
        state=LONG,
        status=LONG,
        grafana="https://grafana.example/d/" + LONG,
        runbook="https://runbooks.example/" + LONG,
        decisions=tuple(Decision("<@" + LONG + ">", LONG, AT + timedelta(seconds=s)) for s in range(1_000)),
        offer=("approve", "reject", "rollback"),
        jobs=tuple(LINES),
        capacity=LONG,
    )
    built.append(("parent", messages.parent(view)))
    entries = [DigestEntry(f"pc-{n}", LONG, LONG, "guarded", n % 2 == 0) for n in range(5_000)]
    built.append(("digest", messages.digest(entries, "2m", "observe")))
    built.append(("channel notice", messages.channel_notice(LONG, LINES, "critical")))
    return built


CASES = _built()


@pytest.mark.parametrize(("name", "message"), CASES, ids=[name for name, _ in CASES])
async def test_every_message_passes_slacks_limits(name: str, message: Message, bot: AsyncWebClient) -> None:
    assert blockkit.validate(message.blocks) == [], name
    assert len(message.text) <= messages.FALLBACK_TEXT
    answer = await bot.chat_postMessage(channel="C0GPUOPS", text=message.text, blocks=message.blocks)
    assert answer["ok"]


def test_long_timelines_point_to_the_cli() -> None:
    summary = dict(CASES)["notice summary"]
    assert "pitcrew incidents show" in repr(summary.blocks)
    parent = dict(CASES)["parent"]
    ids = [e["action_id"] for b in parent.blocks if b["type"] == "actions" for e in b["elements"]]
    assert ids == [messages.APPROVE, messages.REJECT, messages.ROLLBACK]
    buttons = [e for b in parent.blocks if b["type"] == "actions" for e in b["elements"]]
    assert all(e["value"].startswith("pc-xxx") and len(e["value"]) <= 2000 for e in buttons)
    assert all("confirm" in e for e in buttons)


def test_the_whole_text_of_every_message_is_within_slacks_total() -> None:
    """Each part within its limit, a parent of long parts carried 22,000 characters of text, which
    Slack refuses whole (``msg_blocks_too_long``); the longest parts are clipped to fit."""
    for name, message in _built():
        assert blockkit.text_total(message.blocks) <= messages.BLOCKS_TEXT, name


def test_the_buttons_block_has_a_new_id_for_each_version_of_the_parent() -> None:
    """Slack asks for a new ``block_id`` whenever a message is updated (Block Kit reference)."""

    def block_id(state: str) -> str:
        view = ParentView(
            "pc-00001", "gpu-node-01", "XID 79", (), "critical", "approve", "plan", "gpu3", state, "ok",
            offer=("rollback",),
        )  # fmt: skip
        [actions] = [b for b in messages.parent(view).blocks if b["type"] == "actions"]
        return str(actions["block_id"])

    assert block_id("running") == block_id("running")  # the same message, the same id
    assert block_id("running") != block_id("verifying")
