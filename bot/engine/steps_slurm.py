"""Slurm steps: take the node out (after recording its jobs), return it, prove the jobs resumed.

Ownership rule: pitcrew resumes a Slurm node only when its reason still starts with
``pitcrew: <this incident>``. A node someone else downed or drained is left alone and
said so in the timeline.
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from bot.domain.jobs import JobSnapshot, judge_resumption
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
        await ctx.intend(pending=name)
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
    faulty = down.get("slurm_nodes", [ctx.node])
    before_progress: dict[str, float | None] = down.get("progress_before", {})
    query = ctx.config.settings.resumption.progress_query
    verdicts = []
    first_seen: dict[str, str] = dict(ctx.progress.get("resumed_at", {}))
    reported: list[str] = list(ctx.progress.get("reported", []))
    for job in jobs:
        now_snapshot = await ctx.ports.scheduler.job(job.job_id)
        progress_now = await _progress(ctx, job.job_id) if query else None
        verdict = judge_resumption(
            job,
            now_snapshot,
            faulty,
            progress_before=before_progress.get(job.job_id),
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
    await ctx.intend(resumed_at=first_seen, reported=reported)
    pending = [v for v in verdicts if v.status == "waiting"]
    summary = [
        {
            "job_id": v.job_id,
            "status": v.status,
            "detail": v.detail,
            "old_nodes": list(v.old_nodes),
            "new_nodes": list(v.new_nodes),
            "restarts_before": v.restarts_before,
            "restarts_now": v.restarts_now,
            "progress_before": v.progress_before,
            "progress_now": v.progress_now,
            "resumed_at": first_seen.get(v.job_id),
        }
        for v in verdicts
    ]
    if pending:
        detail = "; ".join(f"{v.job_id}: {v.detail}" for v in pending)
        await ctx.intend(last=summary)
        return Wait(ctx.config.settings.engine.poll_interval.total_seconds(), detail)
    resumed = sum(v.status == "resumed" for v in verdicts)
    return Done({"jobs": summary}, f"{resumed} of {len(verdicts)} job(s) running again elsewhere")


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
