"""A parent message deleted in Slack mid-incident: the incident's thread continues under a new one.

Cases: an incident in auto mode posts its parent; a person deletes it (the stand-in then answers
``chat.update`` with ``message_not_found`` and ``conversations.replies`` with ``thread_not_found``,
as Slack does); the incident goes on to its end. The outbox drains (nothing left pending, no
notice refused), a new parent says the earlier message was deleted and carries the incident's
current state, no reply stands alone at the channel's top level (Slack takes a reply to a deleted
parent there, without an error; pitcrew deletes such replies once it finds the parent gone), the summary reaches the channel as a broadcast reply of the new parent, later
replies are in its thread, and the read API's Slack link is the new parent's permalink. The new
parent is posted once. Failed before: both answers were retried forever and every later notice of
the incident, summary included, stayed pending. The same for a storm digest deleted in Slack: the
next write posts it again instead of retrying forever.
"""

from __future__ import annotations

from pathlib import Path

from proving_ground.slack.server import SlackStandin
from tests.slack.pitcrew_app import CHANNEL, assert_carried_on, parent_closed_midway, storm_digest_closed


async def test_a_deleted_parent_is_replaced_and_the_thread_goes_on(
    slack: SlackStandin, tmp_path: Path
) -> None:
    # A person deletes it, mid-incident.
    old, done = await parent_closed_midway(slack, tmp_path, lambda ts: slack.api.delete(CHANNEL, ts))

    tops = [m for m in slack.api.channel_view(CHANNEL) if m.thread_ts is None]
    assert len(tops) == 1, [m.text for m in tops]  # the new parent, posted once
    new = tops[0]
    assert new.ts != old.ts and new.metadata is not None
    assert new.metadata["event_payload"]["replaces"] == old.ts
    assert "earlier message was deleted" in repr(new.blocks)
    assert_carried_on(slack, new, done, "message_not_found")


async def test_a_deleted_digest_is_posted_again(slack: SlackStandin, tmp_path: Path) -> None:
    first, digests = await storm_digest_closed(slack, tmp_path, lambda ts: slack.api.delete(CHANNEL, ts))
    assert len(digests) == 1 and digests[0].ts != first and "12 nodes" in digests[0].text
