"""The stand-in's #21 behaviours, each against slack_sdk's real client (what pitcrew's tests rely on).

Cases:
- mrkdwn: ``<!channel>`` anywhere, and a link or mention inside text a test names as coming from
  outside, are flagged; the same text escaped is not; a bare ``&`` is flagged;
- deletion: a person's deletion and ``chat.delete`` (own messages only; ``cant_delete_message``
  otherwise); then ``chat.update`` answers ``message_not_found`` and ``conversations.replies``
  ``thread_not_found``, and a reply to the deleted parent is accepted, at the channel's top level;
- the edit window: off by default (any time, Slack's default); once the workspace sets one, a message
  older than it answers ``chat.update`` with ``edit_window_closed`` and a newer one is still edited;
- ``apps.connections.open``: ``invalid_auth`` for a revoked app token, ``missing_scope`` naming
  ``connections:write``;
- rate tiers: ``usergroups.users.list`` (Tier 2) answers the 21st call in a minute 429 with a
  ``Retry-After`` in whole seconds; ``allow("rate_tiers")`` lifts it;
- cursors: ``conversations.replies`` pages with ``next_cursor`` until ``has_more`` is false, an
  unknown cursor is ``invalid_cursor``;
- ``response_url``: answers land with their user, 5 uses at most, then ``used_url``;
- an HTTP click the app does not answer within 3 s is given up (``TIMED_OUT``), as Slack does;
- a name Slack has no method by (``annotations``: a Grafana annotation once reached a stand-in that
  had taken Grafana's port) is HTTP 200 ``unknown_method`` naming it in ``req_method``, whatever the
  body; a path outside ``/api/<method>`` is a 404; only the app's own tokens land in ``api.unserved``
  (which the fixtures fail the test on);
- a JSON body a served method cannot use is HTTP 200 ``invalid_json`` (it does not parse) or
  ``json_not_object`` (it is not an object), as Slack answers, never an HTTP error.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import aiohttp
import pytest
from aiohttp import web
from slack_sdk.errors import SlackApiError
from slack_sdk.web.async_client import AsyncWebClient

from proving_ground.proc import free_port
from proving_ground.slack.clicks import TIMED_OUT, Interactivity
from proving_ground.slack.server import SlackStandin
from proving_ground.slack.world import APP_TOKEN, BOT_TOKEN, SIGNING_SECRET

CHANNEL = "C0GPUOPS"


async def _error(call: object) -> tuple[int, str]:
    with pytest.raises(SlackApiError) as e:
        await call  # type: ignore[misc]
    return e.value.response.status_code, str(e.value.response["error"])


async def test_foreign_markup_is_flagged(slack: SlackStandin, bot: AsyncWebClient) -> None:
    slack.api.allow("unescaped_markup")  # this test reads the flags itself
    hostile = "<!channel> & <https://evil.example|Approve>"
    slack.api.outside.append(hostile)
    await bot.chat_postMessage(channel=CHANNEL, text=f"job {hostile}")
    kinds = [f.what for f in slack.api.flags]
    assert kinds == [
        "notifies the whole channel",
        "a link from outside, unescaped",
        "a bare & (Slack wants &amp;)",
    ]
    slack.api.flags.clear()
    escaped = hostile.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    await bot.chat_postMessage(
        channel=CHANNEL,
        text=f"<@U0ALICE> job {escaped} <https://grafana.example/d?a=1&amp;b=2|Grafana>",
        blocks=[{"type": "section", "text": {"type": "mrkdwn", "text": escaped}}],
    )
    assert slack.api.flags == []


async def test_deleted_messages_are_gone(slack: SlackStandin, bot: AsyncWebClient) -> None:
    parent = (await bot.chat_postMessage(channel=CHANNEL, text="parent"))["ts"]
    reply = (await bot.chat_postMessage(channel=CHANNEL, text="reply", thread_ts=parent))["ts"]
    slack.api.delete(CHANNEL, parent)  # a person
    assert await _error(bot.chat_update(channel=CHANNEL, ts=parent, text="x")) == (200, "message_not_found")
    assert await _error(bot.conversations_replies(channel=CHANNEL, ts=parent)) == (200, "thread_not_found")
    assert await _error(bot.conversations_replies(channel=CHANNEL, ts=reply)) == (200, "thread_not_found")
    orphan = await bot.chat_postMessage(channel=CHANNEL, text="late", thread_ts=parent)
    # Taken without an error, at the channel's top level (slackapi/python-slack-events-api#87).
    assert orphan["ok"] and [m.thread_ts for m in slack.api.channel_view(CHANNEL) if m.text == "late"] == [
        None
    ]
    other = (await bot.chat_postMessage(channel=CHANNEL, text="mine"))["ts"]
    assert (await bot.chat_delete(channel=CHANNEL, ts=other))["ok"]
    assert await _error(bot.chat_delete(channel=CHANNEL, ts=other)) == (200, "message_not_found")
    slack.api.messages[0].user = "U0ALICE"
    assert await _error(bot.chat_delete(channel=CHANNEL, ts=slack.api.messages[0].ts)) == (
        200,
        "cant_delete_message",
    )


async def test_the_workspace_edit_window(slack: SlackStandin, bot: AsyncWebClient) -> None:
    old = (await bot.chat_postMessage(channel=CHANNEL, text="old"))["ts"]
    slack.api.backdate(CHANNEL, old, 3600)
    assert (await bot.chat_update(channel=CHANNEL, ts=old, text="edited"))["ok"]  # any time: the default
    slack.world.edit_window = 60.0  # an admin allows editing up to one minute after sending
    new = (await bot.chat_postMessage(channel=CHANNEL, text="new"))["ts"]
    assert await _error(bot.chat_update(channel=CHANNEL, ts=old, text="x")) == (200, "edit_window_closed")
    assert (await bot.chat_update(channel=CHANNEL, ts=new, text="edited"))["ok"]
    message = slack.api.message(CHANNEL, old)
    assert message is not None and message.text == "edited"  # refused edits change nothing


async def test_connections_open_refuses_bad_app_tokens(slack: SlackStandin) -> None:
    slack.api.allow("rate_tiers")
    client = AsyncWebClient(base_url=slack.base_url)
    assert await _error(client.apps_connections_open(app_token="xapp-revoked")) == (200, "invalid_auth")
    slack.world.app_token_scopes.clear()
    with pytest.raises(SlackApiError) as e:
        await client.apps_connections_open(app_token=APP_TOKEN)
    assert (e.value.response["error"], e.value.response["needed"]) == ("missing_scope", "connections:write")


async def test_rate_tiers(slack: SlackStandin, bot: AsyncWebClient) -> None:
    for _ in range(20):
        await bot.usergroups_users_list(usergroup="S0APPROVERS")
    with pytest.raises(SlackApiError) as e:
        await bot.usergroups_users_list(usergroup="S0APPROVERS")
    assert e.value.response.status_code == 429 and 1 <= int(e.value.response.headers["Retry-After"]) <= 60
    slack.api.allow("rate_tiers")
    assert (await bot.usergroups_users_list(usergroup="S0APPROVERS"))["ok"]


async def test_replies_page_with_cursors(slack: SlackStandin, bot: AsyncWebClient) -> None:
    parent = (await bot.chat_postMessage(channel=CHANNEL, text="parent"))["ts"]
    for n in range(5):
        await bot.chat_postMessage(channel=CHANNEL, text=f"r{n}", thread_ts=parent)
    seen, cursor = [], None
    while True:
        page = await bot.conversations_replies(channel=CHANNEL, ts=parent, limit=2, cursor=cursor)
        seen += [m["text"] for m in page["messages"]]
        cursor = page["response_metadata"]["next_cursor"]
        assert bool(cursor) == page["has_more"]
        if not page["has_more"]:
            break
    assert seen == ["parent", "r0", "r1", "r2", "r3", "r4"]
    assert await _error(bot.conversations_replies(channel=CHANNEL, ts=parent, cursor="bm9wZQ==")) == (
        200,
        "invalid_cursor",
    )


async def test_response_url_five_uses(slack: SlackStandin) -> None:
    url = slack.response_url("U0ALICE", "D0ALICEBOT")
    async with aiohttp.ClientSession() as session:
        for n in range(5):
            async with session.post(url, json={"text": f"answer {n}"}) as response:
                assert response.status == 200
        async with session.post(url, json={"text": "sixth"}) as response:
            assert (response.status, await response.text()) == (404, "used_url")
    assert [e["text"] for e in slack.api.ephemeral] == [f"answer {n}" for n in range(5)]
    assert {(e["user"], e["channel"]) for e in slack.api.ephemeral} == {("U0ALICE", "D0ALICEBOT")}


async def test_a_method_slack_lacks_is_unknown_method(slack: SlackStandin, bot: AsyncWebClient) -> None:
    unknown = {"ok": False, "error": "unknown_method", "req_method": "annotations"}
    with pytest.raises(SlackApiError) as e:
        await bot.api_call("annotations", json={"text": "drain gpu-001", "tags": ["pitcrew"]})
    assert (e.value.response.status_code, e.value.response.data) == (200, unknown)

    root = slack.base_url.removesuffix("/api/")
    grafana = {"Authorization": "Bearer glsa_not_a_slack_token", "Content-Type": "application/json"}
    async with aiohttp.ClientSession() as http:
        for body in (b'{"text": "drain gpu-001", "tags": ["pitcrew"]}', b"[1, 2", b""):
            async with http.post(f"{root}/api/annotations", data=body, headers=grafana) as r:
                assert (r.status, await r.json()) == (200, unknown), body
        for path in ("/annotations", "/api/annotations/7", "/api/", "/"):
            async with http.post(f"{root}{path}", headers=grafana) as r:
                assert r.status == 404, path
    assert slack.api.unserved == []  # neither the tester's token nor Grafana's is the app's

    app = AsyncWebClient(token=APP_TOKEN, base_url=slack.base_url)  # one of the app's own tokens
    with pytest.raises(SlackApiError) as e:
        await app.api_call("pins.add", params={"channel": CHANNEL})
    assert e.value.response.data == {**unknown, "req_method": "pins.add"}
    assert [(c.method, c.token) for c in slack.api.unserved] == [("pins.add", APP_TOKEN)]
    with pytest.raises(AssertionError, match=r"does not serve: \['pins.add'\]"):
        slack.api.check_served()
    slack.api.unserved.clear()  # this test made that call itself


@pytest.fixture
async def slow_app() -> AsyncIterator[str]:
    """An app whose request URL answers only after 4 s."""

    async def handle(request: web.Request) -> web.Response:
        await asyncio.sleep(4)
        return web.Response()

    app = web.Application()
    app.router.add_post("/slack/events", handle)
    runner = web.AppRunner(app)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    try:
        yield f"http://127.0.0.1:{port}/slack/events"
    finally:
        await runner.cleanup()


async def test_a_click_not_answered_in_3_s_is_given_up(
    slack: SlackStandin, bot: AsyncWebClient, slow_app: str
) -> None:
    await bot.chat_postMessage(
        channel=CHANNEL,
        text="x",
        blocks=[
            {
                "type": "actions",
                "elements": [
                    {"type": "button", "text": {"type": "plain_text", "text": "Approve"}, "value": "pc-1",
                     "action_id": "pitcrew_approve"}
                ],
            }
        ],
    )  # fmt: skip
    answer = await Interactivity(slack.api, slow_app, SIGNING_SECRET).click(
        CHANNEL, "Approve", "pc-1", "U0ALICE"
    )
    assert answer.status == TIMED_OUT


async def test_a_json_body_slack_cannot_use_is_answered_as_slack_does(slack: SlackStandin) -> None:
    root = slack.base_url.removesuffix("/api/")
    headers = {"Authorization": f"Bearer {BOT_TOKEN}", "Content-Type": "application/json; charset=utf-8"}
    async with aiohttp.ClientSession() as http:
        for body, error in ((b'{"channel": "C0GPUOPS", "text": "x"', "invalid_json"), (b"", "invalid_json"),
                            (b'["C0GPUOPS"]', "json_not_object"), (b'"text"', "json_not_object")):  # fmt: skip
            async with http.post(f"{root}/api/chat.postMessage", data=body, headers=headers) as r:
                assert (r.status, await r.json()) == (200, {"ok": False, "error": error}), body
    assert [c.answer for c in slack.api.calls_to("chat.postMessage")] == [
        {"ok": False, "error": e}
        for e in ("invalid_json", "invalid_json", "json_not_object", "json_not_object")
    ]
    assert slack.api.messages == []
