"""Never make an outage worse: ownership, DRAIN and idempotence on a real cluster.

Cases (both backends where they differ):
* a node someone else downed (reason without ``pitcrew:``) reads back with their reason,
  verbatim, so the ownership rule the ``slurm_resume`` step applies sees it is not pitcrew's
  (the step leaving it DOWN on a real cluster: tests/e2e/test_slurm_remediation.py);
* DOWN twice and RESUME of a node already in service are harmless (retried steps);
* DRAIN leaves the running job alone (MIXED+DRAIN → IDLE+DRAIN when it ends), then the node
  is ours to resume;
* DRAIN + requeue moves a running job to another node; requeue of a job already pending is
  a no-op; unknown nodes and jobs are permanent errors, a forgotten job is ``None``;
* a job Slurm will not requeue (``sbatch --no-requeue``, an ``srun`` job) reads as such, and a
  requeue asked anyway is refused as ``not_requeueable`` with Slurm's words: the job runs on.
"""

from __future__ import annotations

import asyncio
import subprocess
from collections.abc import AsyncIterator

import pytest

from bot.domain.jobs import JobSnapshot, SlurmNodeState
from bot.domain.ownership import is_pitcrew_reason, owns_slurm_reason, slurm_reason
from bot.engine.errors import PermanentError
from bot.integrations.slurm import SlurmSettings, build_scheduler
from proving_ground.proc import eventually
from proving_ground.slurm import SlurmCluster
from tests.harness.slurm import BACKENDS, Sched, backend

pytestmark = pytest.mark.slow
INCIDENT = "inc-own"
REASON = slurm_reason(INCIDENT, "XID 48 gpu0")


@pytest.fixture(params=BACKENDS)
async def sched(request: pytest.FixtureRequest, slurm: SlurmCluster) -> AsyncIterator[Sched]:
    async with backend(slurm, request.param) as scheduler:
        yield scheduler


async def test_node_downed_by_someone_else_reads_as_not_ours(slurm: SlurmCluster, sched: Sched) -> None:
    slurm.run("scontrol", "update", "NodeName=gpu-002", "State=DOWN", "Reason=disk swap (alice) ticket=42")
    theirs = await sched.node("gpu-002")
    assert theirs.down
    assert theirs.reason == "disk swap (alice) ticket=42"
    assert not is_pitcrew_reason(theirs.reason)
    assert not owns_slurm_reason(theirs.reason, INCIDENT)


async def test_repeated_calls_are_harmless(sched: Sched) -> None:
    await sched.down("gpu-003", REASON)
    await sched.down("gpu-003", REASON)  # a retried step
    assert owns_slurm_reason((await sched.node("gpu-003")).reason, INCIDENT)
    await sched.resume("gpu-003")
    await eventually(lambda: _in_service(sched, "gpu-003"), timeout=10, what="gpu-003 in service")
    await sched.resume("gpu-003")  # already in service: nothing to do, no error
    assert (await sched.node("gpu-003")).in_service


async def test_unknown_node_and_job(sched: Sched) -> None:
    with pytest.raises(PermanentError) as node_error:
        await sched.node("gpu-404")
    assert node_error.value.reason == "unknown_node"
    with pytest.raises(PermanentError) as down_error:
        await sched.down("gpu-404", REASON)
    assert down_error.value.reason == "unknown_node"
    assert await sched.job("999999") is None
    with pytest.raises(PermanentError) as requeue_error:
        await sched.requeue("999999")
    assert requeue_error.value.reason == "unknown_job"


async def test_drain_leaves_the_running_job_alone(slurm: SlurmCluster) -> None:
    # The cluster's own scontrol (``slurm.settings``: its wrappers on 24.11 and 26.05, whose
    # controller this machine's 22.05 scontrol cannot talk to).
    sched = build_scheduler(SlurmSettings.model_validate(slurm.settings("scontrol")))
    # The job runs 10 s, long past the checks below even on a loaded machine (with 3 s, the drain,
    # the reads and the second's wait could take it to its end and MIXED+DRAIN be gone).
    job_id = slurm.submit("--nodelist=gpu-001", "--wrap=sleep 10")
    job = await eventually(lambda: _running(sched, job_id), timeout=15, what="job to run")
    await sched.drain("gpu-001", REASON)

    draining = await sched.node("gpu-001")
    assert draining.states == {"MIXED", "DRAIN"}
    assert owns_slurm_reason(draining.reason, INCIDENT)
    await asyncio.sleep(1)
    assert await _running(sched, job_id) is not None  # not killed, not requeued

    done = await eventually(lambda: _ended(sched, job_id), timeout=30, what="job to finish")
    assert done.state == "COMPLETED"
    assert done.restarts == job.restarts == 0
    drained = await eventually(lambda: _idle_drained(sched, "gpu-001"), timeout=10, what="IDLE+DRAIN")
    assert drained.reason == REASON
    await sched.resume("gpu-001")  # ours: the step would resume it
    await eventually(lambda: _in_service(sched, "gpu-001"), timeout=10, what="gpu-001 in service")


async def test_drain_then_requeue_moves_the_job(slurm: SlurmCluster, sched: Sched) -> None:
    job_id = slurm.submit("--requeue", "--gres=gpu:h100:8", "--wrap=sleep 300")
    first = await eventually(lambda: _running(sched, job_id), timeout=15, what="job to run")
    node = first.nodes[0]
    await sched.drain(node, REASON)
    await sched.requeue(job_id)
    await sched.requeue(job_id)  # already pending: a retried step must not fail
    moved = await eventually(lambda: _running(sched, job_id), timeout=30, what="job running elsewhere")
    assert node not in moved.nodes
    assert moved.restarts == 1


async def test_slurm_will_not_requeue_a_no_requeue_or_srun_job(slurm: SlurmCluster, sched: Sched) -> None:
    lone = slurm.submit("--no-requeue", "--job-name=lone", "--nodelist=gpu-001", "--wrap=sleep 300")
    shell = subprocess.Popen(  # an interactive job: srun, no batch script
        slurm.command("srun", "--nodelist=gpu-002", "--job-name=shell", "sleep", "300"),
        env=slurm.env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        first = await eventually(lambda: _running(sched, lone), timeout=15, what="no-requeue job to run")
        shell_id = await eventually(lambda: _named(sched, "gpu-002", "shell"), timeout=15, what="srun job")
        srun = await sched.job(shell_id)
        assert srun is not None
        assert (first.requeue, first.batch, srun.requeue, srun.batch) == (False, True, True, False)
        for job, meaning in ((first, "--no-requeue"), (srun, "not a batch job")):
            assert job.not_requeueable is not None
            with pytest.raises(PermanentError) as refused:
                await sched.requeue(job.job_id)
            assert refused.value.reason == "not_requeueable", refused.value
            assert meaning in str(refused.value), refused.value
            assert f"job {job.job_id}" in str(refused.value)
            after = await _running(sched, job.job_id)  # refused: nothing changed, it runs on
            assert after is not None and (after.nodes, after.restarts) == (job.nodes, 0)
    finally:
        # Ended through Slurm, so srun exits inside a newer Slurm's root too (a signal would
        # reach only the wrapper that entered it).
        slurm.run("scancel", "--name=shell", check=False)
        try:
            shell.wait(timeout=15)
        except subprocess.TimeoutExpired:
            shell.kill()
            shell.wait()


async def _named(s: Sched, node: str, name: str) -> str | None:
    return next(
        (j.job_id for j in await s.jobs_on_node(node) if j.name == name and j.state == "RUNNING"), None
    )


async def _running(s: Sched, job_id: str) -> JobSnapshot | None:
    job = await s.job(job_id)
    # COMPLETING also counts as running in the domain; here we want the job truly started.
    return job if job is not None and job.state == "RUNNING" else None


async def _ended(s: Sched, job_id: str) -> JobSnapshot | None:
    job = await s.job(job_id)
    return job if job is not None and job.ended_for_good else None


async def _in_service(s: Sched, node: str) -> bool:
    return (await s.node(node)).in_service


async def _idle_drained(s: Sched, node: str) -> SlurmNodeState | None:
    state = await s.node(node)
    return state if state.states == {"IDLE", "DRAIN"} else None
