"""A 200-node storm in observe mode: one digest message, updated as nodes join, not 200 threads.

Cases: 200 XID 79 deliveries for 200 nodes within seconds; once the outbox has caught up the
channel shows at most a handful of messages (the first few incidents' threads, opened before the
storm was a storm, and one digest); the digest names all 200 nodes' count and the fault, was
updated in place (chat.update) rather than re-posted, and every post kept to Slack's rate of about
one message per second per channel (the stand-in enforces it strictly here), and the digest's
edits kept within chat.update's tier: no 429. In auto mode with a
breaker of three nodes, the breaker's notice is one top-level message and the digest lists the
nodes it held back.
"""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path

import pytest

from proving_ground.slack.server import SlackStandin
from tests.harness.scenarios import delivery, gpu_node, inventory
from tests.slack.pitcrew_app import CHANNEL, SlackPitcrew, until

NODES = [f"gpu-{n:03d}" for n in range(1, 201)]


def _settled(db: Path) -> bool:
    """Every incident notice is in the outbox, and the outbox is delivered."""
    with sqlite3.connect(db) as conn:
        notices = conn.execute("SELECT COUNT(*) FROM outbox WHERE kind = 'incident'").fetchone()[0]
        pending = conn.execute("SELECT COUNT(*) FROM outbox WHERE delivered_at IS NULL").fetchone()[0]
    return bool(notices == len(NODES) and pending == 0)


# A limit of its own, above the suite's 180 s: 27 s alone on a slow machine, and 131 s there under
# the suite's six workers (the notices wait on Slack's rates and on a loaded pitcrew and stand-in),
# which failed the 120 s it waited for them before.
@pytest.mark.timeout(330)
async def test_a_storm_is_one_digest(slack: SlackStandin, tmp_path: Path) -> None:
    world = inventory(tmp_path / "inventory.yaml", {n: gpu_node(f"ml/{n}") for n in NODES}, [])
    config = {
        "mode": "observe",
        "guards": {"breaker": {"max_nodes": 250, "max_fraction": 1.0}},
        "slack": {"digest_threshold": 5, "digest_window": "2m"},
    }
    slack.api.post_interval = 1.0  # Slack's one message per second per channel, strictly
    async with SlackPitcrew(tmp_path / "p", slack, config=config, inventory=world) as pitcrew:
        answers = await asyncio.gather(*(pitcrew.post_alerts(delivery(node=n)) for n in NODES))
        assert sum(len(a["opened"]) for a in answers) == len(NODES)
        db = pitcrew.workdir / "pitcrew.db"
        await until(lambda: _settled(db), timeout=270, what="every notice delivered")

        channel = slack.api.channel_view(CHANNEL)
        digests = [m for m in channel if "storm" in m.text]
        assert len(digests) == 1, [m.text for m in channel]
        assert len(channel) <= 6, [m.text for m in channel]
        digest = digests[0]
        assert "200 nodes" in digest.text and "(mode observe)" in digest.text
        assert "XID 79" in repr(digest.blocks)
        assert digest.updates, "the digest was never updated in place"
        # chat.update is Tier 3 (about 50 a minute; the stand-in enforces it): the digest and the
        # parents stay under it by coalescing, and never draw a 429 (before: 1 a second, and 429s).
        updates = slack.api.calls_to("chat.update")
        assert not [c for c in updates if c.status == 429], f"{len(updates)} updates"
        posts = [c for c in slack.api.calls_to("chat.postMessage") if c.status == 200]
        assert len(posts) == len(slack.api.messages)  # each message posted once, 429s retried
        assert len([m for m in slack.api.messages if m.thread_ts is None]) <= 6


async def test_the_digest_shows_what_the_breaker_held_back(slack: SlackStandin, tmp_path: Path) -> None:
    nodes = NODES[:15]
    world = inventory(tmp_path / "inventory.yaml", {n: gpu_node(f"ml/{n}") for n in nodes}, [])
    config = {
        "mode": "auto",
        "guards": {"breaker": {"max_nodes": 3, "max_fraction": 1.0}},
        "slack": {"digest_threshold": 5, "digest_window": "2m"},
    }
    async with SlackPitcrew(tmp_path / "p", slack, config=config, inventory=world) as pitcrew:
        for node in nodes:  # one after the other: the breaker lets the first three through
            await pitcrew.post_alerts(delivery(node=node))
        db = pitcrew.workdir / "pitcrew.db"

        def settled() -> bool:
            with sqlite3.connect(db) as conn:
                pending = conn.execute("SELECT COUNT(*) FROM outbox WHERE delivered_at IS NULL").fetchone()[0]
                open_ = conn.execute(
                    "SELECT COUNT(*) FROM incidents WHERE state NOT IN ('resolved','failed','rolled_back','suppressed')"
                ).fetchone()[0]
            return bool(pending == 0 and open_ == 0)

        await until(settled, timeout=120, what="every incident ended and told")
        channel = slack.api.channel_view(CHANNEL)
        breaker = [m for m in channel if "circuit breaker opened" in m.text]
        assert len(breaker) == 1 and breaker[0].thread_ts is None
        digest = next(m for m in channel if "storm" in m.text)
        held = next(b for b in digest.blocks if "held back" in repr(b))
        assert repr(held).count("gpu-") >= 10, held  # the twelve the breaker stopped (at most 30 listed)
