"""The Slack stand-in, proved with the real slack_sdk / slack_bolt clients.

Cases:
- auth.test answers the fixture's shape; a bad token is ``invalid_auth``, an app token ``not_allowed_token_type``.
- chat.postMessage: unknown channel ``channel_not_found``, bot not a member ``not_in_channel``; a thread
  (replies, reply_broadcast, reply to a reply) reads back as a human sees it; blocks echoed as stored.
- chat.update keeps the earlier version; an unknown ts is ``message_not_found``.
- invalid_blocks: over 50 blocks, a section over 3000 chars (fixture body), header over 150, button text
  over 75, duplicate action_id; a message at the limits passes. Nothing is stored on rejection.
- chat.postEphemeral, conversations.info / members, usergroups.users.list.
- 429 with Retry-After (slack_sdk's RateLimitErrorRetryHandler retries it), 5xx on demand; every call recorded.
- optional strict one-post-per-second-per-channel limit answers 429 per channel.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from slack_sdk.errors import SlackApiError
from slack_sdk.http_retry.builtin_async_handlers import AsyncRateLimitErrorRetryHandler
from slack_sdk.models.blocks import ActionsBlock, ButtonElement, DividerBlock, HeaderBlock, SectionBlock
from slack_sdk.web.async_client import AsyncWebClient

from proving_ground.slack.server import SlackStandin
from proving_ground.slack.world import APP_TOKEN

FIXTURES = Path(__file__).parent / "fixtures"
CHANNEL = "C0GPUOPS"


def fixture(name: str) -> Any:
    return json.loads((FIXTURES / name).read_text())


def section(text: str) -> dict[str, Any]:
    return {"type": "section", "text": {"type": "mrkdwn", "text": text}}


async def test_auth_test_answers_like_slack(bot: AsyncWebClient) -> None:
    answer = await bot.auth_test()
    assert answer.data == fixture("auth-test-ok.json")


@pytest.mark.parametrize(
    ("token", "error"), [("xoxb-forged", "invalid_auth"), (APP_TOKEN, "not_allowed_token_type")]
)
async def test_wrong_token_is_refused_with_http_200(slack: SlackStandin, token: str, error: str) -> None:
    client = AsyncWebClient(token=token, base_url=slack.base_url)
    with pytest.raises(SlackApiError) as e:
        await client.chat_postMessage(channel=CHANNEL, text="hi")
    assert e.value.response.status_code == 200
    assert e.value.response.data == {"ok": False, "error": error}
    assert slack.api.messages == []


@pytest.mark.parametrize(
    ("channel", "error"), [("C0NOWHERE", "channel_not_found"), ("C0ELSEWHERE", "not_in_channel")]
)
async def test_post_to_a_channel_the_bot_cannot_use(
    slack: SlackStandin, bot: AsyncWebClient, channel: str, error: str
) -> None:
    with pytest.raises(SlackApiError) as e:
        await bot.chat_postMessage(channel=channel, text="hi")
    assert e.value.response.data == {"ok": False, "error": error}
    assert slack.api.messages == []


async def test_a_thread_reads_back_as_a_human_sees_it(slack: SlackStandin, bot: AsyncWebClient) -> None:
    blocks = fixture("chat-postMessage-request.json")["blocks"]
    parent = await bot.chat_postMessage(channel=CHANNEL, text="pc-00042 opened", blocks=blocks)
    echoed, expected = parent["message"]["blocks"], fixture("chat-postMessage-ok.json")["message"]["blocks"]
    for sent, got, want in zip(blocks, echoed, expected, strict=True):
        if "block_id" not in sent:  # Slack generates one; its value is arbitrary
            assert got.pop("block_id") and want.pop("block_id")
    assert echoed == expected
    one = await bot.chat_postMessage(channel=CHANNEL, thread_ts=parent["ts"], text="cordoned")
    two = await bot.chat_postMessage(channel=CHANNEL, thread_ts=one["ts"], text="drained")
    summary = await bot.chat_postMessage(
        channel=CHANNEL, thread_ts=parent["ts"], text="recovered in 4m", reply_broadcast=True
    )
    assert two["message"]["thread_ts"] == parent["ts"]
    thread = slack.api.thread(CHANNEL, parent["ts"])
    assert [m.text for m in thread] == ["pc-00042 opened", "cordoned", "drained", "recovered in 4m"]
    assert [m.ts for m in thread] == sorted(m.ts for m in thread)
    assert [m.ts for m in slack.api.channel_view(CHANNEL)] == [parent["ts"], summary["ts"]]


async def test_update_keeps_the_earlier_version(slack: SlackStandin, bot: AsyncWebClient) -> None:
    parent = await bot.chat_postMessage(channel=CHANNEL, text="approval needed", blocks=[section("waiting")])
    answer = await bot.chat_update(
        channel=CHANNEL, ts=parent["ts"], text="approved", blocks=[section("by alice")]
    )
    assert answer["ts"] == parent["ts"] and answer["text"] == "approved" and "ts" not in answer["message"]
    m = slack.api.message(CHANNEL, parent["ts"])
    assert m is not None and m.text == "approved" and m.blocks[0]["text"]["text"] == "by alice"
    assert [u["text"] for u in m.updates] == ["approval needed"]
    with pytest.raises(SlackApiError) as e:
        await bot.chat_update(channel=CHANNEL, ts="1.000000", text="x")
    assert e.value.response["error"] == "message_not_found"


def _button(action_id: str, text: str = "Go", value: str = "pc-00042") -> dict[str, Any]:
    return {
        "type": "button",
        "action_id": action_id,
        "text": {"type": "plain_text", "text": text},
        "value": value,
    }


INVALID = {
    "51 blocks": ([section("x")] * 51, ["no more than 50 items allowed [json-pointer:/blocks]"]),
    "section over 3000": (
        [{"type": "header", "text": {"type": "plain_text", "text": "h"}}, section("x" * 3001)],
        fixture("error-invalid-blocks.json")["errors"],
    ),
    "header over 150": (
        [{"type": "header", "text": {"type": "plain_text", "text": "h" * 151}}],
        [
            "failed to match all allowed schemas [json-pointer:/blocks/0/text]",
            "must be less than 151 characters [json-pointer:/blocks/0/text/text]",
        ],
    ),
    "button text over 75": (
        [{"type": "actions", "elements": [_button("a", "b" * 76)]}],
        [
            "failed to match all allowed schemas [json-pointer:/blocks/0/elements/0/text]",
            "must be less than 76 characters [json-pointer:/blocks/0/elements/0/text/text]",
        ],
    ),
    "duplicate action_id": (
        [{"type": "actions", "elements": [_button("pitcrew_approve"), _button("pitcrew_approve")]}],
        ['`action_id` "pitcrew_approve" already exists [json-pointer:/blocks/0/elements/1/action_id]'],
    ),
    "duplicate action_id across blocks": (
        [{"type": "actions", "elements": [_button("a")]}, {"type": "actions", "elements": [_button("a")]}],
        ['`action_id` "a" already exists [json-pointer:/blocks/1/elements/0/action_id]'],
    ),
}


@pytest.mark.parametrize("case", sorted(INVALID))
async def test_invalid_blocks_are_refused_on_post_and_update(
    slack: SlackStandin, bot: AsyncWebClient, case: str
) -> None:
    blocks, errors = INVALID[case]
    with pytest.raises(SlackApiError) as e:
        await bot.chat_postMessage(channel=CHANNEL, text="t", blocks=blocks)
    assert e.value.response.status_code == 200
    assert e.value.response.data == {
        "ok": False,
        "error": "invalid_blocks",
        "errors": errors,
        "response_metadata": {"messages": [f"[ERROR] {m}" for m in errors]},
    }
    assert slack.api.messages == []
    parent = await bot.chat_postMessage(channel=CHANNEL, text="fine")
    with pytest.raises(SlackApiError):
        await bot.chat_update(channel=CHANNEL, ts=parent["ts"], text="t", blocks=blocks)
    assert slack.api.messages[0].text == "fine"


async def test_a_message_at_every_limit_passes(slack: SlackStandin, bot: AsyncWebClient) -> None:
    """Each part at its limit, 50 blocks, and the text of all of them together at Slack's total; one
    character more of text in all is ``msg_blocks_too_long``, whatever each part is."""
    sections = [SectionBlock(text="s" * 3000) for _ in range(3)]
    last = 12_000 - 150 - 75 - 3 * 3000
    blocks = [
        HeaderBlock(text="h" * 150),
        ActionsBlock(elements=[ButtonElement(text="b" * 75, action_id="a" * 255, value="v" * 2000)]),
        *sections,
        SectionBlock(text="s" * last),
        *[DividerBlock() for _ in range(44)],
    ]
    answer = await bot.chat_postMessage(channel=CHANNEL, text="t", blocks=blocks)
    assert len(slack.api.message(CHANNEL, answer["ts"]).blocks) == 50  # type: ignore[union-attr]
    blocks[5] = SectionBlock(text="s" * (last + 1))
    with pytest.raises(SlackApiError) as refused:
        await bot.chat_postMessage(channel=CHANNEL, text="t", blocks=blocks)
    assert refused.value.response["error"] == "msg_blocks_too_long"


async def test_ephemeral_and_membership_and_usergroups(slack: SlackStandin, bot: AsyncWebClient) -> None:
    answer = await bot.chat_postEphemeral(channel=CHANNEL, user="U0MALLORY", text="not an approver")
    assert slack.api.ephemeral[0]["user"] == "U0MALLORY" and answer["message_ts"]
    with pytest.raises(SlackApiError) as e:
        await bot.chat_postEphemeral(channel=CHANNEL, user="U0STRANGER", text="x")
    assert e.value.response["error"] == "user_not_in_channel"
    info = await bot.conversations_info(channel="C0ELSEWHERE")
    assert info["channel"]["is_member"] is False
    members = await bot.conversations_members(channel=CHANNEL)
    assert "U0PITBOT" in members["members"]
    group = await bot.usergroups_users_list(usergroup="S0APPROVERS")
    assert group.data == fixture("usergroups-users-list-ok.json")
    with pytest.raises(SlackApiError) as e:
        await bot.usergroups_users_list(usergroup="S0NONE")
    assert e.value.response["error"] == "no_such_subteam"


async def test_429_with_retry_after_then_success(slack: SlackStandin, bot: AsyncWebClient) -> None:
    slack.api.fail("chat.postMessage", 429, count=1, retry_after=1)
    with pytest.raises(SlackApiError) as e:
        await bot.chat_postMessage(channel=CHANNEL, text="first")
    assert e.value.response.status_code == 429
    assert e.value.response.headers["Retry-After"] == "1"
    assert e.value.response.data == {"ok": False, "error": "ratelimited"}
    assert slack.api.messages == []
    slack.api.fail("chat.postMessage", 429, count=1, retry_after=0)
    retrying = AsyncWebClient(
        token=bot.token,
        base_url=slack.base_url,
        retry_handlers=[AsyncRateLimitErrorRetryHandler(max_retry_count=1)],
    )
    await retrying.chat_postMessage(channel=CHANNEL, text="second")
    assert [c.status for c in slack.api.calls_to("chat.postMessage")] == [429, 429, 200]
    assert [m.text for m in slack.api.messages] == ["second"]


async def test_one_post_per_second_per_channel_when_enforced(
    slack: SlackStandin, bot: AsyncWebClient
) -> None:
    slack.api.post_interval = 1.0
    await bot.chat_postMessage(channel=CHANNEL, text="first")
    with pytest.raises(SlackApiError) as e:
        await bot.chat_postMessage(channel=CHANNEL, text="too soon")
    assert e.value.response.status_code == 429 and e.value.response.headers["Retry-After"] == "1"
    slack.world.channels["C0ELSEWHERE"].members.add("U0PITBOT")
    await bot.chat_postMessage(channel="C0ELSEWHERE", text="other channel is not limited")
    assert [m.text for m in slack.api.messages] == ["first", "other channel is not limited"]


async def test_5xx_on_demand_then_recovery(slack: SlackStandin, bot: AsyncWebClient) -> None:
    slack.api.fail("*", 503, count=2)
    for _ in range(2):
        with pytest.raises(SlackApiError) as e:
            await bot.chat_postMessage(channel=CHANNEL, text="down")
        assert e.value.response.status_code == 503
    await bot.chat_postMessage(channel=CHANNEL, text="up", thread_ts=None)
    assert [m.text for m in slack.api.messages] == ["up"]


async def test_every_call_is_recorded_with_its_arguments(slack: SlackStandin, bot: AsyncWebClient) -> None:
    await bot.auth_test()
    parent = await bot.chat_postMessage(channel=CHANNEL, text="p")
    await bot.chat_postMessage(channel=CHANNEL, text="r", thread_ts=parent["ts"], reply_broadcast=True)
    await bot.usergroups_users_list(usergroup="S0APPROVERS")
    assert [c.method for c in slack.api.calls] == [
        "auth.test",
        "chat.postMessage",
        "chat.postMessage",
        "usergroups.users.list",
    ]
    assert slack.api.calls[2].args == {
        "channel": CHANNEL,
        "text": "r",
        "thread_ts": parent["ts"],
        "reply_broadcast": True,
    }
    assert slack.api.calls[3].args == {"usergroup": "S0APPROVERS"}
    assert {c.token for c in slack.api.calls} == {bot.token}
