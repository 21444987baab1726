"""GPU died, training didn't: the whole Slurm side of a fatal fault, on a real cluster.

For each backend (``scontrol``; ``rest`` = slurmrestd reads, node updates through scontrol
on 22.05 because its REST API has none), with the checkpointing training job on a node and a
``--no-requeue`` job beside it:

* the jobs on the node are recorded *before* it is downed (afterwards Slurm forgets);
* DOWN with a ``pitcrew:`` reason → the training job is requeued (restarts 0 → 1), runs on
  another node and resumes from its checkpoint: its first step after restart is past the
  step it had reached before the fault; ``judge_resumption`` says ``resumed``;
* the ``--no-requeue`` job ends NODE_FAIL and is judged ``lost`` at once, with its owner;
* the job's progress is served as a Prometheus sample (``ProgressServer``) past the checkpoint;
* the node's reason is this incident's (``owns_slurm_reason``), so RESUME returns it to service.

Each run prints job id, old/new node, restart count and the time of each phase.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from typing import Any, TypeVar

import aiohttp
import pytest

from bot.domain.jobs import JobSnapshot, SlurmNodeState, judge_resumption
from bot.domain.ownership import owns_slurm_reason, slurm_reason
from bot.engine.errors import PermanentError
from bot.integrations.slurm import RestScheduler
from proving_ground.proc import eventually
from proving_ground.slurm import SlurmCluster
from proving_ground.train_job import (
    CHECKPOINT_METRIC,
    METRIC,
    ProgressServer,
    exposition,
    read_checkpoint,
    read_events,
    read_progress,
)
from tests.harness.figures import show_figure
from tests.harness.slurm import BACKENDS, Sched, backend

pytestmark = pytest.mark.slow
T = TypeVar("T")


@pytest.fixture(params=BACKENDS)
async def scheduler(request: pytest.FixtureRequest, slurm: SlurmCluster) -> AsyncIterator[Sched]:
    async with backend(slurm, request.param) as sched:
        yield sched


async def test_fatal_fault_job_resumes_from_checkpoint_elsewhere(
    slurm: SlurmCluster, scheduler: Sched, capsys: pytest.CaptureFixture[str]
) -> None:
    s = scheduler
    train_id = slurm.submit_training()
    started = await eventually(lambda: _running(s, train_id), timeout=15, what="training job to run")
    node = started.nodes[0]
    await eventually(
        lambda: _async(read_checkpoint(slurm.job_dir, train_id) >= 3), timeout=15, what="3 steps"
    )
    lone_id = slurm.submit("--no-requeue", "--job-name=no-requeue", f"--nodelist={node}", "--wrap=sleep 300")
    await eventually(lambda: _running(s, lone_id), timeout=15, what="no-requeue job to run")

    recorded = {j.job_id: j for j in await s.jobs_on_node(node)}
    assert set(recorded) == {train_id, lone_id}
    assert recorded[lone_id].requeue is False

    step_before = read_checkpoint(slurm.job_dir, train_id)
    reason = slurm_reason("inc-test", "XID 79 gpu3")
    t_down = time.monotonic()
    await s.down(node, reason)
    down = await s.node(node)
    assert down.down
    assert down.reason == reason
    assert owns_slurm_reason(down.reason, "inc-test")

    lone_now = await s.job(lone_id)
    lone = judge_resumption(recorded[lone_id], lone_now, [node])
    assert lone.status == "lost", lone.detail  # reported at once, never waited for
    assert lone_now is not None
    assert lone_now.state == "NODE_FAIL"
    assert recorded[lone_id].user == "root"  # the owner humans are told about

    requeued = await eventually(lambda: _requeued(s, train_id), timeout=10, what="requeue")
    t_requeued = time.monotonic()
    assert requeued.restarts == 1
    moved = await eventually(lambda: _running(s, train_id), timeout=30, what="job running elsewhere")
    t_running = time.monotonic()
    assert node not in moved.nodes

    progress = await eventually(
        lambda: _async(_progress_past(slurm, train_id, step_before)),
        timeout=15,
        what="progress past checkpoint",
    )
    t_progress = time.monotonic()
    assert progress["restart_count"] == 1
    assert progress["node"] == moved.nodes[0]
    assert progress["resumed_from"] >= step_before > 0  # resumed from the checkpoint, not from 0
    assert any("SIGTERM" in e and f"node={node}" in e for e in read_events(slurm.job_dir, train_id))

    scraped = await _scrape_step(slurm, train_id)  # what a real Prometheus would see
    assert scraped > step_before

    now = await s.job(train_id)
    verdict = judge_resumption(
        recorded[train_id],
        now,
        [node],
        progress_before=step_before,
        progress_now=progress["step"],
        progress_required=True,
    )
    assert verdict.status == "resumed", verdict.detail
    assert verdict.restarts_now == 1

    await s.resume(node)
    back = await eventually(lambda: _in_service(s, node), timeout=10, what="node back in service")
    assert back.reason == (reason if slurm.keeps_reason_on_resume else "")

    path = await s.node_update_path() if isinstance(s, RestScheduler) else "scontrol"
    show_figure(
        capsys,
        f"\n[slurm {s.backend}: reads={s.backend}, node updates={path}] job {train_id} {node} -> "
        f"{moved.nodes[0]} restarts={verdict.restarts_now} checkpoint={step_before} "
        f"resumed_from={progress['resumed_from']} step={progress['step']} | "
        f"down->requeued {t_requeued - t_down:.2f}s, requeued->running {t_running - t_requeued:.2f}s, "
        f"running->past checkpoint {t_progress - t_running:.2f}s, total {t_progress - t_down:.2f}s | "
        f"no-requeue job {lone_id} {lone.status}: {lone.detail}",
    )


async def test_usr1_to_the_batch_step_makes_the_job_checkpoint_now(
    slurm: SlurmCluster, scheduler: Sched
) -> None:
    """``scancel --signal=USR1 --batch``, pitcrew's "checkpoint now" before a planned drain: the
    proving ground's job (a checkpoint every 1000 steps, so none of its own) writes one at once and
    runs on; its checkpoint metric moves; a signal that would end a job is refused."""
    s = scheduler
    job_id = slurm.submit_training(ckpt_every=1000)
    await eventually(lambda: _running(s, job_id), timeout=15, what="training job to run")
    await eventually(
        lambda: _async((read_progress(slurm.job_dir, job_id) or {}).get("step", 0) >= 3),
        timeout=15,
        what="3 steps",
    )
    assert read_checkpoint(slurm.job_dir, job_id) == 0  # no checkpoint of its own yet

    await s.signal_job(job_id, "USR1")
    # The job writes the checkpoint, its progress and metrics, and the event last: wait for the event.
    await eventually(
        lambda: _async([e for e in read_events(slurm.job_dir, job_id) if " CHECKPOINT " in e] or None),
        timeout=10,
        what="the checkpoint asked for",
    )
    saved = read_checkpoint(slurm.job_dir, job_id)
    progress = read_progress(slurm.job_dir, job_id)
    assert progress is not None and 3 <= saved == progress["step"]  # saved, then holds
    assert f'{CHECKPOINT_METRIC}{{job_id="{job_id}"' in exposition(slurm.job_dir)
    job = await s.job(job_id)
    assert job is not None and (job.state, job.restarts) == ("RUNNING", 0)
    with pytest.raises(PermanentError, match="not one pitcrew sends"):
        await s.signal_job(job_id, "KILL")


async def _async(value: T) -> T:
    return value


async def _running(s: Sched, job_id: str) -> JobSnapshot | None:
    job = await s.job(job_id)
    # COMPLETING also counts as running in the domain; here we want the job truly started.
    return job if job is not None and job.state == "RUNNING" else None


async def _requeued(s: Sched, job_id: str) -> JobSnapshot | None:
    job = await s.job(job_id)
    return job if job is not None and job.restarts >= 1 else None


async def _in_service(s: Sched, node: str) -> SlurmNodeState | None:
    state = await s.node(node)
    return state if state.in_service else None


def _progress_past(slurm: SlurmCluster, job_id: str, step: int) -> dict[str, Any] | None:
    progress = read_progress(slurm.job_dir, job_id)
    if progress and progress["restart_count"] == 1 and progress["step"] > step:
        return progress
    return None


async def _scrape_step(slurm: SlurmCluster, job_id: str) -> float:
    server = ProgressServer(slurm.job_dir).start()
    try:
        async with aiohttp.ClientSession() as session, session.get(server.url) as resp:
            text = await resp.text()
    finally:
        server.stop()
    samples = [ln for ln in text.splitlines() if ln.startswith(f'{METRIC}{{job_id="{job_id}"')]
    assert len(samples) == 1, text
    return float(samples[0].rsplit(" ", 1)[1])
