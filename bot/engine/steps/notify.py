"""Human-facing steps: the incident notice that opens a playbook and the summary that closes it."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from bot.domain.durations import format_duration
from bot.domain.goodput import Goodput, alert_age
from bot.domain.incident import State
from bot.engine import trust
from bot.engine.context import Done, StepContext, StepResult, Wait
from bot.engine.errors import PitcrewError
from bot.engine.ports import Notice
from bot.engine.registry import REGISTRY
from bot.engine.steps import cost
from bot.engine.steps.back import SlurmResumeResult
from bot.engine.steps.repair import (
    ReplaceResult,
    WaitReadyResult,
    left_behind,
    look_at_old_node,
    slurm_nodes_back,
    tell_old_node_held,
)
from bot.engine.steps.resumed import ConfirmResumedResult
from bot.engine.steps.slurm import SlurmDownResult
from bot.store import codec
from bot.store.base import StepRecord, Store


@dataclass(frozen=True, slots=True)
class NotifyResult(StepResult):
    message: str | None = None


@REGISTRY.step(
    NotifyResult,
    state=State.GUARDED,
    timeout=timedelta(seconds=30),
    attempts=5,
    would="post the incident notice",
    undo="a posted message is not taken back; the rollback notice follows it",
    in_observe=True,
    port="notifier",
)
async def notify(ctx: StepContext[NotifyResult]) -> Done[NotifyResult] | Wait:
    if ctx.progress.message:
        return Done(ctx.progress, "already posted")
    plan = ctx.plan
    lines = [f.describe() for f in plan.faults]
    lines += [f"Plan: {plan.playbook} — {' → '.join(plan.steps)} (mode {plan.mode.value})"]
    lines += list(plan.reasons)
    jobs = await _affected_jobs(ctx)
    if jobs:
        lines.append("Slurm jobs on the node: " + ", ".join(jobs))
    actions: tuple[str, ...] = ("rollback",) if plan.runs_mutating_steps else ()
    if "approve" in plan.steps:
        actions = ("approve", "reject", *actions)
    ref = await ctx.tell(
        Notice(
            ctx.incident.id,
            "incident",
            f"{ctx.node}: {plan.summary if plan.decisive else 'GPU fault'} → {plan.playbook}",
            tuple(lines),
            severity="critical" if plan.acts else "warning",
            actions=actions,
            node=ctx.node,
        ),
        key="incident",
    )
    return Done(NotifyResult(ref or "posted"), "humans notified")


async def _affected_jobs(ctx: StepContext[NotifyResult]) -> list[str]:
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


#: An alert older than this at its first delivery is worth a line in the summary.
ALERT_AGE_SHOWN = 60.0


@dataclass(frozen=True, slots=True)
class CloseResult(StepResult):
    time_to_recovery_seconds: float | None = None
    #: From the first delivery to every interrupted job running again (the job track's end).
    time_to_job_running_seconds: float | None = None
    #: From the first delivery to the node back in service (the node track's end).
    time_to_node_back_seconds: float | None = None
    #: From the first delivery to the node out of Slurm (DOWN or DRAIN set by pitcrew).
    time_to_out_of_service_seconds: float | None = None
    #: What the fault cost in GPU-hours, node and jobs (``bot.domain.goodput``).
    goodput: Goodput | None = None
    #: How long the alert had been firing before the first delivery (reported apart, not counted).
    alert_age_seconds: float = 0.0


#: The store's key for the old nodes watched after ``close`` (``Store.memory``, ``bot.engine.old_nodes``).
WATCH_AFTER_CLOSE = "old_nodes"

#: How long after ``close`` an old node still going is looked at: past the six minutes after which
#: Kubernetes' attach-detach controller detaches from an unhealthy node, with room for a drain begun late.
AFTER_CLOSE = timedelta(minutes=15)


@dataclass(frozen=True, slots=True)
class Leaving:
    """An old node watched after its incident closed: the handle of the replacement that took it
    away, and until when it is looked at."""

    node: str
    handle: str
    until: datetime


async def watch_after_close(store: Store, incident_id: str, node: str, handle: str, now: datetime) -> None:
    """Hand the incident's old node to the watch, from ``close``."""
    leaving = Leaving(node, handle, now + AFTER_CLOSE)
    await store.remember(WATCH_AFTER_CLOSE, {incident_id: codec.encode_record(leaving)}, now)


async def _old_node_held_at_close(
    ctx: StepContext[CloseResult], replaced: ReplaceResult | None, ready: WaitReadyResult | None
) -> str | None:
    """One more look at the node a replacement took away, unless ``wait_ready`` saw it gone: a hang
    of its repair system (``look_at_old_node``) may show only after the successor was Ready, when
    the successor came at once (a NodeSet's pod landing on an existing node) or Karpenter's drain
    or detach has not stalled long enough to tell yet. What holds it now, told if ``wait_ready``
    did not tell it, for the summary. A node still going (or a failed look) is handed to the watch
    after close (``bot.engine.old_nodes``), which tells a hang that shows later. Nothing waits on it."""
    cluster = ctx.ports.cluster
    if cluster is None or replaced is None or not replaced.issued or not replaced.handle:
        return None
    if ready is not None and ready.old_node_gone:
        return None
    look = await look_at_old_node(ctx, cluster, replaced.handle)
    if look is None or look.held is None:
        if look is None or not look.gone:  # still going: looked at for a while after (``old_nodes``)
            await watch_after_close(ctx.deps.store, ctx.incident.id, ctx.node, replaced.handle, ctx.clock())
        return None
    if ready is None or ready.termination_held is None:
        await tell_old_node_held(ctx, look.held)
    return look.held


@REGISTRY.step(
    CloseResult,
    state=State.VERIFYING,
    timeout=timedelta(seconds=30),
    attempts=5,
    would="post the summary",
    undo="closing changes nothing",
    in_observe=True,
    port="notifier",
)
async def close(ctx: StepContext[CloseResult]) -> Done[CloseResult] | Wait:
    now = ctx.clock()
    start = ctx.incident.opened_at  # the first delivery: when pitcrew could first have acted
    recovery = _since(start, now)
    age = alert_age(ctx.incident.first_alert_at, start)
    facts = await ctx.results()  # one read: the summary says what one moment shows
    lines = [f"{name}: {_outcome(facts.records.get(name))}" for name in ctx.plan.steps if name != "close"]
    confirmed = facts.of(ConfirmResumedResult)
    resumed = facts.of(SlurmResumeResult)
    down = facts.of(SlurmDownResult)
    job_running = _since(start, confirmed.confirmed_at) if confirmed and confirmed.confirmed_at else None
    node_back = _since(start, resumed.returned_at) if resumed and resumed.returned_at else None
    taken_out = down.taken_out_at if down else None
    out_of_service = _since(start, taken_out) if taken_out else None
    goodput = cost.account(ctx, facts, now)
    for job in (o.verdict for o in confirmed.jobs) if confirmed else ():
        lines.append(
            f"job {job.job_id}: {job.status} — {', '.join(job.old_nodes)} → "
            f"{', '.join(job.new_nodes) or '-'} (restarts {job.restarts_before} → {job.restarts_now})"
        )
    ready = facts.of(WaitReadyResult)
    behind = left_behind(down, ready)
    if ready is not None and behind:
        lines.append(
            f"Slurm node(s) {', '.join(behind)} left out of service without slurmd: the replacement "
            f"{ready.node} serves {', '.join(slurm_nodes_back(down, ready))}; delete the old record(s) "
            "when nothing needs them"
        )
    held = await _old_node_held_at_close(ctx, facts.of(ReplaceResult), ready)
    if held is not None:
        lines.append(f"the replaced node is not going away: {held}")
    if resumed is not None and resumed.still_out:
        lines.append(
            f"Slurm node(s) {', '.join(resumed.still_out)} still out of service, held by a reason that is "
            "not pitcrew's (see the timeline): the node is not back until whoever set it resumes it"
        )
    if job_running is not None:
        lines.append(f"training running again after {format_duration(timedelta(seconds=job_running))}")
    if node_back is not None:
        lines.append(f"node back in service after {format_duration(timedelta(seconds=node_back))}")
    if goodput is not None:
        lines += cost.lines(goodput)
    if age >= ALERT_AGE_SHOWN:
        lines.append(
            f"the alert had been firing for {format_duration(timedelta(seconds=age))} before pitcrew's first "
            "delivery of it; the times above start at that delivery"
        )
    if ctx.plan.playbook != "ignore":
        await ctx.tell(
            Notice(
                ctx.incident.id,
                "summary",
                f"{ctx.node}: {ctx.plan.playbook} finished in {format_duration(timedelta(seconds=recovery))}",
                tuple(lines),
                node=ctx.node,
            ),
            key="summary",  # not the title: it says how long, which a run after a crash says anew
        )
    # Counted once the summary is out: a notifier error retries the step, and must not count twice.
    playbook = ctx.incident.playbook or "unknown"
    if ctx.plan.acts:
        ctx.deps.metrics.time_to_recovery.labels(playbook).observe(recovery)
        if node_back is not None:
            ctx.deps.metrics.time_to_node_back.labels(playbook).observe(node_back)
            trust.retest_passed(ctx.deps.metrics, ctx.incident)
        if out_of_service is not None:
            ctx.deps.metrics.time_to_out_of_service.labels(playbook).observe(out_of_service)
    if goodput is not None:
        cost.export_for(ctx, goodput)
        await ctx.note(
            "goodput",
            "; ".join(cost.lines(goodput)),
            gpu_hours_lost=round(goodput.gpu_hours_lost, 6),
            job_gpu_hours_lost=round(goodput.job_gpu_hours_lost, 6),
            node_gpus=goodput.node_gpus,
            seconds_out=goodput.seconds_out,
        )
    result = CloseResult(recovery, job_running, node_back, out_of_service, goodput, age)
    return Done(result, f"closed after {format_duration(timedelta(seconds=recovery))}")


def _since(start: datetime, moment: datetime) -> float:
    """Seconds from ``start`` to ``moment``, never negative (clock skew of an alert's startsAt)."""
    return max((moment - start).total_seconds(), 0.0)


def _outcome(record: StepRecord | None) -> str:
    if record is None:
        return "not run"
    took = ""
    if record.started_at is not None and record.ended_at is not None:
        took = f" in {format_duration(record.ended_at - record.started_at)}"
    return f"{record.status}{took}"
