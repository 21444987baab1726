"""A click and a slash command while pitcrew's Postgres is away (restarting, failing over).

The click is acknowledged before anything is decided (Slack's 3 s), so Slack shows nothing else: the
person is told, in an ephemeral answer, that nothing was confirmed and to try again; so is
``/pitcrew approve``. Before, the click went unanswered (the store's error ended in bolt's log) and
the command failed in Slack with Slack's own error. Once Postgres is back, the same click approves,
once (after ``/readyz`` says the store is back). Against a real Postgres cluster of the test's own, stopped and started under pitcrew.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from bot.integrations.slack.inbound import STORE_AWAY
from bot.integrations.slack.messages import APPROVE
from proving_ground.slack.server import SlackStandin
from tests.harness.postgres import running_postgres
from tests.harness.scenarios import delivery, gpu_node, inventory
from tests.slack.pitcrew_app import SlackPitcrew, click, until


async def test_a_click_and_a_command_while_postgres_is_away_are_answered(
    slack: SlackStandin, tmp_path: Path
) -> None:
    with running_postgres() as server:
        name = server.create_database()
        store = {
            "url": server.url(name),
            "password_file": str(server.password_file(tmp_path / "pg-password")),
        }
        config = {"mode": "approve", "approvals": {"approvers": ["alice"], "timeout": "10m"}, "store": store}
        world = inventory(tmp_path / "inventory.yaml", {"gpu-node-02": gpu_node("ml/w2")}, [])
        async with SlackPitcrew(tmp_path / "p", slack, config=config, inventory=world) as pitcrew:
            incident = (await pitcrew.post_alerts(delivery(node="gpu-node-02")))["opened"][0]
            await pitcrew.wait_incident(incident, "awaiting_approval")
            await pitcrew.quiet()

            await asyncio.to_thread(server.stop)
            assert await pitcrew.interact(click(APPROVE, incident, "U0ALICE", "alice")) == 200
            await until(lambda: len(slack.api.ephemeral) == 1, what="answer to alice")
            assert slack.api.ephemeral[-1]["text"] == STORE_AWAY
            assert await pitcrew.slash(f"approve {incident}") == STORE_AWAY

            await asyncio.to_thread(server.start)
            # Back for pitcrew once it says so: the first use after a restart may still meet a
            # connection the restart ended (and is answered as above), as a person retrying would.
            async with asyncio.timeout(60):
                while (await pitcrew.request("GET", "/readyz"))[0] != 200:
                    await asyncio.sleep(0.2)
            answered = len(slack.api.ephemeral)
            assert await pitcrew.interact(click(APPROVE, incident, "U0ALICE", "alice")) == 200
            await until(lambda: len(slack.api.ephemeral) > answered, what="answer once Postgres is back")
            assert slack.api.ephemeral[-1]["text"] == f"{incident} approved by slack:U0ALICE"
            [approved] = await pitcrew.events(incident, "approved")
            assert approved["actor"] == "slack:U0ALICE"
