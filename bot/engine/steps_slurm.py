"""Slurm steps: take the node out (after recording its jobs), return it, prove the jobs resumed.

Ownership rule: pitcrew resumes a Slurm node only when its reason still starts with
``pitcrew: <this incident>``. A node someone else downed or drained is left alone and
said so in the timeline.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict
from datetime import datetime
from typing import Any

from bot.domain.jobs import JobSnapshot, ResumeVerdict, judge_resumption
from bot.engine.context import Done, StepContext, Wait
from bot.engine.errors import TransientError
from bot.engine.ports import Notice
from bot.engine.steps_cluster import release_cordon


def _job_dict(job: JobSnapshot) -> dict[str, Any]:
    data = asdict(job)
    data["nodes"] = list(job.nodes)
    data["start_time"] = job.start_time.isoformat() if job.start_time else None
    return data


def _job_from(data: dict[str, Any]) -> JobSnapshot:
    fields = {k: v for k, v in data.items() if k in JobSnapshot.__dataclass_fields__}
    fields["nodes"] = tuple(fields.get("nodes", ()))
    fields["start_time"] = None
    return JobSnapshot(**fields)


def owns(reason: str, incident_id: str) -> bool:
    return reason.startswith(f"pitcrew: {incident_id} ") or reason == f"pitcrew: {incident_id}"


async def slurm_down(ctx: StepContext) -> Done | Wait:
    scheduler = ctx.ports.scheduler
    action = ctx.plan.get("slurm_action", "down")
    names = ctx.progress.get("slurm_nodes")
    if names is None:
        names = list(await ctx.ports.slurm_names(ctx.node))
        await ctx.intend(slurm_nodes=names)
    if "jobs" not in ctx.progress:
        # Before DOWN: afterwards Slurm no longer says where a requeued job ran.
        jobs = [_job_dict(job) for name in names for job in await scheduler.jobs_on_node(name)]
        await ctx.intend(jobs=jobs, progress_before=await _progress_all(ctx, jobs))
        if jobs:
            await ctx.note(
                "jobs_recorded", f"{len(jobs)} job(s) on the node: " + ", ".join(j["job_id"] for j in jobs)
            )
    reason = ctx.reason()
    if ctx.config.settings.slurm.node_mapping == "slinky":
        await ctx.note(
            "delegated", "Slinky: the slurm-operator drains the Slurm node when pitcrew cordons it"
        )
        return Done({**ctx.progress, "slurm_nodes": names, "action": "slinky", "reason": reason, "owned": {}})
    owned: dict[str, bool] = dict(ctx.progress.get("owned", {}))
    for name in names:
        if name in owned:
            continue
        state = await scheduler.node(name)
        if state.down or state.drained:
            mine = owns(state.reason, ctx.incident.id)
            owned[name] = mine
            if not mine:
                await ctx.note(
                    "not_owned",
                    f"Slurm node {name} is already {'/'.join(sorted(state.states))} with reason "
                    f"{state.reason!r} set by someone else: left as is, pitcrew will not resume it",
                )
            await ctx.intend(owned=owned)
            continue
        # Also the clock of confirm_resumed's timings: when the node stopped taking the jobs.
        await ctx.intend(
            pending=name, down_at={**ctx.progress.get("down_at", {}), name: ctx.clock().isoformat()}
        )
        if action == "drain":
            await scheduler.drain(name, reason)
        else:
            await scheduler.down(name, reason)
        await ctx.acted(f"slurm_{action}", f"Slurm node {name} set {action.upper()}: {reason}", node=name)
        after = await scheduler.node(name)
        if not (after.down or after.drained) or not owns(after.reason, ctx.incident.id):
            raise TransientError(f"Slurm node {name} not yet {action.upper()}", reason="not_applied")
        owned[name] = True
        await ctx.intend(owned=owned)
    return Done(
        {**ctx.progress, "slurm_nodes": names, "action": action, "reason": reason, "owned": owned},
        f"{action.upper()} {', '.join(names)}",
    )


async def slurm_resume(ctx: StepContext) -> Done | Wait:
    scheduler = ctx.ports.scheduler
    down = ctx.result_of("slurm_down")
    resumed: list[str] = list(ctx.progress.get("resumed", []))
    for name, mine in dict(down.get("owned", {})).items():
        if not mine or name in resumed:
            continue
        state = await scheduler.node(name)
        if not (state.down or state.drained):
            resumed.append(name)
            continue
        if not owns(state.reason, ctx.incident.id):
            await ctx.note("not_owned", f"Slurm node {name} now has reason {state.reason!r}: not resumed")
            continue
        held = await _requeued_jobs_pending(ctx, down)
        if held is not None:
            return held
        await ctx.intend(pending=name)
        await scheduler.resume(name)
        await ctx.acted("slurm_resume", f"Slurm node {name} resumed", node=name)
        after = await scheduler.node(name)
        if after.down or after.drained:
            return Wait(ctx.config.settings.engine.poll_interval.total_seconds(), f"{name} not yet back")
        resumed.append(name)
        await ctx.intend(resumed=resumed)
    uncordoned = await _uncordon_if_ours(ctx)
    return Done({"resumed": resumed, "uncordoned": uncordoned}, f"resumed {', '.join(resumed) or 'nothing'}")


async def _requeued_jobs_pending(ctx: StepContext, down: Mapping[str, Any]) -> Wait | None:
    """Keep the node out until the jobs Slurm requeued from it have started elsewhere.

    A requeued job may start only after a delay (``cred_expire``: 120 s by default), and Slurm
    then takes the first idle node — often the one it just failed on, if pitcrew returned it
    already. The job would never have moved, and ``confirm_resumed`` could not tell a resumed
    job from one stuck on the faulty node. Bounded by the option ``requeue_wait_seconds``
    (default 60): a job that cannot start elsewhere must not keep the node out for ever.
    """
    requeueable = [j for j in down.get("jobs", []) if j.get("requeue", True)]
    if not requeueable:
        return None
    limit = float(ctx.spec.options.get("requeue_wait_seconds", 60))
    since = ctx.progress.get("requeue_wait_since")
    if since is None:
        since = ctx.clock().isoformat()
        await ctx.intend(requeue_wait_since=since)
    if (ctx.clock() - datetime.fromisoformat(since)).total_seconds() >= limit:
        if not ctx.progress.get("requeue_wait_expired"):
            await ctx.intend(requeue_wait_expired=True)
            await ctx.note(
                "requeue_wait_expired", f"requeued job(s) still pending after {limit:g}s: resuming"
            )
        return None
    pending = []
    for job in requeueable:
        snapshot = await ctx.ports.scheduler.job(job["job_id"])
        if snapshot is not None and snapshot.pending:
            pending.append(job["job_id"])
    if not pending:
        return None
    return Wait(
        ctx.config.settings.engine.poll_interval.total_seconds(),
        f"requeued job(s) {', '.join(pending)} not yet started elsewhere: the node stays out until they "
        f"do (at most {limit:g}s)",
    )


async def _uncordon_if_ours(ctx: StepContext) -> bool:
    if not ctx.result_of("cordon").get("owned"):
        return False
    released = await release_cordon(ctx.ports.cluster, ctx.node, ctx.incident.id)
    if released:
        await ctx.acted("uncordon", f"node {ctx.node} uncordoned and untainted", node=ctx.node)
    return released


async def confirm_resumed(ctx: StepContext) -> Done | Wait:
    down = ctx.result_of("slurm_down")
    jobs = [_job_from(j) for j in down.get("jobs", [])]
    if not jobs:
        return Done({"jobs": []}, "no Slurm job was running on the node")
    # A node pitcrew returned to service was repaired: a job running there again has resumed.
    returned = set(ctx.result_of("slurm_resume").get("resumed", []))
    faulty = [n for n in down.get("slurm_nodes", [ctx.node]) if n not in returned]
    before_progress: dict[str, float | None] = down.get("progress_before", {})
    query = ctx.config.settings.resumption.progress_query
    verdicts = []
    first_seen: dict[str, str] = dict(ctx.progress.get("resumed_at", {}))
    reported: list[str] = list(ctx.progress.get("reported", []))
    at_restart: dict[str, float | None] = dict(ctx.progress.get("progress_at_restart", {}))
    restarted: dict[str, datetime | None] = {}
    for job in jobs:
        now_snapshot = await ctx.ports.scheduler.job(job.job_id)
        restarted[job.job_id] = now_snapshot.start_time if now_snapshot is not None else None
        progress_now = await _progress(ctx, job.job_id) if query else None
        baseline = before_progress.get(job.job_id)
        if (
            query
            and now_snapshot is not None
            and now_snapshot.running
            and now_snapshot.restarts > job.restarts
        ):
            # The first sample after the restart may still be the pre-fault run's last one
            # (scraped after the value read before DOWN, before the kill): the job must be
            # seen moving past it too, or a job stuck at its checkpoint would count as resumed.
            at_restart.setdefault(job.job_id, progress_now)
            baseline = max((v for v in (baseline, at_restart[job.job_id]) if v is not None), default=None)
        verdict = judge_resumption(
            job,
            now_snapshot,
            faulty,
            progress_before=baseline,
            progress_now=progress_now,
            progress_required=bool(query) and ctx.config.settings.resumption.require_progress,
        )
        verdicts.append(verdict)
        if verdict.status == "resumed" and job.job_id not in first_seen:
            first_seen[job.job_id] = ctx.clock().isoformat()
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
                )
            )
    await ctx.intend(resumed_at=first_seen, reported=reported, progress_at_restart=at_restart)
    pending = [v for v in verdicts if v.status == "waiting"]
    down_at = _taken_out_at(down)
    summary = [
        {
            "job_id": v.job_id,
            "status": v.status,
            "detail": "running again on the repaired node"
            if v.status == "resumed" and set(v.new_nodes) & set(v.old_nodes)
            else v.detail,
            "old_nodes": list(v.old_nodes),
            "new_nodes": list(v.new_nodes),
            "restarts_before": v.restarts_before,
            "restarts_now": v.restarts_now,
            "progress_before": before_progress.get(v.job_id),
            "progress_at_restart": at_restart.get(v.job_id),
            "progress_now": v.progress_now,
            **_timings(v, down_at, restarted.get(v.job_id), first_seen.get(v.job_id)),
        }
        for v in verdicts
    ]
    if pending:
        detail = "; ".join(f"{v.job_id}: {v.detail}" for v in pending)
        await ctx.intend(last=summary)
        return Wait(ctx.config.settings.engine.poll_interval.total_seconds(), detail)
    resumed = sum(v.status == "resumed" for v in verdicts)
    return Done({"jobs": summary}, f"{resumed} of {len(verdicts)} job(s) running again elsewhere")


def _taken_out_at(down: Mapping[str, Any]) -> datetime | None:
    stamps = [datetime.fromisoformat(t) for t in dict(down.get("down_at", {})).values()]
    return min(stamps, default=None)


def _timings(
    verdict: ResumeVerdict, down_at: datetime | None, restarted: datetime | None, resumed_at: str | None
) -> dict[str, Any]:
    """When the node went out, when Slurm started the job again, when pitcrew saw it resumed."""
    if verdict.status != "resumed" or verdict.restarts_now <= verdict.restarts_before:
        restarted = None  # the start time of a run that is not the restarted one
    resumed = datetime.fromisoformat(resumed_at) if resumed_at else None

    def since_down(moment: datetime | None) -> float | None:
        return round((moment - down_at).total_seconds(), 3) if moment and down_at else None

    return {
        "down_at": down_at.isoformat() if down_at else None,
        "restarted_at": restarted.isoformat() if restarted else None,
        "resumed_at": resumed_at,
        "seconds_to_restart": since_down(restarted),
        "seconds_to_resumed": since_down(resumed),
    }


async def _progress_all(ctx: StepContext, jobs: list[dict[str, Any]]) -> dict[str, float | None]:
    if not ctx.config.settings.resumption.progress_query:
        return {}
    return {j["job_id"]: await _progress(ctx, j["job_id"]) for j in jobs}


async def _progress(ctx: StepContext, job_id: str) -> float | None:
    template = ctx.config.settings.resumption.progress_query
    if not template or ctx.ports.query is None:
        return None
    samples = await ctx.ports.query.instant(template.replace("{job_id}", job_id))
    values = [value for _, value in samples]
    return max(values) if values else None
