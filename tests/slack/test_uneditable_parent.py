"""A parent message Slack no longer lets pitcrew edit: the incident's thread continues under a new one.

Cases: an incident in auto mode posts its parent; the workspace's edit window (an admin's setting,
"any time, never, or up to a certain timeframe") closes on it mid-incident, so ``chat.update``
answers ``edit_window_closed``, as Slack does; the incident goes on to its end. The outbox drains
(nothing left pending, no notice refused), a new parent says the earlier message can no longer be
edited (not that it was deleted) and carries the incident's current state, the summary reaches the
channel as a broadcast reply of the new parent, later replies are in its thread, the earlier
parent and its replies stay as they were, and the read API's Slack link is the new parent's
permalink. The new parent is posted once. Failed before: ``edit_window_closed`` was retried
forever and every later notice of the incident, summary included, stayed pending. The same for a
storm digest past the window: the next write posts it again instead of retrying forever.
"""

from __future__ import annotations

from pathlib import Path

from proving_ground.slack.server import SlackStandin
from tests.harness.scenarios import delivery, gpu_node, inventory
from tests.slack.pitcrew_app import (
    CHANNEL,
    SlackPitcrew,
    assert_carried_on,
    parent_closed_midway,
    storm_digest_closed,
    to_the_end,
    update_refusals,
)

#: Slack's shortest edit window but "never": one minute after sending (an admin's choice).
WINDOW = 60.0


async def test_a_parent_past_the_edit_window_is_replaced_and_the_thread_goes_on(
    slack: SlackStandin, tmp_path: Path
) -> None:
    def close(ts: str) -> None:
        # The window closes on the parent mid-incident: an admin sets one, and the parent is older.
        slack.world.edit_window = WINDOW
        slack.api.backdate(CHANNEL, ts, 2 * WINDOW)

    old, done = await parent_closed_midway(slack, tmp_path, close)

    tops = [m for m in slack.api.channel_view(CHANNEL) if m.thread_ts is None]
    assert [m.ts for m in tops[:1]] == [old.ts] and len(tops) == 2, [m.text for m in tops]  # posted once
    new = tops[1]
    assert new.metadata is not None and new.metadata["event_payload"]["replaces"] == old.ts
    assert "can no longer be edited" in repr(new.blocks) and "deleted" not in repr(new.blocks)
    assert "resolved" not in repr(old.blocks)  # the earlier parent stays as Slack last took it
    posted = [
        m.metadata["event_payload"]["outbox_id"] for m in slack.api.messages if m.thread_ts and m.metadata
    ]
    assert len(posted) == len(set(posted))  # each reply once: none posted again under the new parent
    assert not slack.api.deleted  # nothing was withdrawn: the earlier parent is still there
    assert_carried_on(slack, new, done, "edit_window_closed")


async def test_a_digest_past_the_edit_window_is_posted_again(slack: SlackStandin, tmp_path: Path) -> None:
    def close(ts: str) -> None:
        slack.world.edit_window = WINDOW
        slack.api.backdate(CHANNEL, ts, 2 * WINDOW)

    first, digests = await storm_digest_closed(slack, tmp_path, close)
    assert [m.ts for m in digests[:1]] == [first] and len(digests) == 2, [m.text for m in digests]
    assert "12 nodes" in digests[1].text


async def test_a_workspace_that_allows_no_edits_gets_one_new_parent_not_one_a_notice(
    slack: SlackStandin, tmp_path: Path
) -> None:
    """An admin may set the edit window to "never": the new parent cannot be edited either. It is
    replaced once; after that the incident's notices go on as replies under it and pitcrew stops
    asking to edit it, rather than posting a new parent with every notice."""
    slack.world.edit_window = 0.0
    world = inventory(tmp_path / "inventory.yaml", {"gpu-node-02": gpu_node("ml-train/worker-2")}, [])
    async with SlackPitcrew(
        tmp_path / "p", slack, config={"mode": "auto"}, inventory=world, replace_seconds=2
    ) as pitcrew:
        incident = (await pitcrew.post_alerts(delivery(node="gpu-node-02")))["opened"][0]
        done = await to_the_end(pitcrew, incident)

    assert not [e for e in done["events"] if e["kind"] == "notice_failed"]
    tops = [m for m in slack.api.channel_view(CHANNEL) if m.thread_ts is None]
    assert len(tops) == 2, [m.text for m in tops]  # the first parent and one that continues it
    summary = [m for m in slack.api.channel_view(CHANNEL) if m.reply_broadcast]
    assert len(summary) == 1 and summary[0].thread_ts == tops[1].ts and "finished" in summary[0].text
    assert any("wait_ready" in m.text for m in slack.api.thread(CHANNEL, tops[1].ts)[1:])
    assert update_refusals(slack, "edit_window_closed") == 2  # once for each parent, then never again
