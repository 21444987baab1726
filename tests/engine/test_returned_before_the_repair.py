"""A node pitcrew took out of Slurm, put back in service by someone else before its repair was
confirmed, in virtual time.

While ``wait_ready`` waits (a replacement not yet Ready), a person's ``scontrol update
State=RESUME``, or Slurm itself (``SlurmctldParameters=idle_on_node_suspend`` clears DOWN and DRAIN
as power saving suspends the node, ``power_save.c``; ``scontrol reboot nextstate=RESUME`` or
``ASAP`` clears DRAIN once it rebooted), puts the Slurm node back in service: jobs may land on it
before its repair is confirmed. pitcrew does not take it out again over that hand, but says so
once, in the timeline and to humans, looking at most every ``LOOK_AGAIN`` seconds; the repair goes
on and the incident resolves. A node still out is never said to be back; a replacement whose
Slurm nodes are read from the node (a record maybe left behind) is not looked at.
"""

from __future__ import annotations

import functools
from pathlib import Path

from bot.domain.nodemap import SLINKY_HOSTNAME_OVERRIDE
from bot.engine.errors import Reason, TransientError
from bot.engine.steps.repair import LOOK_AGAIN
from tests.engine.harness import Answer, DaemonSetNodeSet, EngineHarness

NODE = "gpu-node-02"


async def _waiting(h: EngineHarness, incident: str) -> None:
    async def waiting() -> bool:
        return bool(await h.events(incident, "step_waiting", "wait_ready"))

    await h.run_until(waiting, about=incident)


async def test_a_node_put_back_by_someone_else_is_told_once_and_the_repair_goes_on(tmp_path: Path) -> None:
    async with EngineHarness(tmp_path) as h:
        h.cluster.always("successor", Answer(lambda _: None))  # the replacement is slow to come
        incident = await h.alert(NODE)
        await _waiting(h, incident)
        await h.world.write("slurm_resume", node=NODE)  # a person, straight to Slurm
        await h.run_until(
            lambda: bool(h.notices("returned_early", incident)), LOOK_AGAIN + 60, about=incident
        )
        [notice] = h.notices("returned_early", incident)
        assert NODE in notice["title"] and notice["severity"] == "warning"
        assert any("State=DRAIN" in line for line in notice["lines"]), notice["lines"]
        [told] = [e for e in await h.events(incident, "notice") if e.outcome == "returned_early"]
        assert NODE in told.detail
        [said] = await h.events(incident, "returned_early")
        assert NODE in said.detail and "IDLE" in said.detail
        await h.time.advance(10 * LOOK_AGAIN)
        assert len(h.notices("returned_early", incident)) == 1
        assert len(await h.events(incident, "returned_early")) == 1
        h.cluster.always("successor", None)
        done = await h.until_ended(incident)
        assert done.state.value == "resolved", await h.timeline(incident)


async def test_a_node_still_out_is_not_said_to_be_back(tmp_path: Path) -> None:
    async with EngineHarness(tmp_path) as h:
        h.cluster.always("successor", Answer(lambda _: None))
        incident = await h.alert(NODE)
        await _waiting(h, incident)
        await h.time.advance(10 * LOOK_AGAIN)
        assert not h.notices("returned_early", incident)
        assert not await h.events(incident, "returned_early")


async def test_a_record_a_replacement_may_leave_behind_is_not_looked_at(tmp_path: Path) -> None:
    mapping = {"node_mapping": "annotation", "node_mapping_key": SLINKY_HOSTNAME_OVERRIDE}
    cluster = functools.partial(DaemonSetNodeSet, annotated=True)
    async with EngineHarness(tmp_path, cluster=cluster, mapping=mapping) as h:
        h.cluster.always("successor", Answer(lambda _: None))
        incident = await h.alert(NODE)
        await _waiting(h, incident)
        looks = h.scheduler.calls["node"]
        await h.world.write("slurm_resume", node=NODE)  # a ghost: its slurmd went with the old machine
        await h.time.advance(10 * LOOK_AGAIN)
        assert not h.notices("returned_early", incident)
        assert h.scheduler.calls["node"] == looks


async def test_a_look_slurm_does_not_answer_is_waited_out(tmp_path: Path) -> None:
    async with EngineHarness(tmp_path) as h:
        h.cluster.always("successor", Answer(lambda _: None))
        incident = await h.alert(NODE)
        await _waiting(h, incident)

        def unreachable(_: object) -> object:
            raise TransientError("slurmctld gave no answer", reason=Reason.TIMEOUT)

        h.scheduler.always("node", Answer(unreachable))
        await h.time.advance(10 * LOOK_AGAIN)
        assert h.scheduler.calls["node"] > 0
        steps = await h.steps(incident)
        assert steps["wait_ready"].attempts == 1, await h.timeline(incident)
        h.scheduler.always("node", None)
        h.cluster.always("successor", None)
        assert (await h.until_ended(incident)).state.value == "resolved", await h.timeline(incident)
