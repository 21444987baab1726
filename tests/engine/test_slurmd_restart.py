"""After a reboot or a same-name replacement, ``wait_ready`` waits for a new slurmd, under every node
mapping, without comparing pitcrew's clock with Slurm's; in virtual time.

A reboot (or a new machine serving the same Slurm node name, as a replacement does under
``identity``, where slurm.conf lists the NodeName) ends the node's slurmd. slurmctld keeps answering
for the old one until it finds it gone (its pings, ``SlurmdTimeout``, 300 s by default), so "not
NOT_RESPONDING" holds while no new slurmd has registered. A RESUME then returns the node early, and
the rebooted slurmd registering afterwards has a boot time later than the node's last response:
slurmctld sets a node that is not DOWN to DOWN "Node unexpectedly rebooted" (src/slurmctld/
node_mgr.c ``validate_node_specs``), kept under ``ReturnToService`` 0 or 1. pitcrew's DOWN still in
place when the slurmd registers is what makes the order safe: it waits for Slurm to report a
``SlurmdStartTime`` other than the one it read before the repair was issued.

That is a comparison of Slurm's clock with itself: a pitcrew host whose clock runs ahead of
slurmctld's (the ``skew`` row) neither holds the wait forever nor ends it early, as a comparison
with the time pitcrew issued the repair did.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from bot.domain.jobs import SlurmNodeState
from tests.engine.harness import Call, DaemonSetNodeSet, EngineHarness, FakeTime, fleet
from tests.harness.scenarios import gpu_node

NODE = "gpu-node-02"
REBOOT = {"79": {"playbook": "reboot-node"}}  # the catalog override selecting the reboot
RESTART_AFTER = 600.0  # seconds after the repair reaches the node that its new slurmd registers


class Slurmd:
    """The node's slurmd as Slurm reports it: the one from before the repair until ``after`` virtual
    seconds past the repair's call (the reboot, or the replacement), then one started then, its
    start time in slurmctld's clock, ``behind`` seconds behind pitcrew's."""

    def __init__(self, h: EngineHarness, *, after: float, behind: float = 0.0) -> None:
        self.time, self.after, self.behind = h.time, after, behind
        self.old = h.time.now() - timedelta(days=3)
        self.repaired_at: datetime | None = None

    async def repair(self, time: FakeTime, call: Call) -> Any:
        """The cluster's reboot or replace call: the slurmd ends with it."""
        self.repaired_at = self.repaired_at or time.now()
        return await call()

    async def node(self, time: FakeTime, call: Call) -> Any:
        state: SlurmNodeState = await call()
        started = self.old
        if self.repaired_at is not None and time.now() >= self.repaired_at + timedelta(seconds=self.after):
            started = self.repaired_at + timedelta(seconds=self.after - self.behind)
        return replace(state, slurmd_started_at=started)


@pytest.mark.parametrize(
    ("mapping", "playbook"),
    [
        ("identity", REBOOT),
        ("identity", {}),  # replace-node: the new machine serves the same Slurm node name
        ("label", REBOOT),
        ("annotation", REBOOT),
    ],
    ids=["identity-reboot", "identity-replacement", "label-reboot", "annotation-reboot"],
)
async def test_the_slurm_node_is_resumed_only_once_a_new_slurmd_has_registered(
    tmp_path: Path, mapping: str, playbook: dict[str, Any]
) -> None:
    keys = {"node_mapping": mapping} | ({} if mapping == "identity" else {"node_mapping_key": "slurm-node"})
    # Under label or annotation the node names its Slurm node (the same name here).
    node = gpu_node(f"ml-train/{NODE}-worker")
    if mapping != "identity":
        node[f"{mapping}s"] = {"slurm-node": NODE}
    inventory = fleet(extra={NODE: node})
    async with EngineHarness(tmp_path, mapping=keys, catalog=playbook, inventory=inventory) as h:
        slurmd = Slurmd(h, after=RESTART_AFTER)
        h.cluster.always("reboot" if playbook else "replace", slurmd.repair)
        h.scheduler.always("node", slurmd.node)
        incident = await h.alert(NODE)
        done = await h.until_ended(incident)
        assert done.state.value == "resolved", await h.timeline(incident)
        assert slurmd.repaired_at is not None
        waits = [e.detail for e in await h.events(incident, "step_waiting", "wait_ready")]
        what = "reboot" if playbook else "replacement"
        assert f"slurmd on {NODE} has not registered again since the {what}" in waits, waits
        [resumed] = [r for r in h.records() if r.get("op") == "slurm_resume"]
        finished = (await h.events(incident, "step_finished", "wait_ready"))[-1]
        assert finished.at >= slurmd.repaired_at + timedelta(seconds=RESTART_AFTER), resumed


async def test_a_pitcrew_clock_ahead_of_slurmctlds_neither_holds_nor_ends_the_wait(tmp_path: Path) -> None:
    """slurm-operator's slurmd pod is back 2 s after the reboot reached the node; slurmctld's clock
    is 5 s behind pitcrew's, so the new start time reads 3 s before pitcrew issued the reboot. A
    comparison with that time never ended; the start time having changed does end it."""
    async with EngineHarness(
        tmp_path, cluster=DaemonSetNodeSet, mapping={"node_mapping": "slinky"}, catalog=REBOOT
    ) as h:
        slurmd = Slurmd(h, after=2.0, behind=5.0)
        h.cluster.always("reboot", slurmd.repair)
        h.scheduler.always("node", slurmd.node)
        incident = await h.alert(NODE)
        done = await h.until_ended(incident)
        assert done.state.value == "resolved", await h.timeline(incident)
        finished = (await h.events(incident, "step_finished", "wait_ready"))[-1]
        assert slurmd.repaired_at is not None
        assert finished.at - slurmd.repaired_at < timedelta(minutes=5), await h.timeline(incident)
        assert len([r for r in h.records() if r.get("op") == "slurm_resume"]) == 1, await h.timeline(incident)
