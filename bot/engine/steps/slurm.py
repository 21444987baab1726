"""Taking the node out of Slurm: record its jobs, then DOWN (job already dead) or DRAIN.

Ownership (``bot.domain.ownership``): pitcrew resumes a Slurm node only while its reason
still names this incident. A node someone else downed or drained is left alone and said so
in the timeline.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta

from bot.domain.incident import State
from bot.domain.jobs import JobSnapshot, SlurmNodeState
from bot.domain.ownership import owns_slurm_reason, slurm_reason_owner
from bot.domain.slurm_watch import ALERTNAME, SLURM_FAULT, seen_jobs
from bot.engine.context import Done, StepContext, StepResult, UndoContext, Wait
from bot.engine.errors import Reason, TransientError
from bot.engine.registry import REGISTRY
from bot.engine.steps.training import progress_of


def down_while_busy(state: SlurmNodeState, incident_id: str) -> bool:
    """A node this incident set DOWN while its CPUs are still allocated (its job being killed).

    Slurm's client library reports such a node MIXED or ALLOCATED, without DOWN: ``slurm_load_node``
    replaces the base state (DOWN is one) by MIXED when some CPUs are in use (``_set_node_mixed``,
    src/api/node_info.c). slurmrestd 24.11 shows this for a moment after the update; the reason,
    naming this incident, says the DOWN was applied. Flags such as DRAIN survive, so only DOWN needs it.
    """
    return state.busy and owns_slurm_reason(state.reason, incident_id)


def held_out(state: SlurmNodeState, incident_id: str) -> bool:
    """Out of service by a node update (``taken_out``), this incident's DOWN included while Slurm
    still shows the node busy (``down_while_busy``): what the DOWN or DRAIN made, and a RESUME undoes."""
    return state.taken_out or down_while_busy(state, incident_id)


@dataclass(frozen=True, slots=True)
class SlurmDownResult(StepResult):
    #: The Slurm node(s) the Kubernetes node carries.
    slurm_nodes: tuple[str, ...] | None = None
    #: Jobs running on them, recorded *before* DOWN (afterwards Slurm no longer says where they ran).
    jobs: tuple[JobSnapshot, ...] | None = None
    progress_before: Mapping[str, float | None] = field(default_factory=dict)
    #: Slurm node → whether pitcrew took it (False: someone else had already).
    owned: Mapping[str, bool] = field(default_factory=dict)
    #: The node being taken right now (intent, persisted before the call).
    pending: str | None = None
    #: When each node stopped taking jobs: the clock of the resumption timings.
    down_at: Mapping[str, datetime] = field(default_factory=dict)
    #: GPUs each Slurm node lists in its Gres (what goes out of service; ``bot.domain.goodput``).
    gpus: Mapping[str, int] = field(default_factory=dict)
    action: str = ""
    reason: str = ""

    @property
    def taken_out_at(self) -> datetime | None:
        return min(self.down_at.values(), default=None)


async def undo_slurm_down(ctx: UndoContext, result: SlurmDownResult) -> str:
    """RESUME every node whose reason is still this incident's; leave the others as they are, and
    a record the node's replacement left behind (its slurmd gone with the old machine), or may have
    (a replacement under way whose Slurm nodes are not known yet: ``served_at_rollback``)."""
    from bot.engine.steps.repair import (  # repair imports this
        left_behind,
        served_at_rollback,
        slurm_nodes_back,
    )

    scheduler = ctx.deps.ports.scheduler
    names = list(result.slurm_nodes or ()) or list(result.owned)
    if not names and result.pending:
        names = [result.pending]
    ready, unknown = await served_at_rollback(ctx)
    behind = left_behind(result, ready)
    lines = []
    for name in names:
        if unknown:
            lines.append(
                f"{name} left as it is: the node was replaced, and the Slurm node(s) its replacement "
                f"serves are not known yet (node_mapping {ctx.deps.settings.node_mapping} reads them "
                f"from the node, and a new node may serve a new name); resume {name} by hand if its "
                "slurmd comes back"
            )
            continue
        if name in behind:
            serving = ", ".join(slurm_nodes_back(result, ready))
            lines.append(f"{name} left as it is: the node's replacement serves {serving}, not {name}")
            continue
        state = await scheduler.node(name)
        if not state.taken_out:
            lines.append(f"{name} already in service")
        elif owns_slurm_reason(state.reason, ctx.incident.id):
            await scheduler.resume(name)
            ctx.count("slurm_resume")
            lines.append(f"{name} resumed")
        else:
            owner = slurm_reason_owner(state.reason)
            whose = f"belongs to pitcrew incident {owner}" if owner else "is not pitcrew's"
            lines.append(f"{name} left {'/'.join(sorted(state.states))} (reason {state.reason!r} {whose})")
    return "slurm_down: " + "; ".join(lines or ["no Slurm node was taken"])


@REGISTRY.step(
    SlurmDownResult,
    state=State.RUNNING,
    timeout=timedelta(seconds=60),
    attempts=5,
    would="set the Slurm node {action} with pitcrew's reason (after recording its jobs)",
    undo=undo_slurm_down,
    mutating=True,
    destructive=True,
    port="scheduler",
)
async def slurm_down(ctx: StepContext[SlurmDownResult]) -> Done[SlurmDownResult] | Wait:
    scheduler = ctx.ports.scheduler
    action = ctx.plan.slurm_action if ctx.plan.slurm_action != "none" else "down"
    names = ctx.progress.slurm_nodes
    if names is None:
        names = tuple(await ctx.ports.slurm_names(ctx.node))
        await ctx.save(replace(ctx.progress, slurm_nodes=names))
    if ctx.progress.jobs is None:
        # Before DOWN: afterwards Slurm no longer says where a requeued job ran.
        jobs = tuple([job for name in names for job in await scheduler.jobs_on_node(name)])
        gone = await _seen_before_slurm_took_it(ctx, names, {j.job_id for j in jobs})
        progress = await progress_of(ctx.deps, [j.job_id for j in (*jobs, *gone)])
        await ctx.save(replace(ctx.progress, jobs=(*jobs, *gone), progress_before=progress))
        if jobs:
            await ctx.note(
                "jobs_recorded", f"{len(jobs)} job(s) on the node: " + ", ".join(j.job_id for j in jobs)
            )
        if gone:
            await ctx.note(
                "jobs_recorded",
                f"{len(gone)} job(s) Slurm took off the node when it set it out, as the Slurm watch saw "
                "them there before: " + ", ".join(f"{j.job_id} (restarts {j.restarts})" for j in gone),
            )
    reason = ctx.reason()
    if ctx.settings.slinky:
        await ctx.note(
            "delegated", "Slinky: the slurm-operator drains the Slurm node when pitcrew cordons it"
        )
        return Done(replace(ctx.progress, slurm_nodes=names, action="slinky", reason=reason, owned={}))
    owned = dict(ctx.progress.owned)
    for name in names:
        if name in owned:
            continue
        state = await scheduler.node(name)
        if state.gpus is not None:
            await ctx.save(replace(ctx.progress, gpus={**ctx.progress.gpus, name: state.gpus}))
        if held_out(state, ctx.incident.id):
            mine = owns_slurm_reason(state.reason, ctx.incident.id)
            owned[name] = mine
            if mine and action == "down" and not state.drained:
                # This incident's DOWN reached Slurm and its DRAIN did not (the process stopped
                # between the two updates ``Scheduler.down`` makes): only the DRAIN keeps the node
                # out when its slurmd registers again under ReturnToService=2. Finish it.
                await scheduler.drain(name, reason)
                await ctx.note("drain_completed", f"Slurm node {name}: DRAIN added to this incident's DOWN")
            if not mine:
                await ctx.note(
                    "not_owned",
                    f"Slurm node {name} is already {'/'.join(sorted(state.states))} with reason "
                    f"{state.reason!r} set by someone else: left as is, pitcrew will not resume it",
                )
            await ctx.save(replace(ctx.progress, owned=dict(owned)))
            continue
        if ctx.plan.decisive is not None and ctx.plan.decisive.kind == SLURM_FAULT:
            # Slurm took the node out and has given it back already: pitcrew adds no reason of its own.
            owned[name] = False
            await ctx.note("not_owned", f"Slurm node {name} is back in service: left as is")
            await ctx.save(replace(ctx.progress, owned=dict(owned)))
            continue
        down_at = {**ctx.progress.down_at, name: ctx.clock()}
        await ctx.save(replace(ctx.progress, pending=name, down_at=down_at))
        if action == "drain":
            await scheduler.drain(name, reason)
        else:
            await scheduler.down(name, reason)
        await ctx.acted(f"slurm_{action}", f"Slurm node {name} set {action.upper()}: {reason}", node=name)
        after = await scheduler.node(name)
        applied = held_out(after, ctx.incident.id)
        if not applied or not owns_slurm_reason(after.reason, ctx.incident.id):
            raise TransientError(
                f"Slurm node {name} not yet {action.upper()} (reads {'+'.join(sorted(after.states))}, "
                f"reason {after.reason[:80]!r})",
                reason=Reason.NOT_APPLIED,
            )
        owned[name] = True
        await ctx.save(replace(ctx.progress, owned=dict(owned)))
    done = replace(ctx.progress, slurm_nodes=names, action=action, reason=reason, owned=owned)
    return Done(done, f"{action.upper()} {', '.join(names)}")


async def _seen_before_slurm_took_it(
    ctx: StepContext[SlurmDownResult], names: tuple[str, ...], found: set[str]
) -> tuple[JobSnapshot, ...]:
    """Jobs Slurm's own DOWN took off the node before this step looked (requeued: PENDING with no
    node list; or ended ``NODE_FAIL``): those the Slurm watch saw there at its last look while the
    node was in service (its record's ``slurm_jobs``), as they were then: RUNNING there, with the
    restart count they had. A job Slurm no longer knows (``MinJobAge`` passed) is left out."""
    seen: dict[tuple[str, str], int] = {}
    for alert in await ctx.deps.store.alerts_of(ctx.incident.id):
        if alert.alertname == ALERTNAME and alert.node in names:
            seen.update({(job_id, alert.node): n for job_id, n in seen_jobs(alert.annotations).items()})
    gone = []
    for (job_id, node), restarts in seen.items():
        if job_id in found:
            continue
        now = await ctx.ports.scheduler.job(job_id)
        if now is not None:
            gone.append(replace(now, state="RUNNING", nodes=(node,), restarts=restarts, reason=""))
            found.add(job_id)
    return tuple(gone)
