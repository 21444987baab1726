"""Edits stay within ``chat.update``'s rate tier: paced and coalesced, never a 429.

``chat.update`` is Tier 3, about 50 calls a minute per workspace (the stand-in holds it to 50 in
any 60 s and answers the next one 429 with ``Retry-After``). Cases: a storm that lasts more than a
minute — a node every 0.8 s for 65 s, observe mode — so the digest would be edited once a second
for longer than the tier allows, beside the threads of the incidents that opened before it was a
storm. Every notice is delivered, the digest names every node, and no ``chat.update`` was answered
429 (pitcrew kept its edits under the tier; the ones it skipped were shown by the next). Failed
before: the digest's once-a-second edits drew 429s.
"""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path

from proving_ground.slack.server import SlackStandin
from tests.harness.scenarios import delivery, gpu_node, inventory
from tests.slack.pitcrew_app import CHANNEL, SlackPitcrew, until

NODES = [f"gpu-{n:03d}" for n in range(1, 82)]


async def test_a_long_storm_stays_within_the_tier(slack: SlackStandin, tmp_path: Path) -> None:
    world = inventory(tmp_path / "inventory.yaml", {n: gpu_node(f"ml/{n}") for n in NODES}, [])
    config = {
        "mode": "observe",
        "guards": {"breaker": {"max_nodes": 100, "max_fraction": 1.0}},
        "slack": {"digest_threshold": 5, "digest_window": "2m"},
    }
    async with SlackPitcrew(tmp_path / "p", slack, config=config, inventory=world) as pitcrew:
        for node in NODES:
            await pitcrew.post_alerts(delivery(node=node))
            await asyncio.sleep(0.8)  # the storm's pace: alerts arriving over 65 s
        db = pitcrew.workdir / "pitcrew.db"

        def drained() -> bool:
            with sqlite3.connect(db) as conn:
                return bool(
                    conn.execute("SELECT COUNT(*) FROM outbox WHERE delivered_at IS NULL").fetchone()[0] == 0
                )

        await until(drained, timeout=180, what="every notice delivered")
        await pitcrew.quiet(2.0, timeout=120)

    updates = slack.api.calls_to("chat.update")
    refused = [c for c in updates if c.status == 429]
    assert not refused, f"{len(refused)} of {len(updates)} edits answered 429"
    digest = next(m for m in slack.api.channel_view(CHANNEL) if "storm" in m.text)
    assert f"{len(NODES)} nodes" in digest.text, digest.text
