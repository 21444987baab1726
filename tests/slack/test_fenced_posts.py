"""The outbox's Slack client asks the fence before every call, not only before a delivery.

A delivery is several Web API calls (a reply, then the parent's ``chat.update``) and only its
start is a fenced write. A leader stopped while Slack answered the reply (SIGSTOP, a frozen VM)
wakes past its lease: the fencing e2e saw the old leader's ``chat.update`` reach Slack after the
new leader had taken the thread over. Cases, against the Slack stand-in: the lease lapses while
``chat.postMessage`` is answered → the ``chat.update`` that follows raises ``Deposed`` and never
reaches Slack, and the fence tells the leadership loop; the lease lapses while a call connects
→ the request is refused once the connection is held, unsent; a process standing by sends nothing;
the service's shutdown closes the outbox client's session (its connections to Slack kept alive).
"""

from __future__ import annotations

import gc
from pathlib import Path

import pytest

from bot.integrations.slack import FencedWebClient
from bot.store.base import Deposed
from bot.store.lease import Fence
from proving_ground.slack.server import SlackStandin
from proving_ground.slack.world import BOT_TOKEN
from tests.harness.scenarios import delivery
from tests.slack.pitcrew_app import CHANNEL, SlackPitcrew, until


async def test_a_lease_lapsed_while_slack_answered_stops_the_next_call(slack: SlackStandin) -> None:
    posted_before = len(slack.api.calls_to("chat.postMessage"))

    def monotonic() -> float:
        # The process stalls while Slack answers the post: its clock is past the lease after it.
        return 100.0 if len(slack.api.calls_to("chat.postMessage")) > posted_before else 0.0

    fence = Fence("leader-a", monotonic=monotonic)
    fence.grant(1, valid_until=10.0)
    told: list[str] = []
    fence.on_deposed(told.append)
    client = FencedWebClient(fence, token=BOT_TOKEN, base_url=slack.base_url)
    try:
        reply = await client.chat_postMessage(channel=CHANNEL, text="step finished")
        updates = len(slack.api.calls_to("chat.update"))
        with pytest.raises(Deposed, match="may have lapsed"):
            await client.chat_update(channel=CHANNEL, ts=str(reply["ts"]), text="parent")
        assert len(slack.api.calls_to("chat.update")) == updates, "a deposed leader updated the parent"
        assert told and "epoch 1" in told[0]
    finally:
        await client.aclose()


async def test_a_lease_lapsed_while_connecting_sends_nothing(slack: SlackStandin) -> None:
    """The fence is asked again once the connection is held, just before the request is written
    (``bot.integrations.fenced``): the fencing e2e saw a leader stopped after the call's first
    check, while it connected, wake and send its ``chat.update``. Here the process passes the
    first check, then stalls (its clock reads past the lease from then on): nothing reaches Slack."""
    readings = iter([0.0])  # the call's first check; every later reading is after the stall
    fence = Fence("leader-a", monotonic=lambda: next(readings, 100.0))
    fence.grant(1, valid_until=10.0)
    client = FencedWebClient(fence, token=BOT_TOKEN, base_url=slack.base_url)
    calls = len(slack.api.calls)
    try:
        with pytest.raises(Deposed, match="may have lapsed"):
            await client.chat_update(channel=CHANNEL, ts="1700000000.000100", text="parent")
        assert len(slack.api.calls) == calls, "a deposed leader's request reached Slack"
    finally:
        await client.aclose()
    assert client.session is None


async def test_a_standby_sends_nothing(slack: SlackStandin) -> None:
    client = FencedWebClient(Fence("standby-b"), token=BOT_TOKEN, base_url=slack.base_url)
    calls = len(slack.api.calls)
    with pytest.raises(Deposed, match="standing by"):
        await client.chat_postMessage(channel=CHANNEL, text="hello")
    assert len(slack.api.calls) == calls


async def test_the_service_s_shutdown_closes_the_outbox_session(slack: SlackStandin, tmp_path: Path) -> None:
    async with SlackPitcrew(tmp_path / "p", slack, config={"mode": "auto"}) as pitcrew:
        await pitcrew.post_alerts(delivery(node="gpu-node-02"))
        await until(lambda: bool(slack.api.calls_to("chat.postMessage")), what="the outbox's first post")
        [client] = [
            o
            for o in gc.get_objects()
            if isinstance(o, FencedWebClient) and o.base_url.startswith(slack.base_url)
        ]
        session = client.session
        assert session is not None and not session.closed, "the outbox posts through a session of its own"
    assert session.closed and client.session is None
