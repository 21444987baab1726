"""Slack's ``error`` codes become pitcrew's closed ``Reason``; the code itself stays in the message.

Each row is one real Web API call through slack_sdk to the Slack stand-in (which answers as
Slack does, ``../shared/fixtures/slack``) and ``bot.integrations.slack.errors.call``: a revoked
or wrong token, an app token where a bot token belongs, a missing scope, an unknown channel, a
channel the bot is not in, an update of a message that is not there and an unknown thread (both
permanent, as a deleted message: ``MessageGone``), an update of another's message and of one past
the workspace's edit window (both permanent, as a message pitcrew can no longer edit:
``MessageUneditable``, under ``forbidden``), an unknown user
group, a user not in the channel, a bad page size, blocks Slack refuses and blocks each within its
limits whose text together is too long (both permanent: no retry fixes them), 429 with ``Retry-After`` (kept as ``retry_after``) and a 503. A code pitcrew has no name for
is ``refused``, and no code ever becomes a reason of its own. Through the service, the outbox's
deliveries Slack rate limited are counted in ``pitcrew_integration_errors_total{system="notifier"}``
under ``rate_limited``, and Slack's own spelling never becomes a label value.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families
from slack_sdk.web.async_client import AsyncWebClient
from slack_sdk.web.async_slack_response import AsyncSlackResponse

from bot.engine.errors import PermanentError, PitcrewError, Reason, TransientError
from bot.integrations.slack.errors import REASONS, MessageGone, MessageUneditable, call, reason_of
from bot.integrations.slack.messages import MOVED
from proving_ground.slack.server import SlackStandin
from proving_ground.slack.webapi import Message
from tests.harness.scenarios import delivery
from tests.slack.pitcrew_app import SlackPitcrew, until

Request = Callable[[AsyncWebClient], Awaitable[AsyncSlackResponse]]
CHANNEL = "C0GPUOPS"


@dataclass(frozen=True)
class Case:
    request: Request
    reason: Reason
    code: str
    kind: type[PitcrewError] = TransientError
    #: The bot's own token unless one is named: ``app`` (the app-level token) or a wrong one.
    token: str | None = None
    scopes_removed: tuple[str, ...] = ()
    fault: int | None = None
    #: What the workspace holds or is set to before the call (a message someone else posted).
    prepare: Callable[[SlackStandin], None] = lambda slack: None


def _post(channel: str = CHANNEL, **extra: Any) -> Request:
    return lambda c: c.chat_postMessage(channel=channel, text="pitcrew", **extra)


def _posted_long_ago(slack: SlackStandin) -> None:
    """The bot's message from the fixtures' epoch, and an edit window of one minute."""
    slack.api.messages.append(Message(CHANNEL, "1.000003", "hi", [], slack.world.bot_user, posted_at=0.0))
    slack.world.edit_window = 60.0


CASES = {
    "revoked token": Case(_post(), Reason.UNAUTHORIZED, "invalid_auth", token="xoxb-revoked"),
    "app token for a bot call": Case(_post(), Reason.UNAUTHORIZED, "not_allowed_token_type", token="app"),
    "missing scope": Case(_post(), Reason.FORBIDDEN, "missing_scope", scopes_removed=("chat:write",)),
    "unknown channel": Case(_post("C0NOWHERE"), Reason.NOT_FOUND, "channel_not_found"),
    "bot not in the channel": Case(_post("C0ELSEWHERE"), Reason.FORBIDDEN, "not_in_channel"),
    "update of a message that is not there": Case(
        lambda c: c.chat_update(channel=CHANNEL, ts="1.000001", text="x"),
        Reason.NOT_FOUND,
        "message_not_found",
        kind=MessageGone,
    ),
    "update of another's message": Case(
        lambda c: c.chat_update(channel=CHANNEL, ts="1.000002", text="x"),
        Reason.FORBIDDEN,
        "cant_update_message",
        kind=MessageUneditable,
        prepare=lambda slack: slack.api.messages.append(Message(CHANNEL, "1.000002", "hi", [], "U0ALICE")),
    ),
    "update past the workspace's edit window": Case(
        lambda c: c.chat_update(channel=CHANNEL, ts="1.000003", text="x"),
        Reason.FORBIDDEN,
        "edit_window_closed",
        kind=MessageUneditable,
        prepare=_posted_long_ago,
    ),
    "unknown thread": Case(
        lambda c: c.conversations_replies(channel=CHANNEL, ts="1.000001"),
        Reason.NOT_FOUND,
        "thread_not_found",
        kind=MessageGone,
    ),
    "unknown user group": Case(
        lambda c: c.usergroups_users_list(usergroup="S0NOBODY"), Reason.NOT_FOUND, "no_such_subteam"
    ),
    "user not in the channel": Case(
        lambda c: c.chat_postEphemeral(channel=CHANNEL, user="U0NOBODY", text="x"),
        Reason.NOT_FOUND,
        "user_not_in_channel",
    ),
    "bad page size": Case(
        lambda c: c.conversations_history(channel=CHANNEL, limit="many"),  # type: ignore[arg-type]
        Reason.INVALID_REQUEST,
        "invalid_limit",
    ),
    "blocks Slack refuses": Case(
        _post(blocks=[{"type": "section", "text": {"type": "mrkdwn", "text": "x" * 3001}}]),
        Reason.INVALID_REQUEST,
        "invalid_blocks",
        kind=PermanentError,
    ),
    "blocks whose text together is too long": Case(
        _post(blocks=[{"type": "section", "text": {"type": "mrkdwn", "text": "x" * 3000}}] * 5),
        Reason.INVALID_REQUEST,
        "msg_blocks_too_long",
        kind=PermanentError,
    ),
    "rate limited": Case(_post(), Reason.RATE_LIMITED, "ratelimited", fault=429),
    "Slack down": Case(_post(), Reason.UNAVAILABLE, "HTTP 503", fault=503),
}


@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
async def test_slack_codes_map_onto_reasons_and_stay_in_the_message(slack: SlackStandin, case: Case) -> None:
    slack.world.scopes -= set(case.scopes_removed)
    case.prepare(slack)
    if case.fault is not None:
        slack.api.fail("*", case.fault, retry_after=3)
    token = {None: min(slack.world.bot_tokens), "app": min(slack.world.app_tokens)}.get(
        case.token, case.token
    )
    client = AsyncWebClient(token=token, base_url=slack.base_url)
    with pytest.raises(PitcrewError) as caught:
        await call(case.request(client))
    assert type(caught.value) is case.kind
    assert caught.value.reason is case.reason
    assert case.code in str(caught.value)
    if case.fault == 429:
        assert isinstance(caught.value, TransientError) and caught.value.retry_after == 3


def test_a_code_pitcrew_has_no_name_for_is_refused_and_no_code_is_a_reason() -> None:
    assert reason_of("some_code_slack_adds_next_year") is Reason.REFUSED
    assert reason_of("") is Reason.REFUSED
    assert set(REASONS.values()) <= set(Reason)
    assert "ratelimited" not in {r.value for r in Reason}  # Slack's spelling is mapped, not adopted


async def test_the_services_slack_deliveries_count_refusals_under_their_reason(
    slack: SlackStandin, tmp_path: Path
) -> None:
    async with SlackPitcrew(tmp_path / "p", slack, config={"mode": "observe"}) as pitcrew:
        slack.api.fail("chat.postMessage", 429, count=2, retry_after=1)
        await pitcrew.post_alerts(delivery(node="gpu-node-02"))
        await until(
            lambda: any(c.status == 200 for c in slack.api.calls_to("chat.postMessage")),
            what="the incident message posted after two 429s",
        )
        status, body = await pitcrew.request("GET", "/metrics")
    assert status == 200
    counted = {
        s.labels["reason"]: s.value
        for family in text_string_to_metric_families(body.decode())
        for s in family.samples
        if s.name == "pitcrew_integration_errors_total" and s.labels["system"] == "notifier"
    }
    assert counted["rate_limited"] == 2
    assert set(counted) == {r.value for r in Reason}  # "ratelimited" (Slack's word) is no label


def test_each_message_that_takes_no_more_edits_names_the_line_its_new_parent_shows() -> None:
    assert {MessageGone.moved, MessageUneditable.moved} == set(MOVED)
