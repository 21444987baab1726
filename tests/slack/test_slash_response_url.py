"""``/pitcrew`` answered where it was typed, also after the 2 s ack budget: through its response_url.

Cases: an approver of the user group (not on the allowlist) types ``/pitcrew pause`` in a DM with the
bot while ``usergroups.users.list`` takes 2.5 s: the ack says it is working on it, and the answer
reaches them through the command's response_url (the stand-in serves it); pitcrew is paused.
``/pitcrew resume`` then (group cached) is answered in the ack itself; ``/pitcrew status`` from the DM
too. No ``chat.postEphemeral`` is made: in a DM, or a channel without the bot, Slack refuses it
(``channel_not_found``), which is what happened before: the answer was lost.
(``status`` reads no user group, so the slow answer is shown with ``pause``, which does.)
"""

from __future__ import annotations

from pathlib import Path

from proving_ground.slack.server import SlackStandin
from tests.slack.pitcrew_app import SlackPitcrew

DM = ("D0ALICEBOT", "directmessage")


async def test_a_slow_answer_in_a_dm_goes_through_response_url(slack: SlackStandin, tmp_path: Path) -> None:
    config = {"mode": "observe", "slack": {"approvers": [], "approver_group": "S0APPROVERS"}}
    slack.api.slow("usergroups.users.list", 2.5)
    async with SlackPitcrew(tmp_path / "p", slack, transport="http", config=config) as pitcrew:
        answer = await pitcrew.slash("pause maintenance", channel=DM)
        assert "paused" in answer, answer
        [sent] = slack.responses.answered
        assert (sent["user"], sent["channel"], sent["response_type"]) == ("U0ALICE", DM[0], "ephemeral")
        assert sent["text"] == answer
        assert "paused" in await pitcrew.slash("status", channel=DM)
        assert "resumed" in await pitcrew.slash("resume", channel=DM)
        assert len(slack.responses.answered) == 1  # the later ones were fast enough for the ack
    assert not slack.api.calls_to("chat.postEphemeral")
