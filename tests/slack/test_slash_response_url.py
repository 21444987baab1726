"""``/pitcrew`` answered where it was typed, also after the 2 s ack budget: through its response_url.

Cases: an approver through the user group (not on the allowlist) types ``/pitcrew status`` in a DM
with the bot while ``usergroups.users.list`` takes 2.5 s (status says whether the caller may
decide, which needs the group): the ack says it is working on it, and the answer reaches them
through the command's response_url (the stand-in serves it). ``/pitcrew pause`` then (the group
cached) is answered in the ack itself; a first ``/pitcrew pause`` from the DM, slow the same way,
is answered through response_url too. No ``chat.postEphemeral`` is made: in a DM, or a channel
without the bot, Slack refuses it (``channel_not_found``), which is what happened before: the
answer was lost. A click by that approver while the group lookup takes 4 s is still acked within
Slack's 3 s (pitcrew acks before it decides; a slow ack fails ``SlackPitcrew.interact``).
"""

from __future__ import annotations

from pathlib import Path

from bot.integrations.slack.messages import REJECT
from proving_ground.slack.server import SlackStandin
from tests.slack.pitcrew_app import SlackPitcrew, click, until

DM = ("D0ALICEBOT", "directmessage")
GROUP = {"mode": "observe", "slack": {"approvers": [], "approver_group": "S0APPROVERS"}}


async def test_a_slow_answer_in_a_dm_goes_through_response_url(slack: SlackStandin, tmp_path: Path) -> None:
    slack.api.slow("usergroups.users.list", 2.5)
    async with SlackPitcrew(tmp_path / "p", slack, transport="http", config=GROUP) as pitcrew:
        answer = await pitcrew.slash("status", channel=DM)
        assert "mode *observe*" in answer and "you may decide" in answer, answer
        [sent] = slack.responses.answered
        assert (sent["user"], sent["channel"], sent["response_type"]) == ("U0ALICE", DM[0], "ephemeral")
        assert sent["text"] == answer
        assert "paused" in await pitcrew.slash("pause maintenance", channel=DM)
        assert len(slack.responses.answered) == 1  # the group is cached now: answered in the ack
    assert not slack.api.calls_to("chat.postEphemeral")


async def test_the_ack_budget_counts_from_the_request_s_arrival(slack: SlackStandin, tmp_path: Path) -> None:
    """Bolt's 3 s count from the dispatch, its middleware included (``auth.test``, on the first
    request): a budget counted from the listener's start acked after 3.5 s here, and bolt answered
    404 in its place."""
    async with SlackPitcrew(tmp_path / "p", slack, transport="http", config=GROUP) as pitcrew:
        slack.api.slow("auth.test", 1.5)
        slack.api.slow("usergroups.users.list", 2.5)
        answer = await pitcrew.slash("status", channel=DM)
        assert "mode *observe*" in answer and "you may decide" in answer, answer
        assert [a["text"] for a in slack.responses.answered] == [answer]


async def test_a_slow_pause_from_a_dm_is_answered_there(slack: SlackStandin, tmp_path: Path) -> None:
    slack.api.slow("usergroups.users.list", 2.5)
    async with SlackPitcrew(tmp_path / "p", slack, transport="http", config=GROUP) as pitcrew:
        answer = await pitcrew.slash("pause maintenance", channel=DM)
        assert "paused" in answer, answer
        assert [a["text"] for a in slack.responses.answered] == [answer]
    assert not slack.api.calls_to("chat.postEphemeral")


async def test_a_click_is_acked_before_a_slow_decision(slack: SlackStandin, tmp_path: Path) -> None:
    slack.api.slow("usergroups.users.list", 4.0)
    async with SlackPitcrew(tmp_path / "p", slack, transport="http", config=GROUP) as pitcrew:
        assert await pitcrew.interact(click(REJECT, "pc-none", "U0ALICE", "alice")) == 200
        await until(lambda: bool(slack.api.ephemeral), what="the answer to the click")
