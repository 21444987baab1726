"""Requeue one hung job, and prove it trains again: the opt-in answer to ``job-hung``.

A job whose progress stood still (``bot.engine.hung_jobs``) is stuck in itself, not on a broken
node: ``requeue_job`` hands exactly that job back to Slurm (``scontrol requeue``; slurmrestd has no
such operation, so the REST backend goes through scontrol too, and a REST-only install is refused
by ``check-config --live``), and the node is never touched. The job is the one the incident's alert
names (label ``slurm_job_id``). ``confirm_requeued`` then judges it as ``confirm_resumed`` judges
the jobs of a node taken out: running again with its restart count grown and, with a progress
query, its progress past where it stood.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta

from bot.domain.incident import State
from bot.domain.jobs import JobSnapshot
from bot.engine.context import Done, StepContext, StepResult, Wait
from bot.engine.errors import PermanentError, Reason
from bot.engine.registry import REGISTRY, Track
from bot.engine.steps.resumed import ConfirmResumedResult, judge_jobs
from bot.engine.steps.training import job_progress

#: The alert label that names the job (``bot.domain.hung``).
JOB_LABEL = "slurm_job_id"


@dataclass(frozen=True, slots=True)
class RequeueJobResult(StepResult):
    #: The job as it ran before the requeue (its restart count is the proof's baseline).
    job: JobSnapshot | None = None
    progress_before: Mapping[str, float | None] = field(default_factory=dict)
    #: Intent, persisted before ``scontrol requeue``.
    requeueing: bool = False
    requeued_at: datetime | None = None


@REGISTRY.step(
    RequeueJobResult,
    state=State.RUNNING,
    timeout=timedelta(minutes=2),
    attempts=5,
    would="requeue the hung job the alert names (the node is not touched)",
    undo="a requeued job is not taken back; it restarts from its last checkpoint",
    mutating=True,
    destructive=True,
    port="scheduler",
)
async def requeue_job(ctx: StepContext[RequeueJobResult]) -> Done[RequeueJobResult]:
    progress = ctx.progress
    job = progress.job
    if job is None:
        job_id = await _job_of(ctx)
        snapshot = await ctx.ports.scheduler.job(job_id)
        if snapshot is None or not snapshot.running:
            state = snapshot.state if snapshot else "unknown to Slurm"
            return Done(progress, f"job {job_id} is no longer running ({state}): nothing to requeue")
        if snapshot.not_requeueable:  # Slurm would refuse (``JobSnapshot.not_requeueable``)
            raise PermanentError(
                f"{snapshot.who} cannot be requeued: "
                f"{snapshot.not_requeueable}; pitcrew does not end it: its owner may scancel it",
                reason=Reason.NOT_REQUEUEABLE,
            )
        before = await job_progress(ctx.deps, job_id)
        job = snapshot
        progress = replace(progress, job=job, progress_before={job_id: before})
        await ctx.save(progress)
    if progress.requeued_at is not None:
        return Done(progress, f"job {job.job_id} requeued")
    if progress.requeueing:
        now = await ctx.ports.scheduler.job(job.job_id)
        if now is not None and (now.pending or now.restarts > job.restarts):
            # A crash between the call and its record: Slurm has it already; a second would kill the new run.
            await ctx.note("assumed_issued", f"job {job.job_id} was requeued before a restart")
            done = replace(progress, requeued_at=ctx.clock())
            await ctx.save(done)
            return Done(done, f"job {job.job_id} requeued")
    else:
        progress = replace(progress, requeueing=True)
        await ctx.save(progress)
    await ctx.ports.scheduler.requeue(job.job_id)
    await ctx.acted(
        "slurm_requeue",
        f"{job.who} requeued: its progress stood still; node(s) {', '.join(job.nodes)} left as they are",
        job=job.job_id,
    )
    done = replace(progress, requeued_at=ctx.clock())
    await ctx.save(done)
    return Done(done, f"job {job.job_id} requeued")


async def _job_of(ctx: StepContext[RequeueJobResult]) -> str:
    """The job the incident's alert names; a playbook given to a fault without one is a mistake."""
    for alert in await ctx.deps.store.alerts_of(ctx.incident.id):
        job_id = alert.labels.get(JOB_LABEL)
        if job_id:
            return job_id
    raise PermanentError(
        f"no alert of this incident names a Slurm job (label {JOB_LABEL}): requeue_job is for job-hung",
        reason=Reason.NOT_ALLOWED,
    )


@dataclass(frozen=True, slots=True)
class ConfirmRequeuedResult(ConfirmResumedResult):
    """``confirm_resumed``'s record, for the requeued job."""


@REGISTRY.step(
    ConfirmRequeuedResult,
    state=State.VERIFYING,
    timeout=timedelta(minutes=30),
    attempts=1,
    would="confirm that the requeued job runs again and its progress moves",
    undo="confirming changes nothing",
    track=Track.JOB,
    needs=("requeue_job",),
)
async def confirm_requeued(ctx: StepContext[ConfirmRequeuedResult]) -> Done[ConfirmRequeuedResult] | Wait:
    requeued = await ctx.result(RequeueJobResult) or RequeueJobResult()
    if requeued.job is None or requeued.requeued_at is None:
        return Done(replace(ctx.progress, confirmed_at=ctx.clock()), "no job was requeued")
    # No node is faulty: the job may run again where it hung.
    verdicts = await judge_jobs(
        ctx, (requeued.job,), (), requeued.progress_before, requeued.requeued_at, node_out=False
    )
    if isinstance(verdicts, Wait):
        return verdicts
    [outcome] = verdicts.result.jobs
    return Done(verdicts.result, f"job {outcome.verdict.job_id}: {outcome.verdict.detail}")
