"""Human-facing steps: the incident notice that opens a playbook and the summary that closes it."""

from __future__ import annotations

from datetime import datetime

from bot.domain.durations import format_duration
from bot.engine.context import Done, StepContext, Wait
from bot.engine.errors import PitcrewError
from bot.engine.ports import Notice


async def notify(ctx: StepContext) -> Done | Wait:
    if ctx.progress.get("message"):
        return Done(dict(ctx.progress), "already posted")
    plan = ctx.plan
    lines = [f["describe"] for f in plan.get("faults", [])]
    lines += [f"Plan: {plan.get('playbook')} — {' → '.join(plan.get('steps', []))} (mode {plan.get('mode')})"]
    lines += list(plan.get("reasons", []))
    jobs = await _affected_jobs(ctx)
    if jobs:
        lines.append("Slurm jobs on the node: " + ", ".join(jobs))
    actions: tuple[str, ...] = ("rollback",)
    if "approve" in plan.get("steps", []):
        actions = ("approve", "reject", "rollback")
    severity = "critical" if plan.get("acts") else "warning"
    ref = await ctx.tell(
        Notice(
            ctx.incident.id,
            "incident",
            f"{ctx.node}: {plan.get('decisive', {}).get('summary', 'GPU fault')} → {plan.get('playbook')}",
            tuple(lines),
            severity=severity,
            actions=actions,
            node=ctx.node,
        )
    )
    return Done({"message": ref or "posted"}, "humans notified")


async def _affected_jobs(ctx: StepContext) -> list[str]:
    """Best effort: a notice without the job list beats no notice."""
    try:
        names = await ctx.ports.slurm_names(ctx.node)
        return [
            f"{job.job_id} ({job.name}, {job.user})"
            for name in names
            for job in await ctx.ports.scheduler.jobs_on_node(name)
        ]
    except PitcrewError:
        return []


async def close(ctx: StepContext) -> Done | Wait:
    now = ctx.clock()
    start = ctx.incident.first_alert_at or ctx.incident.opened_at
    recovery = now - start
    lines = [f"{name}: {_outcome(ctx, name)}" for name in ctx.plan.get("steps", []) if name != "close"]
    jobs = ctx.result_of("confirm_resumed").get("jobs", [])
    for job in jobs:
        lines.append(
            f"job {job['job_id']}: {job['status']} — {', '.join(job['old_nodes'])} → "
            f"{', '.join(job['new_nodes']) or '-'} (restarts {job['restarts_before']} → {job['restarts_now']})"
        )
    if ctx.plan.get("acts"):
        ctx.metrics.time_to_recovery.labels(ctx.incident.playbook or "unknown").observe(
            recovery.total_seconds()
        )
    if ctx.plan.get("playbook") != "ignore":
        await ctx.tell(
            Notice(
                ctx.incident.id,
                "summary",
                f"{ctx.node}: {ctx.plan.get('playbook')} finished in {format_duration(recovery)}",
                tuple(lines),
                node=ctx.node,
            )
        )
    return Done(
        {"time_to_recovery_seconds": recovery.total_seconds()}, f"closed after {format_duration(recovery)}"
    )


def _outcome(ctx: StepContext, step: str) -> str:
    record = ctx.steps.get(step)
    if record is None:
        return "not run"
    took = ""
    if isinstance(record.started_at, datetime) and isinstance(record.ended_at, datetime):
        took = f" in {format_duration(record.ended_at - record.started_at)}"
    return f"{record.status}{took}"
