"""Returning the node to service: Slurm RESUME (only where the reason is still this incident's, or
is the DOWN of slurm-operator's preStop hook that pitcrew's own drain, reboot or replacement set
off) and uncordon (only where the node still carries this incident's annotation)."""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import datetime, timedelta

from bot.domain.incident import State
from bot.domain.jobs import SlurmNodeState
from bot.domain.ownership import (
    SLINKY_REASON_PREFIX,
    owns_slurm_reason,
    slinky_prestop_down,
)
from bot.engine.context import Done, StepContext, StepResult, Wait
from bot.engine.errors import PermanentError, Reason
from bot.engine.registry import REGISTRY
from bot.engine.steps.capacity import GiveBackResult
from bot.engine.steps.cluster import CordonResult, DrainResult, release_cordon
from bot.engine.steps.repair import (
    RebootResult,
    ReplaceResult,
    WaitReadyResult,
    left_behind,
    slurm_nodes_back,
)
from bot.engine.steps.slurm import SlurmDownResult, held_out


@dataclass(frozen=True, slots=True)
class SlurmResumeResult(StepResult):
    resumed: tuple[str, ...] = ()
    #: The node being resumed right now (intent).
    pending: str | None = None
    requeue_wait_since: datetime | None = None
    requeue_wait_expired: bool = False
    uncordoned: bool = False
    #: Slurm nodes the preStop hook set DOWN that pitcrew RESUMEd (each once: ``_prestop_down``).
    prestop_resumed: tuple[str, ...] = ()
    #: Slurm nodes of the repaired node Slurm still holds out, with a reason pitcrew may not undo:
    #: the node is not back in service (the summary says so; no ``returned_at``).
    still_out: tuple[str, ...] = ()
    #: When the node was back in service: the node track's end.
    returned_at: datetime | None = None


@REGISTRY.step(
    SlurmResumeResult,
    state=State.VERIFYING,
    timeout=timedelta(minutes=2),
    attempts=5,
    would="RESUME the Slurm node and uncordon it",
    undo="the node is back in service; rolling back leaves it there",
    mutating=True,
    port="scheduler",
    needs=("slurm_down",),
)
async def slurm_resume(ctx: StepContext[SlurmResumeResult]) -> Done[SlurmResumeResult] | Wait:
    scheduler = ctx.ports.scheduler
    down = await ctx.result(SlurmDownResult) or SlurmDownResult()
    # A record the replacement left behind has no slurmd: a RESUME would return a ghost
    # (wait_ready said so in the timeline).
    ready = await ctx.result(WaitReadyResult)
    behind = left_behind(down, ready)
    resumed = list(ctx.progress.resumed)
    names = [name for name, mine in down.owned.items() if mine]
    if ctx.settings.slinky:  # pitcrew took none out itself: the operator's marks are looked at
        names += [name for name in slurm_nodes_back(down, ready) if name not in names]
    terminated = await _pitcrew_ended_the_pod(ctx)
    still_out: list[str] = []
    for name in names:
        if name in resumed or name in behind:
            continue
        try:
            state = await scheduler.node(name)
        except PermanentError as exc:
            if exc.reason != Reason.UNKNOWN_NODE or not await _joined_a_pool(ctx):
                raise
            # The repaired node took the lent node's place in its pool: the NodeSet no longer
            # selects it, its slurmd left and Slurm forgot the node. Nothing to resume.
            await ctx.note("left_slurm", f"Slurm node {name} left with the node, which joined its pool")
            resumed.append(name)
            continue
        if not held_out(state, ctx.incident.id):
            resumed.append(name)
            continue
        prestop = terminated and _prestop_down(ctx, state)
        if not prestop and ctx.settings.slinky and _operator_drain(state):
            continue  # the operator's drain of the cordoned node: its undrain follows the uncordon
        if not prestop and not owns_slurm_reason(state.reason, ctx.incident.id):
            if name not in ctx.progress.still_out:
                await ctx.note(
                    "not_owned",
                    f"Slurm node {name} is {'/'.join(sorted(state.states))} with reason {state.reason!r}, "
                    "not pitcrew's: not resumed, the node stays out of service",
                )
            still_out.append(name)
            await ctx.save(replace(ctx.progress, still_out=tuple(still_out)))
            continue
        held = await _requeued_jobs_pending(ctx, down)
        if held is not None:
            return held
        prestops = ctx.progress.prestop_resumed + ((name,) if prestop else ())
        await ctx.save(replace(ctx.progress, pending=name, prestop_resumed=prestops))
        await scheduler.resume(name)
        why = (
            f" (DOWN {state.reason!r}: slurm-operator's preStop hook, run as pitcrew's repair ended "
            "its slurmd pod; Slurm keeps such a DOWN when the slurmd registers again)"
            if prestop
            else ""
        )
        await ctx.acted("slurm_resume", f"Slurm node {name} resumed{why}", node=name)
        after = await scheduler.node(name)
        if after.taken_out:
            return Wait(ctx.poll, f"{name} not yet back")
        resumed.append(name)
        await ctx.save(replace(ctx.progress, resumed=tuple(resumed)))
    uncordoned = await _uncordon_if_ours(ctx)
    done = replace(
        ctx.progress,
        resumed=tuple(resumed),
        still_out=tuple(still_out),
        uncordoned=uncordoned,
        returned_at=None if still_out else ctx.clock(),
    )
    kept = [n for n in behind if down.owned.get(n)]
    return Done(
        done,
        f"resumed {', '.join(resumed) or 'nothing'}"
        + (f"; {', '.join(kept)} left out: its node was replaced" if kept else "")
        + (f"; {', '.join(still_out)} still out of service, held by another reason" if still_out else ""),
    )


def _prestop_down(ctx: StepContext[SlurmResumeResult], state: SlurmNodeState) -> bool:
    """DOWN by slurm-operator's preStop hook, with its slurmd registered again (``wait_ready``), and
    not RESUMEd by this step before (once: a DOWN that comes back after it is not pitcrew's)."""
    return (
        state.down
        and "NOT_RESPONDING" not in state.states
        and slinky_prestop_down(state.reason)
        and state.name not in ctx.progress.prestop_resumed
    )


def _operator_drain(state: SlurmNodeState) -> bool:
    """A drain slurm-operator made (its prefix, no DOWN): it undrains it when the pod is uncordoned."""
    return not state.down and state.reason.startswith(SLINKY_REASON_PREFIX)


async def _pitcrew_ended_the_pod(ctx: StepContext[SlurmResumeResult]) -> bool:
    """pitcrew's own repair terminated the node's pods, the slurmd pod's preStop hook with them: its
    drain evicted pods, or it rebooted or replaced the node."""
    drained = await ctx.result(DrainResult)
    if drained is not None and drained.evicted:
        return True
    repairs = (await ctx.result(RebootResult), await ctx.result(ReplaceResult))
    return any(r is not None and r.issued for r in repairs)


async def _joined_a_pool(ctx: StepContext[SlurmResumeResult]) -> bool:
    """The give-back put this incident's repaired node into a Kubernetes pool (``refill``)."""
    back = await ctx.result(GiveBackResult)
    return back is not None and back.given_back_at is not None and back.labels is not None


@dataclass(frozen=True, slots=True)
class SlurmReturnedResult(StepResult):
    uncordoned: bool = False
    #: When Slurm showed every Slurm node of the incident back in service.
    returned_at: datetime | None = None


@REGISTRY.step(
    SlurmReturnedResult,
    state=State.VERIFYING,
    timeout=timedelta(days=7),
    attempts=3,
    would="wait until Slurm returns the node (whoever holds its reason), then uncordon it",
    undo="the node is back in service; rolling back leaves it there",
    mutating=True,
    port="scheduler",
    needs=("slurm_down",),
)
async def slurm_returned(ctx: StepContext[SlurmReturnedResult]) -> Done[SlurmReturnedResult] | Wait:
    """For a node someone else took out of Slurm: pitcrew never resumes it (its reason is not
    pitcrew's), it waits for that someone - a person's RESUME, the health check clearing it - and
    then gives the Kubernetes node back, if pitcrew's cordon is still on it."""
    down = await ctx.result(SlurmDownResult) or SlurmDownResult()
    names = list(slurm_nodes_back(down, await ctx.result(WaitReadyResult))) or list(
        await ctx.ports.slurm_names(ctx.node)
    )
    for name in names:
        state = await ctx.ports.scheduler.node(name)
        if not state.in_service:
            shown = "/".join(sorted(state.states))
            return Wait(
                ctx.poll, f"Slurm node {name} is {shown} ({state.reason!r}): waiting for Slurm to return it"
            )
    cordoned = await ctx.result(CordonResult)
    uncordoned = False
    if cordoned is not None and cordoned.owned and ctx.ports.cluster is not None:
        uncordoned = await release_cordon(ctx.ports.cluster, ctx.node, ctx.incident.id)
        if uncordoned:
            await ctx.acted("uncordon", f"node {ctx.node} uncordoned and untainted", node=ctx.node)
    done = replace(ctx.progress, uncordoned=uncordoned, returned_at=ctx.clock())
    return Done(done, f"Slurm returned {', '.join(names)}")


async def _requeued_jobs_pending(ctx: StepContext[SlurmResumeResult], down: SlurmDownResult) -> Wait | None:
    """Keep the node out until the jobs Slurm requeued from it have started elsewhere.

    A requeued job may start only after a delay (``cred_expire``: 120 s by default), and Slurm
    then takes the first idle node — often the one it just failed on, if pitcrew returned it
    already. The job would never have moved, and ``confirm_resumed`` could not tell a resumed
    job from one stuck on the faulty node. Bounded by the option ``requeue_wait_seconds``
    (default 60): a job that cannot start elsewhere must not keep the node out for ever.
    """
    requeueable = [j for j in down.jobs or () if j.requeue]
    if not requeueable:
        return None
    limit = float(ctx.spec.options.get("requeue_wait_seconds", 60))
    since = ctx.progress.requeue_wait_since
    if since is None:
        since = ctx.clock()
        await ctx.save(replace(ctx.progress, requeue_wait_since=since))
    if (ctx.clock() - since).total_seconds() >= limit:
        if not ctx.progress.requeue_wait_expired:
            await ctx.save(replace(ctx.progress, requeue_wait_expired=True))
            await ctx.note(
                "requeue_wait_expired", f"requeued job(s) still pending after {limit:g}s: resuming"
            )
        return None
    pending = []
    for job in requeueable:
        snapshot = await ctx.ports.scheduler.job(job.job_id)
        if snapshot is not None and snapshot.pending:
            pending.append(job.job_id)
    if not pending:
        return None
    return Wait(
        ctx.poll,
        f"requeued job(s) {', '.join(pending)} not yet started elsewhere: the node stays out until they "
        f"do (at most {limit:g}s)",
    )


async def _uncordon_if_ours(ctx: StepContext[SlurmResumeResult]) -> bool:
    cordoned = await ctx.result(CordonResult)
    if cordoned is None or not cordoned.owned or ctx.ports.cluster is None:
        return False
    released = await release_cordon(ctx.ports.cluster, ctx.node, ctx.incident.id)
    if released:
        await ctx.acted("uncordon", f"node {ctx.node} uncordoned and untainted", node=ctx.node)
    return released
