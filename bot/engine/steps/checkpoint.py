"""Checkpoint before a planned drain: ask the jobs on the node to save now, wait (bounded) for the
new checkpoint, then let the playbook take the node out, so the job restarts with nothing redone
instead of up to a checkpoint interval.

For faults that degrade but do not kill (a pending row remap, rising error rates, a flapping link
that still carries traffic). The signal goes to each job's batch step (``scancel --signal=USR1
--batch``, option ``signal``), the proof is the job's checkpoint metric moving
(``resumption.checkpoint_query``), and the wait ends at ``wait_seconds`` (default 120) whatever
happened: a job that cannot checkpoint must not hold a failing node.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta

from bot.domain.incident import State
from bot.engine.context import Done, StepContext, StepResult, Wait
from bot.engine.registry import REGISTRY
from bot.engine.steps.training import job_checkpoint


@dataclass(frozen=True, slots=True)
class CheckpointResult(StepResult):
    jobs: tuple[str, ...] = ()
    #: Each job's checkpoint before the signal (``None``: no sample).
    before: dict[str, float | None] = field(default_factory=dict)
    signalled: tuple[str, ...] = ()
    #: Intent, persisted before the signal goes out.
    signalling: str | None = None
    since: datetime | None = None
    saved: dict[str, float] = field(default_factory=dict)
    #: The wait ended without a new checkpoint from these jobs.
    gave_up: tuple[str, ...] = ()


@REGISTRY.step(
    CheckpointResult,
    state=State.RUNNING,
    timeout=timedelta(minutes=5),
    attempts=3,
    would="signal the jobs on the node to checkpoint now and wait for their new checkpoint",
    undo="a signal is not taken back; the job only saved a checkpoint",
    mutating=True,
    port="scheduler",
)
async def checkpoint(ctx: StepContext[CheckpointResult]) -> Done[CheckpointResult] | Wait:
    if not ctx.settings.resumption.checkpoint_query:
        return Done(
            ctx.progress, "no resumption.checkpoint_query: nothing would show a checkpoint, none asked"
        )
    progress = ctx.progress
    if progress.since is None:
        running = [
            job.job_id
            for name in await ctx.ports.slurm_names(ctx.node)
            for job in await ctx.ports.scheduler.jobs_on_node(name)
            if job.running
        ]
        if not running:
            return Done(progress, "no job is running on the node")
        before = {job_id: await job_checkpoint(ctx.deps, job_id) for job_id in running}
        progress = replace(progress, jobs=tuple(dict.fromkeys(running)), before=before, since=ctx.clock())
        await ctx.save(progress)
    signal = str(ctx.spec.options.get("signal", "USR1"))
    for job_id in progress.jobs:
        if job_id in progress.signalled:
            continue
        if progress.signalling == job_id:
            # A crash hit between intent and confirmation: a second USR1 would only save again.
            await ctx.note("assumed_issued", f"signal to job {job_id} may have gone before a restart")
        else:
            progress = replace(progress, signalling=job_id)
            await ctx.save(progress)
            await ctx.ports.scheduler.signal_job(job_id, signal)
            await ctx.acted(
                "checkpoint_signal", f"job {job_id} asked to checkpoint now (SIG{signal})", job=job_id
            )
        progress = replace(progress, signalling=None, signalled=(*progress.signalled, job_id))
        await ctx.save(progress)
    saved = dict(progress.saved)
    for job_id in progress.jobs:
        now_value = await job_checkpoint(ctx.deps, job_id)
        before_value = progress.before.get(job_id)
        if now_value is not None and (before_value is None or now_value > before_value):
            saved[job_id] = now_value
    progress = replace(progress, saved=saved)
    await ctx.save(progress)
    waiting = [j for j in progress.jobs if j not in saved]
    if not waiting:
        words = ", ".join(f"{j} at {v:g}" for j, v in saved.items())
        return Done(progress, f"new checkpoint: {words}")
    limit = float(ctx.spec.options.get("wait_seconds", 120))
    assert progress.since is not None
    if (ctx.clock() - progress.since).total_seconds() >= limit:
        progress = replace(progress, gave_up=tuple(waiting))
        return Done(
            progress, f"no new checkpoint from job(s) {', '.join(waiting)} within {limit:g}s: going on"
        )
    return Wait(ctx.poll, f"waiting for a new checkpoint from job(s) {', '.join(waiting)}")
