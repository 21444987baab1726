"""A node pitcrew took out of Slurm, put back in service by someone else before its repair was
confirmed, in virtual time.

While a step waits with the node out by pitcrew's hand (``drain`` for the job at the fault,
``replace`` refusing while work remains, ``wait_ready`` for a replacement not yet Ready), a person's
``scontrol update State=RESUME``, or Slurm itself (``SlurmctldParameters=idle_on_node_suspend``
clears DOWN and DRAIN as power saving suspends the node, ``power_save.c``; ``scontrol reboot
nextstate=RESUME`` or ``ASAP`` clears DRAIN once it rebooted), puts the Slurm node back in service:
jobs may land on it before its repair is confirmed. pitcrew does not take it out again over that
hand, but says so once per incident, whichever step sees it first (``bot.engine.steps.put_back``),
in the timeline and to humans, looking at most every ``LOOK_AGAIN`` seconds; the repair goes on and
the incident resolves. A job slurmctld started there meanwhile is not pitcrew's: the drain does not
requeue it, nor repair the node under it, but waits for it to leave; the replacement does not start
under it. A node still out is never said to be back; a replacement whose Slurm nodes are read from
the node (a record maybe left behind) is not looked at.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

from bot.domain.nodemap import SLINKY_HOSTNAME_OVERRIDE
from bot.engine.errors import Reason, TransientError
from bot.engine.steps.put_back import LOOK_AGAIN
from tests.engine.harness import Answer, Call, DaemonSetNodeSet, EngineHarness, FakeTime, fleet
from tests.harness.scenarios import fault_delivery

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


# ------------------------------------------------------------ put back while the drain waits for a job
GRACE = 600
#: Running on the node at the fault: pitcrew recorded it before its DRAIN, and requeues it after GRACE.
AT_FAULT = {"job_id": "101", "name": "llm-pretrain", "user": "dana", "node": NODE}


async def _state_of(h: EngineHarness, job_id: str) -> str | None:
    job = await h.world.job(job_id)
    return job.state if job is not None else None


def _reset_gpu() -> dict[str, Any]:
    drain = {"step": "drain", "timeout": "30m", "options": {"slurm_drain_grace_seconds": GRACE}}
    return {
        "reset-gpu": {
            "steps": [
                "notify",
                "slurm_down",
                "cordon",
                drain,
                "reset_gpu",
                "wait_ready",
                "slurm_resume",
                "close",
            ]
        }
    }


async def test_a_node_put_back_while_the_drain_waits_is_told_once_and_its_new_job_waited_for(
    tmp_path: Path,
) -> None:
    """The drain waits for the job at the fault (DRAIN lets it run out its grace); meanwhile a person
    RESUMEs the Slurm node, and slurmctld starts another user's job there. pitcrew says so once (the
    same notice ``wait_ready`` gives, not again there), requeues the job at the fault as before, and
    neither requeues the newcomer nor resets the GPU under it: the drain waits for it to leave."""
    async with EngineHarness(
        tmp_path, inventory=fleet(jobs=(AT_FAULT,)), playbooks=_reset_gpu(), outbox=["slack"]
    ) as h:
        body = fault_delivery(
            "row-remap-pending", alertname="GpuRowRemapPending", node=NODE, starts=h.time.now()
        )
        incident = await h.opens(body)  # a pending row remap: reset-gpu DRAINs and lets the job run

        async def draining() -> bool:
            return bool(await h.events(incident, "step_waiting", "drain"))

        await h.run_until(draining, about=incident)
        await h.world.start_job("200", NODE)  # DRAIN keeps it off the node: it pends
        assert await _state_of(h, "200") == "PENDING"
        await h.world.write("slurm_resume", node=NODE)  # a person, straight to Slurm
        await h.world.start_job("201", NODE, name="eval", user="fay")  # slurmctld fills it
        assert [j.job_id for j in await h.world.jobs_on_node(NODE)] == ["101", "201"]
        await h.run_until(
            lambda: bool(h.notices("returned_early", incident)), LOOK_AGAIN + 60, about=incident
        )
        [notice] = h.notices("returned_early", incident)
        text = " ".join(notice["lines"])
        assert "State=DRAIN" in text and "not requeue" in text, text
        assert (await h.steps(incident))["drain"].status == "running"

        await h.time.advance(GRACE + 120)  # the grace ends: the job at the fault is requeued, not 201
        assert [r["job_id"] for r in h.records() if r.get("op") == "requeue"] == ["101"]
        assert await _state_of(h, "201") == "RUNNING"
        assert h.calls()[("reset_gpu", NODE)] == 0 and not [r for r in h.records() if r.get("op") == "evict"]
        [waiting, *_] = reversed(await h.events(incident, "step_waiting", "drain"))
        assert "201" in waiting.detail and "fay" in waiting.detail, waiting.detail

        await h.world.end_job("201", "COMPLETED")
        done = await h.until_ended(incident)
        assert done.state.value == "resolved", await h.timeline(incident)
        assert h.calls()[("reset_gpu", NODE)] == 1
        assert len(h.notices("returned_early", incident)) == 1  # wait_ready does not say it again
        await h.told_once(incident, "returned_early")
        assert len(await h.events(incident, "returned_early")) == 1


class _PutBackAndFilled:
    """While pitcrew asks whether the replacement started, a person RESUMEs the Slurm node and
    slurmctld starts a user's job there: between the drain's end and the replacement's call."""

    def __init__(self, h: EngineHarness) -> None:
        self._h = h

    async def __call__(self, time: FakeTime, call: Call) -> Any:
        await self._h.world.write("slurm_resume", node=NODE)
        await self._h.world.start_job("301", NODE, name="notebook", user="gus")
        return await call()


async def test_a_node_put_back_before_the_replacement_is_told_by_replace_which_waits_for_its_job(
    tmp_path: Path,
) -> None:
    async with EngineHarness(tmp_path, outbox=["slack"]) as h:
        h.cluster.script("replacement_started", _PutBackAndFilled(h))
        incident = await h.alert(NODE)
        done = await h.until_ended(incident)
        [notice] = h.notices("returned_early", incident)
        assert "does not start while jobs run" in " ".join(notice["lines"]), notice["lines"]
        [told] = [e for e in await h.events(incident, "notice") if e.outcome == "returned_early"]
        assert told.step == "replace"
        assert h.calls()[("replace", NODE)] == 0  # not under job 301: the incident goes to a human
        assert done.state.value == "failed", await h.timeline(incident)
        [escalation] = h.notices("escalation", incident)
        assert "Slurm job 301" in " ".join(escalation["lines"]) + escalation["title"]
        await h.told_once(incident, "returned_early")


class _PutBackThenRefused:
    """The GPU reset's call fails for a moment (the reset Job's API request times out); meanwhile a
    person RESUMEs the Slurm node and slurmctld starts a user's job there: after the drain's end,
    before the reset's next try."""

    def __init__(self, h: EngineHarness) -> None:
        self._h = h

    async def __call__(self, time: FakeTime, call: Call) -> Any:
        await self._h.world.write("slurm_resume", node=NODE)
        await self._h.world.start_job("401", NODE, name="sweep", user="hal")
        raise TransientError("the reset Job could not be created: timed out", reason=Reason.TIMEOUT)


async def test_a_node_put_back_before_a_gpu_reset_is_not_reset_under_its_new_job(tmp_path: Path) -> None:
    """A reset or a reboot acts on the node itself: between the drain's end and the call (a retry's
    backoff), a node put back by other hands may have taken a job. The step looks before it calls,
    says so once, and waits for that job to leave before it resets the GPU (at its deadline the
    incident goes to a human naming it)."""
    async with EngineHarness(tmp_path, playbooks=_reset_gpu(), outbox=["slack"]) as h:
        h.cluster.script("reset_gpu", _PutBackThenRefused(h))
        body = fault_delivery(
            "row-remap-pending", alertname="GpuRowRemapPending", node=NODE, starts=h.time.now()
        )
        incident = await h.opens(body)
        await h.run_until(lambda: h.cluster.calls["reset_gpu"] >= 1, about=incident)
        await h.time.advance(300)
        assert h.cluster.calls["reset_gpu"] == 1, await h.timeline(incident)  # not under job 401
        [notice] = h.notices("returned_early", incident)
        [told] = [e for e in await h.events(incident, "notice") if e.outcome == "returned_early"]
        assert told.step == "reset_gpu", told
        assert "not requeue" in " ".join(notice["lines"]), notice["lines"]
        [waiting, *_] = reversed(await h.events(incident, "step_waiting", "reset_gpu"))
        assert "401" in waiting.detail and "hal" in waiting.detail, waiting.detail
        await h.world.end_job("401", "COMPLETED")
        done = await h.until_ended(incident)
        assert done.state.value == "resolved", await h.timeline(incident)
        assert h.cluster.calls["reset_gpu"] == 2
        await h.told_once(incident, "returned_early")
