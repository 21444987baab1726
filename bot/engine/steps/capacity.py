"""Capacity for a gang job that cannot restart without a node: take one from a pool, give it back.

``capacity`` (job track, once the Slurm node is out) looks at every interrupted job: when
Slurm restarted them elsewhere on its own there is nothing to do; when one is pending for
lack of nodes, it takes a node from the configured pools (``capacity.pools``, the choice is
``bot.domain.capacity.choose``) so the job starts there now, not when the repair is done.
When no node may be taken it says which guards stopped it and waits for the repair, ending
as soon as the job runs again.

``give_back`` (node track, after ``wait_ready`` and before ``slurm_resume``) makes the pool
whole again: the repaired node joins the pool while still out of service, so no pending job
takes it on its way (``give_back: refill``, the default; ``slurm_resume`` then returns it to
service inside the pool), or the lent node returns to the pool once no job runs there
(``give_back: return``).

On Slurm-only sites a pool is a Slurm reservation that holds its nodes apart from the jobs'
partition: taking a node removes it from the reservation, giving back adds one. Every change
is persisted as intent before it is made, audited and counted; rollback returns a taken node
to its reservation while no job has started on it.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import datetime, timedelta

from bot.domain.capacity import Candidate, Choice, Need, Pool, PoolView, Taken, choose
from bot.domain.incident import State
from bot.engine.context import Done, StepContext, StepDeps, StepResult, UndoContext, Wait
from bot.engine.errors import PermanentError, Reason
from bot.engine.ports import Notice, Reservations
from bot.engine.registry import REGISTRY, Track
from bot.engine.steps.slurm import SlurmDownResult
from bot.store import codec

#: Pending reasons that mean "not enough nodes" (``squeue`` %r); others (BeginTime, Priority …)
#: mean Slurm may still start the job by itself.
_LACK_OF_NODES = ("ReqNodeNotAvail", "Resources", "NodeDown", "PartitionNodeLimit")


@dataclass(frozen=True, slots=True)
class CapacityResult(StepResult):
    #: The node chosen (intent, persisted before the reservation changes) and where from.
    node: str | None = None
    pool: str | None = None
    reservation: str | None = None
    why: str = ""
    #: When the node left its pool (``None`` while only intended).
    taken_at: datetime | None = None
    #: Why nothing was taken (the last answer said to humans).
    waiting: str = ""


@dataclass(frozen=True, slots=True)
class GiveBackResult(StepResult):
    #: The node being added to the pool (intent) and when the pool was whole again.
    node: str | None = None
    given_back_at: datetime | None = None
    #: The repair came first, nothing was taken: ``capacity`` takes nothing any more.
    closed: bool = False


def _reservations(deps: StepDeps) -> Reservations:
    scheduler = deps.ports.scheduler
    if not isinstance(scheduler, Reservations):
        raise PermanentError("the scheduler cannot change Slurm reservations", reason=Reason.UNSUPPORTED)
    return scheduler


async def undo_capacity(ctx: UndoContext, result: CapacityResult) -> str | None:
    """Return the taken node to its reservation while no job has started there."""
    if result.node is None or result.reservation is None:
        return None
    reservations = _reservations(ctx.deps)
    held = await reservations.reservation(result.reservation) or ()
    if result.node in held:
        return f"capacity: {result.node} is in reservation {result.reservation}"
    jobs = await ctx.deps.ports.scheduler.jobs_on_node(result.node)
    if jobs:
        return f"capacity: {result.node} left in the partition: job {', '.join(j.job_id for j in jobs)} runs there"
    await reservations.set_reservation_nodes(result.reservation, [*held, result.node])
    ctx.deps.metrics.actions.labels("capacity_return").inc()
    ctx.deps.metrics.capacity_lent.labels(result.pool or "").dec()
    return f"capacity: {result.node} back in reservation {result.reservation}"


@REGISTRY.step(
    CapacityResult,
    state=State.VERIFYING,
    timeout=timedelta(hours=1),
    attempts=3,
    would="take a node from a capacity pool if the interrupted job is pending for lack of nodes",
    undo=undo_capacity,
    mutating=True,
    port="scheduler",
    track=Track.JOB,
    needs=("slurm_down",),
)
async def capacity(ctx: StepContext[CapacityResult]) -> Done[CapacityResult] | Wait:
    if ctx.progress.taken_at is not None:
        return Done(ctx.progress, f"took {ctx.progress.node}")
    if ctx.progress.node is not None:  # intent stored before a crash: finish that take
        return await _take(ctx)
    if not ctx.settings.capacity.pools:
        return Done(replace(ctx.progress, waiting="no pool is configured"), "no pool is configured")
    down = await ctx.result(SlurmDownResult) or SlurmDownResult()
    jobs = down.jobs or ()
    if not jobs:
        return Done(ctx.progress, "no job was interrupted")
    stalled = []
    for before in jobs:
        now = await ctx.ports.scheduler.job(before.job_id)
        if now is None or now.ended_for_good:
            continue
        if now.running:
            continue  # Slurm started it again by itself (on a free node, or the repaired one)
        if now.pending and now.reason.startswith(_LACK_OF_NODES):
            stalled.append(now)
        else:
            return Wait(ctx.poll, f"job {before.job_id} {now.state.lower()} ({now.reason or 'no reason'})")
    if not stalled:
        detail = ctx.progress.waiting and f"no node taken ({ctx.progress.waiting})"
        return Done(ctx.progress, detail or "Slurm restarted the job(s) without a spare")
    async with ctx.deps.capacity_lock:
        back = await ctx.result(GiveBackResult)
        if back is not None and back.closed:
            return Done(ctx.progress, "the repair came first: nothing taken")
        choice = await _choose(ctx, down)
        if choice.node is None or choice.pool is None:
            if choice.why != ctx.progress.waiting:
                await ctx.save(replace(ctx.progress, waiting=choice.why))
                await ctx.note("capacity_none", f"job {stalled[0].job_id} waits for the repair: {choice.why}")
            return Wait(ctx.poll, choice.why)
        pool = next(p for p in ctx.settings.capacity.pools if p.name == choice.pool)
        await ctx.save(
            replace(
                ctx.progress, node=choice.node, pool=pool.name, reservation=pool.reservation, why=choice.why
            )
        )
    return await _take(ctx)


async def _choose(ctx: StepContext[CapacityResult], down: SlurmDownResult) -> Choice:
    reservations = _reservations(ctx.deps)
    scheduler = ctx.ports.scheduler
    taken, busy = await _taken_elsewhere(ctx)
    failed = (down.slurm_nodes or (ctx.node,))[0]
    views = []
    for pool in ctx.settings.capacity.pools:
        held = await reservations.reservation(pool.reservation)
        if held is None:
            raise PermanentError(
                f"pool {pool.name}: no Slurm reservation {pool.reservation}", reason=Reason.MISCONFIGURED
            )
        members = []
        for name in held:
            state = await scheduler.node(name)
            idle = "IDLE" in state.states and state.in_service
            members.append(Candidate(name, idle=idle, gpus=state.gpus, open_incident=name in busy))
        # A Slurm reservation cannot be emptied: it keeps at least one node.
        kept = max(pool.min_idle, 1)
        views.append(PoolView(Pool(pool.name, pool.kind, kept, pool.max_lend), tuple(members)))
    return choose(Need(ctx.incident.id, failed, gpus=down.gpus.get(failed)), views, taken)


async def _taken_elsewhere(ctx: StepContext[CapacityResult]) -> tuple[list[Taken], set[str]]:
    """Nodes other open incidents took (or mean to) and have not given back; their failed nodes."""
    taken, busy = [], set()
    for incident_id, _state, _at in await ctx.deps.store.active():
        if incident_id == ctx.incident.id:
            continue
        other = await ctx.deps.store.incident(incident_id)
        if other is not None:
            busy.add(other.node)
        steps = await ctx.deps.store.steps_of(incident_id)
        record = steps.get("capacity")
        if record is None:
            continue
        took = codec.decode_record(CapacityResult, record.result)
        back = steps.get("give_back")
        returned = back is not None and codec.decode_record(GiveBackResult, back.result).given_back_at
        if took.node and took.pool and not returned:
            taken.append(Taken(took.node, took.pool, incident_id))
    return taken, busy


async def _take(ctx: StepContext[CapacityResult]) -> Done[CapacityResult]:
    node, reservation = ctx.progress.node, ctx.progress.reservation
    assert node is not None and reservation is not None
    reservations = _reservations(ctx.deps)
    held = await reservations.reservation(reservation) or ()
    if node in held:
        await reservations.set_reservation_nodes(reservation, [n for n in held if n != node])
    taken = replace(ctx.progress, taken_at=ctx.clock())
    await ctx.save(taken)
    ctx.deps.metrics.capacity_lent.labels(ctx.progress.pool or "").inc()
    await ctx.acted(
        "capacity_take", f"took {node} out of reservation {reservation}: {ctx.progress.why}", node=node
    )
    await ctx.tell(
        Notice(
            ctx.incident.id,
            "capacity",
            f"{ctx.node}: lent {node} to the stalled job",
            (ctx.progress.why, "It is given back when the repair is done."),
            node=ctx.node,
        )
    )
    return Done(taken, f"took {node} from pool {ctx.progress.pool}")


@REGISTRY.step(
    GiveBackResult,
    state=State.VERIFYING,
    timeout=timedelta(minutes=30),
    attempts=3,
    would="make the capacity pool whole again (the repaired node refills it before it is resumed)",
    undo="the pool is whole again; rolling back leaves it so",
    mutating=True,
    port="scheduler",
    needs=("slurm_down",),
)
async def give_back(ctx: StepContext[GiveBackResult]) -> Done[GiveBackResult] | Wait:
    if ctx.progress.given_back_at is not None:
        return Done(ctx.progress, f"{ctx.progress.node} in the pool")
    if ctx.progress.closed:
        return Done(ctx.progress, "no node was taken")
    async with ctx.deps.capacity_lock:  # a take either happened before this or never will
        took = await ctx.result(CapacityResult)
        if took is None or took.node is None or took.reservation is None:
            await ctx.save(replace(ctx.progress, closed=True))
            return Done(ctx.progress, "no node was taken")
    down = await ctx.result(SlurmDownResult) or SlurmDownResult()
    node = ctx.progress.node
    if node is None:
        repaired = (down.slurm_nodes or (ctx.node,))[0]
        node = repaired if ctx.settings.capacity.give_back == "refill" else took.node
    assert node is not None
    if node == took.node:  # give_back: return — the lent node goes back once its job has left it
        state = await ctx.ports.scheduler.node(node)
        if not ("IDLE" in state.states and state.in_service):
            return Wait(ctx.poll, f"{node} is not idle yet ({'/'.join(sorted(state.states))})")
    await ctx.save(replace(ctx.progress, node=node))
    reservations = _reservations(ctx.deps)
    held = await reservations.reservation(took.reservation) or ()
    if node not in held:
        await reservations.set_reservation_nodes(took.reservation, [*held, node])
    done = replace(ctx.progress, node=node, given_back_at=ctx.clock())
    await ctx.save(done)
    pool = took.pool or ""
    ctx.deps.metrics.capacity_lent.labels(pool).dec()
    away = (ctx.clock() - (took.taken_at or ctx.clock())).total_seconds()
    ctx.deps.metrics.capacity_away.labels(pool).observe(max(away, 0.0))
    await ctx.acted(
        "capacity_give_back",
        f"{node} added to reservation {took.reservation}: pool {pool} whole again after {away:.0f}s",
        node=node,
    )
    return Done(done, f"{node} back in pool {pool}")
