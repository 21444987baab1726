"""Who may decide from Slack: the allowlist, the approver user group, and the two-approver rule.

Cases: a member of the approver group (not on the allowlist) may approve — the group is read with
``usergroups.users.list`` and cached; with ``second_approver_nodes: 1`` and another node already
under remediation, a first approval is only a vote (audited, shown in the thread), the same approver
again is told a different one is needed, and a second, different approver's click approves;
``/pitcrew pause`` by a non-approver is refused and audited, by an approver pauses, and ``resume``
lifts it; ``/pitcrew help`` lists the commands.
"""

from __future__ import annotations

from pathlib import Path

from bot.integrations.slack.messages import APPROVE
from proving_ground.slack.server import SlackStandin
from tests.harness.scenarios import delivery, gpu_node, inventory
from tests.slack.pitcrew_app import SlackPitcrew, click, until


async def test_group_members_and_a_second_approver(slack: SlackStandin, tmp_path: Path) -> None:
    slack.world.usergroups["S0APPROVERS"] = ["U0BOB"]
    config = {
        "mode": "approve",
        "approvals": {"approvers": ["alice"], "timeout": "10m"},
        "slack": {"approver_group": "S0APPROVERS", "second_approver_nodes": 1},
    }
    world = inventory(
        tmp_path / "inventory.yaml", {f"gpu-node-0{n}": gpu_node(f"ml/w{n}") for n in range(1, 7)}, []
    )
    async with SlackPitcrew(tmp_path / "p", slack, config=config, inventory=world) as pitcrew:
        first = (await pitcrew.post_alerts(delivery(node="gpu-node-02")))["opened"][0]
        second = (await pitcrew.post_alerts(delivery(node="gpu-node-03")))["opened"][0]
        for incident in (first, second):
            await pitcrew.wait_incident(incident, "awaiting_approval")

        # Two nodes would be under remediation, over the threshold of one: alice's click is a vote.
        await pitcrew.interact(click(APPROVE, first, "U0ALICE", "alice"))
        await until(lambda: len(slack.api.ephemeral) == 1, what="answer to alice")
        assert "second, different approver" in slack.api.ephemeral[-1]["text"]
        votes = await pitcrew.events(first, "approval_vote")
        assert [e["actor"] for e in votes] == ["slack:U0ALICE"]
        assert (await pitcrew.incident(first))["state"] == "awaiting_approval"
        await until(
            lambda: any("first approval" in m.text for m in pitcrew.thread(first)), what="vote in thread"
        )

        await pitcrew.interact(click(APPROVE, first, "U0ALICE", "alice"))
        await until(lambda: len(slack.api.ephemeral) == 2, what="second answer to alice")
        assert "You already approved" in slack.api.ephemeral[-1]["text"]
        assert not pitcrew.calls()

        # Bob is an approver through the user group only; his is the second, different approval.
        await pitcrew.interact(click(APPROVE, first, "U0BOB", "bob"))
        await until(lambda: ("cordon", "gpu-node-02") in pitcrew.calls(), what="approved playbook runs")
        assert [e["actor"] for e in await pitcrew.events(first, "approved")] == ["slack:U0BOB"]
        assert slack.api.calls_to("usergroups.users.list")

        # The kill switch from Slack: approvers only, audited either way.
        refused = await pitcrew.slash("pause storms", user="U0MALLORY", name="mallory")
        assert refused.startswith("Sorry <@U0MALLORY>")
        assert "paused" in await pitcrew.slash("pause maintenance window")
        assert "paused by slack:U0ALICE" in await pitcrew.slash("status")
        assert "resumed" in await pitcrew.slash("resume")
        assert "/pitcrew" in await pitcrew.slash("help")
        status, raw = await pitcrew.request(
            "GET", "/api/v1/status", headers={"Authorization": "Bearer test-admin-token"}
        )
        assert status == 200 and b'"paused": false' in raw
