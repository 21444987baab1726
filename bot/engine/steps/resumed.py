"""The job track: prove that every job the fault interrupted runs again, from its checkpoint.

``confirm_resumed`` runs beside the node track as soon as the Slurm node is out: on a real
cluster a requeued job runs elsewhere within seconds, long before a replacement is Ready,
and when no node is free it waits for exactly that replacement. The moment every job is
back, humans are told, with the time it took.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from datetime import datetime, timedelta
from typing import Any, TypeVar, cast

from pydantic import GetCoreSchemaHandler
from pydantic_core import core_schema

from bot.domain.durations import format_duration
from bot.domain.incident import State
from bot.domain.jobs import JobSnapshot, ResumeVerdict, judge_resumption
from bot.engine.context import Done, StepContext, StepResult, Wait
from bot.engine.ports import Notice
from bot.engine.registry import REGISTRY, Track
from bot.engine.steps.back import SlurmResumeResult
from bot.engine.steps.slurm import SlurmDownResult
from bot.engine.steps.training import job_progress


@dataclass(frozen=True, slots=True)
class JobOutcome:
    """Where one interrupted job stands (its verdict), with the timings of its way back.

    Stored and shown flat, the verdict's fields beside the timings, as the step's result has
    always read (``bot.store.codec`` and the read API see one JSON object per job)."""

    verdict: ResumeVerdict
    #: When the Slurm node went out.
    down_at: datetime | None = None
    #: When Slurm started the restarted run (``None`` until there is one).
    restarted_at: datetime | None = None
    #: When pitcrew first saw the job resumed.
    resumed_at: datetime | None = None
    seconds_to_restart: float | None = None
    seconds_to_resumed: float | None = None

    @classmethod
    def __get_pydantic_core_schema__(
        cls, source: type[Any], handler: GetCoreSchemaHandler
    ) -> core_schema.CoreSchema:
        # The flat form is the type's one definition: a second JobOutcome in the same record
        # (``last`` beside ``jobs``) refers to it, not to the nested dataclass underneath.
        schema = dict(handler(source))
        ref = schema.pop("ref", None)
        nested = cast(core_schema.CoreSchema, schema)
        return core_schema.no_info_before_validator_function(
            _nest,
            nested,
            serialization=core_schema.wrap_serializer_function_ser_schema(_flatten, schema=nested),
            ref=ref,
        )


_VERDICT_FIELDS = frozenset(f.name for f in fields(ResumeVerdict))


def _nest(value: Any) -> Any:
    """A stored (flat) job record as ``JobOutcome``'s fields."""
    if not isinstance(value, Mapping) or "verdict" in value:
        return value
    return {
        "verdict": {k: v for k, v in value.items() if k in _VERDICT_FIELDS},
        **{k: v for k, v in value.items() if k not in _VERDICT_FIELDS},
    }


def _flatten(value: JobOutcome, serialize: core_schema.SerializerFunctionWrapHandler) -> Any:
    data = dict(serialize(value))
    return {**data.pop("verdict"), **data}


@dataclass(frozen=True, slots=True)
class ConfirmResumedResult(StepResult):
    #: Final verdicts (set when the step is done).
    jobs: tuple[JobOutcome, ...] = ()
    #: Latest verdicts while waiting.
    last: tuple[JobOutcome, ...] = ()
    resumed_at: Mapping[str, datetime] = field(default_factory=dict)
    reported: tuple[str, ...] = ()
    progress_at_restart: Mapping[str, float | None] = field(default_factory=dict)
    #: When every job was confirmed running again (the job track's end).
    confirmed_at: datetime | None = None
    announced: bool = False


C = TypeVar("C", bound=ConfirmResumedResult)


@REGISTRY.step(
    ConfirmResumedResult,
    state=State.VERIFYING,
    timeout=timedelta(hours=1),
    attempts=1,
    would="confirm that every job recorded on the node runs again elsewhere",
    undo="confirming changes nothing",
    track=Track.JOB,
    needs=("slurm_down",),
)
async def confirm_resumed(ctx: StepContext[ConfirmResumedResult]) -> Done[ConfirmResumedResult] | Wait:
    down = await ctx.result(SlurmDownResult) or SlurmDownResult()
    if not down.jobs:
        return Done(replace(ctx.progress, confirmed_at=ctx.clock()), "no Slurm job was running on the node")
    # A node pitcrew returned to service was repaired: a job running there again has resumed.
    back = await ctx.result(SlurmResumeResult)
    returned = set(back.resumed) if back else set()
    faulty = [n for n in (down.slurm_nodes or (ctx.node,)) if n not in returned]
    verdicts = await judge_jobs(
        ctx, down.jobs, faulty, down.progress_before, down.taken_out_at, node_out=True
    )
    if isinstance(verdicts, Wait):
        return verdicts
    resumed = sum(o.verdict.status == "resumed" for o in verdicts.result.jobs)
    return Done(verdicts.result, f"{resumed} of {len(verdicts.result.jobs)} job(s) running again elsewhere")


async def judge_jobs(
    ctx: StepContext[C],
    jobs: Sequence[JobSnapshot],
    faulty: Sequence[str],
    progress_before: Mapping[str, float | None],
    out_at: datetime | None,
    *,
    node_out: bool,
) -> Done[C] | Wait:
    """Judge each interrupted job (``judge_resumption``) until none is waiting: reports a lost job
    once, and tells humans when training is back. Shared by every step of the job track that proves
    jobs ran again: after the node went out (``node_out``: a job back on it runs on the repaired
    node), after a job alone was requeued."""
    query = ctx.settings.resumption.progress_query
    first_seen = dict(ctx.progress.resumed_at)
    reported = list(ctx.progress.reported)
    at_restart = dict(ctx.progress.progress_at_restart)
    outcomes = []
    for job in jobs:
        now_snapshot = await ctx.ports.scheduler.job(job.job_id)
        progress_now = await job_progress(ctx.deps, job.job_id) if query else None
        if (
            query
            and now_snapshot is not None
            and now_snapshot.running
            and now_snapshot.restarts > job.restarts
        ):
            at_restart.setdefault(job.job_id, progress_now)  # the first sample of the restarted run
        verdict = judge_resumption(
            job,
            now_snapshot,
            faulty,
            progress_before=progress_before.get(job.job_id),
            progress_at_restart=at_restart.get(job.job_id),
            progress_now=progress_now,
            progress_required=bool(query) and ctx.settings.resumption.require_progress,
        )
        if verdict.status == "resumed" and job.job_id not in first_seen:
            first_seen[job.job_id] = ctx.clock()
        if verdict.status == "lost" and job.job_id not in reported:
            reported.append(job.job_id)
            await ctx.tell(
                Notice(
                    ctx.incident.id,
                    "job_lost",
                    f"Job {job.job_id} ({job.name}, owner {job.user}) did not come back",
                    (verdict.detail, "It was not requeueable; resubmit it or restore from its checkpoint."),
                    severity="warning",
                    node=ctx.node,
                ),
                key=f"job_lost:{job.job_id}",
            )
        restarted = now_snapshot.start_time if now_snapshot is not None else None
        outcomes.append(_outcome(verdict, out_at, restarted, first_seen.get(job.job_id), repaired=node_out))
    progress = replace(
        ctx.progress,
        resumed_at=first_seen,
        reported=tuple(reported),
        progress_at_restart=at_restart,
        last=tuple(outcomes),
    )
    await ctx.save(progress)
    pending = [o.verdict for o in outcomes if o.verdict.status == "waiting"]
    if pending:
        return Wait(ctx.poll, "; ".join(f"{v.job_id}: {v.detail}" for v in pending))
    done = replace(progress, jobs=tuple(outcomes), confirmed_at=ctx.clock())
    if not done.announced and any(o.verdict.status == "resumed" for o in outcomes):
        await _announce(ctx, done)
        done = replace(done, announced=True)
    return Done(done)


async def _announce(ctx: StepContext[C], result: ConfirmResumedResult) -> None:
    """Training is back: tell humans now, not when the node track ends."""
    start = ctx.incident.opened_at  # the first delivery, as every pitcrew duration
    took = max(((result.confirmed_at or ctx.clock()) - start).total_seconds(), 0.0)
    lines = tuple(
        f"job {v.job_id}: running on {', '.join(v.new_nodes) or '-'} (restarts {v.restarts_before} → "
        f"{v.restarts_now})"
        for v in (o.verdict for o in result.jobs)
        if v.status == "resumed"
    )
    await ctx.tell(
        Notice(
            ctx.incident.id,
            "job_running",
            f"{ctx.node}: training running again after {format_duration(timedelta(seconds=took))}",
            lines,
            node=ctx.node,
        ),
        key="job_running",  # not the title: it says how long, which a run after a crash says anew
    )
    await ctx.note(
        "job_running", f"every interrupted job runs again after {took:.1f}s", seconds=round(took, 3)
    )
    ctx.deps.metrics.time_to_job_running.labels(ctx.incident.playbook or "unknown").observe(took)


def _outcome(
    verdict: ResumeVerdict,
    down_at: datetime | None,
    restarted: datetime | None,
    resumed_at: datetime | None,
    *,
    repaired: bool,
) -> JobOutcome:
    """One job's verdict with when the node (or job) went out, Slurm started it again, pitcrew saw it back."""
    if verdict.status != "resumed" or verdict.restarts_now <= verdict.restarts_before:
        restarted = None  # the start time of a run that is not the restarted one
    if verdict.status == "resumed" and set(verdict.new_nodes) & set(verdict.old_nodes):
        # On a node that was out: it was repaired. On a node that never was (a requeued job): back where it ran.
        where = "on the repaired node" if repaired else "on the same node"
        verdict = replace(verdict, detail=f"running again {where}")

    def since_down(moment: datetime | None) -> float | None:
        return round((moment - down_at).total_seconds(), 3) if moment and down_at else None

    return JobOutcome(
        verdict,
        down_at=down_at,
        restarted_at=restarted,
        resumed_at=resumed_at,
        seconds_to_restart=since_down(restarted),
        seconds_to_resumed=since_down(resumed_at),
    )
