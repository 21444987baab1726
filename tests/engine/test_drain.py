"""The drain step's judgement of each pod, in virtual time against the simulated far side.

Cases: one pod's eviction error does not keep the pods listed after it from theirs — a transient one
(the API server's 500) is retried on the next pass after the others were evicted; a permanent one
(a pod under two PodDisruptionBudgets, which the Eviction API refuses with HTTP 500 on every try)
fails the incident naming the pod and both budgets, once every other pod was evicted.

After DRAIN, jobs still running when ``slurm_drain_grace_seconds`` ends are requeued, but only
those Slurm can requeue: a job submitted ``--no-requeue`` and one that is not a batch job (srun,
salloc) are never asked for, never ended; the step tells their people once (job, name, owner, why,
what they can do) and waits for the job to leave, then goes on, a restart meanwhile telling no
one again; a job still there at the step's deadline escalates in the same words. A refusal that
comes anyway (the job made not requeueable during the grace) is taken the same way; any other
refusal escalates naming the job. The simulated Slurm refuses such a requeue as slurmctld does,
the job running on.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from bot.engine.errors import PermanentError, Reason, TransientError
from tests.engine.harness import EngineHarness, Fail, Through, fleet
from tests.harness.scenarios import fault_delivery, gpu_node

NODE = "gpu-node-02"
STEPS = ["notify", "slurm_down", "cordon", "drain", "replace", "wait_ready", "slurm_resume", "close"]
TWO_BUDGETS = (
    "eviction of pod training/a refused: it is selected by more than one PodDisruptionBudget "
    "(team-a, team-wide), which the Eviction API does not support"
)


def _inventory() -> dict[str, Any]:
    return fleet(extra={NODE: gpu_node("training/a", "training/b")})


def _evictions(h: EngineHarness) -> list[str]:
    return [r["pod"] for r in h.records() if r.get("op") == "evict"]


async def test_a_failed_eviction_does_not_hold_back_the_pods_after_it(tmp_path: Path) -> None:
    playbooks = {"replace-node": {"steps": STEPS}}
    async with EngineHarness(tmp_path, inventory=_inventory(), playbooks=playbooks) as h:
        h.cluster.script(
            "evict", Fail(TransientError("evict pod training/a: 500", reason=Reason.UNAVAILABLE)), Through()
        )
        incident = await h.alert(NODE)
        done = await h.until_ended(incident)
        assert done.state.value == "resolved"
        assert _evictions(h) == ["training/b", "training/a"]  # b in the first pass, a on the retry


async def test_a_pod_under_two_budgets_fails_the_drain_naming_them_after_the_others(tmp_path: Path) -> None:
    playbooks = {"replace-node": {"steps": STEPS}}
    async with EngineHarness(tmp_path, inventory=_inventory(), playbooks=playbooks) as h:
        h.cluster.script("evict", Fail(PermanentError(TWO_BUDGETS, reason=Reason.PDB)))
        incident = await h.alert(NODE)
        done = await h.until_ended(incident)
        assert done.state.value == "failed"
        assert _evictions(h) == ["training/b"]
        assert h.calls()[("replace", NODE)] == 0
        [escalation] = h.notices("escalation", incident)
        text = " ".join(escalation["lines"]) + escalation["title"]
        assert "training/a" in text and "team-a, team-wide" in text, text


# ------------------------------------------------------------------ jobs left after the drain grace
GRACE = 60
LONG = {"job_id": "101", "name": "llm-pretrain", "user": "dana", "node": NODE, "requeue": False}
MOVABLE = {"job_id": "102", "name": "sweep-7", "user": "erik", "node": NODE}


def _drain_grace(timeout: str = "15m") -> dict[str, Any]:
    steps: list[Any] = ["notify", "slurm_down", "cordon"]
    steps.append({"step": "drain", "timeout": timeout, "options": {"slurm_drain_grace_seconds": GRACE}})
    steps += ["reset_gpu", "wait_ready", "slurm_resume", "close"]
    return {"reset-gpu": {"steps": steps}}


async def _drained(h: EngineHarness) -> str:
    """A pending row remap (not job-fatal): reset-gpu DRAINs the node and lets its jobs run."""
    body = fault_delivery("row-remap-pending", alertname="GpuRowRemapPending", node=NODE, starts=h.time.now())
    return await h.opens(body)


def _requeues(h: EngineHarness) -> list[str]:
    return [str(r["job_id"]) for r in h.records() if r.get("op") == "requeue"]


async def _job_state(h: EngineHarness, job_id: str) -> str:
    job = await h.world.job(job_id)
    assert job is not None
    return job.state


@pytest.mark.parametrize(
    ("job", "why"),
    [
        ({}, "--no-requeue"),
        ({"requeue": True, "batch": False}, "not a batch job"),
    ],
    ids=["no-requeue", "not-batch"],
)
async def test_a_job_slurm_will_not_requeue_is_left_running_its_people_told_once(
    tmp_path: Path, job: dict[str, Any], why: str
) -> None:
    held = LONG | job
    async with EngineHarness(
        tmp_path, inventory=fleet(jobs=(held, MOVABLE)), playbooks=_drain_grace(), outbox=["slack"]
    ) as h:
        incident = await _drained(h)
        await h.run_until(lambda: bool(h.notices("job_not_requeueable", incident)), about=incident)
        assert _requeues(h) == ["102"]  # the movable one only; Slurm would refuse 101
        assert await _job_state(h, "101") == "RUNNING"  # pitcrew ends nothing it cannot bring back
        [notice] = h.notices("job_not_requeueable", incident)
        text = notice["title"] + " " + " ".join(notice["lines"])
        for words in ("101", "llm-pretrain", "dana", why, "scancel 101", NODE):
            assert words in text, text
        assert (await h.incident(incident)).state.value == "running"

        await h.time.advance(600)  # the job runs on; pitcrew waits, says nothing more, asks nothing
        assert _requeues(h) == ["102"]
        assert len(h.notices("job_not_requeueable", incident)) == 1
        [waiting, *_] = [e for e in reversed(await h.events(incident, "step_waiting", "drain"))]
        assert "101" in waiting.detail and why in waiting.detail, waiting.detail

        await h.world.end_job("101")  # its owner scancels it, or it ends
        done = await h.until_ended(incident)
        assert done.state.value == "resolved", await h.timeline(incident)
        await h.told_once(incident, "job_not_requeueable")
        assert h.calls()[("reset_gpu", NODE)] == 1


async def test_a_restart_while_the_job_is_kept_neither_tells_again_nor_asks_slurm(tmp_path: Path) -> None:
    async with EngineHarness(
        tmp_path, inventory=fleet(jobs=(LONG,)), playbooks=_drain_grace(), outbox=["slack"]
    ) as h:
        incident = await _drained(h)
        await h.run_until(lambda: bool(h.notices("job_not_requeueable", incident)), about=incident)
        await h.restart(new_process=True)  # the step runs again from its stored progress
        await h.time.advance(120)
        await h.world.end_job("101", "COMPLETED")
        assert (await h.until_ended(incident)).state.value == "resolved"
        await h.told_once(incident, "job_not_requeueable")
        assert _requeues(h) == [] and h.scheduler.calls["requeue"] == 0


async def test_a_job_still_there_at_the_deadline_escalates_in_the_same_words(tmp_path: Path) -> None:
    async with EngineHarness(
        tmp_path, inventory=fleet(jobs=(LONG,)), playbooks=_drain_grace(timeout="5m")
    ) as h:
        incident = await _drained(h)
        done = await h.until_ended(incident)
        assert done.state.value == "failed"
        assert _requeues(h) == []
        assert await _job_state(h, "101") == "RUNNING"
        assert h.calls()[("reset_gpu", NODE)] == 0
        [escalation] = h.notices("escalation", incident)
        text = escalation["title"] + " " + " ".join(escalation["lines"])
        for words in ("101", "llm-pretrain", "dana", "--no-requeue"):
            assert words in text, text


async def test_a_refusal_that_comes_anyway_is_taken_as_slurm_means_it(tmp_path: Path) -> None:
    """The job was made not requeueable during the grace (``scontrol update Requeue=0``): the
    snapshot said it could go, Slurm says no. It is left running and its people told, as above."""
    refused = PermanentError(
        "requeue: Slurm will not requeue job 102: it was submitted not requeueable (--no-requeue) "
        "(Slurm: Requested operation is presently disabled for job 102)",
        reason=Reason.NOT_REQUEUEABLE,
    )
    async with EngineHarness(tmp_path, inventory=fleet(jobs=(MOVABLE,)), playbooks=_drain_grace()) as h:
        h.scheduler.script("requeue", Fail(refused))
        incident = await _drained(h)
        await h.run_until(lambda: bool(h.notices("job_not_requeueable", incident)), about=incident)
        assert h.scheduler.calls["requeue"] == 1
        [notice] = h.notices("job_not_requeueable", incident)
        text = notice["title"] + " " + " ".join(notice["lines"])
        assert "sweep-7" in text and "erik" in text and "presently disabled" in text, text
        await h.time.advance(300)
        assert h.scheduler.calls["requeue"] == 1  # not asked again
        await h.world.end_job("102", "COMPLETED")
        assert (await h.until_ended(incident)).state.value == "resolved"


async def test_any_other_refusal_escalates_naming_the_job(tmp_path: Path) -> None:
    denied = PermanentError("requeue: Access/permission denied for job 102", reason=Reason.FORBIDDEN)
    async with EngineHarness(tmp_path, inventory=fleet(jobs=(MOVABLE,)), playbooks=_drain_grace()) as h:
        h.scheduler.script("requeue", Fail(denied))
        incident = await _drained(h)
        done = await h.until_ended(incident)
        assert done.state.value == "failed"
        assert await _job_state(h, "102") == "RUNNING"
        [escalation] = h.notices("escalation", incident)
        text = escalation["title"] + " " + " ".join(escalation["lines"])
        for words in ("102", "sweep-7", "erik", "Access/permission denied", "does not end it"):
            assert words in text, text


@pytest.mark.parametrize(
    "job", [LONG, LONG | {"requeue": True, "batch": False}], ids=["no-requeue", "not-batch"]
)
async def test_the_simulated_slurm_refuses_the_requeue_slurmctld_refuses(
    tmp_path: Path, job: dict[str, Any]
) -> None:
    """The stand-in is no more lenient than slurmctld (``_job_requeue_op``): the job keeps running."""
    async with EngineHarness(tmp_path, inventory=fleet(jobs=(job,))) as h:
        with pytest.raises(PermanentError) as refused:
            await h.world.requeue("101")
        assert refused.value.reason == Reason.NOT_REQUEUEABLE
        assert await _job_state(h, "101") == "RUNNING"
        assert _requeues(h) == []
