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

import asyncio
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from datetime import datetime, timedelta

from bot import logger
from bot.config import PoolSettings
from bot.domain.capacity import Candidate, Choice, Need, Pool, PoolView, Taken, choose
from bot.domain.durations import format_duration
from bot.domain.incident import State
from bot.domain.jobs import JobSnapshot
from bot.domain.ownership import lent_prior
from bot.domain.policy import NodePolicy
from bot.engine.context import Done, Kept, Ports, StepContext, StepDeps, StepResult, UndoContext, Wait
from bot.engine.errors import PermanentError, Reason
from bot.engine.metrics import Metrics
from bot.engine.ports import Notice, Reservations, Scheduler
from bot.engine.registry import REGISTRY, Track
from bot.engine.steps import lending
from bot.engine.steps.repair import WaitReadyResult, slurm_nodes_back
from bot.engine.steps.slurm import SlurmDownResult
from bot.store import codec
from bot.store.base import NOT_STANDING, StepRecord, Store

log = logger(__name__)

#: Pending reasons that mean "not enough nodes" (``squeue`` %r); others (BeginTime, Priority …)
#: mean Slurm may still start the job by itself. The partition's other nodes DOWN or DRAINED (a
#: Kubernetes pool's nodes, outside the NodeSet) reads ``Nodes_required_for_job_are_DOWN,_DRAINED_or_
#: reserved_for_jobs_in_higher_priority_partitions`` in ``scontrol``, with spaces in ``squeue``.
_LACK_OF_NODES = (
    "ReqNodeNotAvail",
    "Resources",
    "NodeDown",
    "PartitionNodeLimit",
    "Nodes_required_for_job_are_DOWN",
    "Nodes required for job are DOWN",
)
#: The label by which a node opts out of pitcrew (the guards' default): never lent either.
OPT_OUT_LABEL: str = NodePolicy.model_fields["opt_out_label"].default


@dataclass(frozen=True, slots=True)
class CapacityResult(StepResult):
    #: The node chosen (intent, persisted before the reservation changes) and where from.
    node: str | None = None
    pool: str | None = None
    reservation: str | None = None
    why: str = ""
    #: When the node left its pool (``None`` while only intended).
    taken_at: datetime | None = None
    #: Why nothing was taken (the last answer said to humans), and how many answers were said.
    waiting: str = ""
    told_waiting: int = 0
    #: Kubernetes pools: when the lender's pods were gone, the taken node's Slurm name, and when
    #: its slurmd was registered and IDLE (the take is done only then).
    evicted_at: datetime | None = None
    #: When the NodeSet's labels were set (after the lender's pods left: never a job beside them).
    relabelled_at: datetime | None = None
    slurm_node: str | None = None
    joined_at: datetime | None = None
    #: Nodes whose take was given up (a budget held past ``evict_grace``): not chosen again.
    passed_over: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class GiveBackResult(StepResult):
    #: The node being added to the pool (intent) and when the pool was whole again.
    node: str | None = None
    given_back_at: datetime | None = None
    #: The repair came first, nothing was taken: ``capacity`` takes nothing any more.
    closed: bool = False
    #: Kubernetes pools, ``refill``: the labels the repaired node takes to join the pool that lent.
    labels: dict[str, str | None] | None = None
    #: ``return``: since when the give-back waits for the jobs to leave the lent node.
    return_wait_since: datetime | None = None
    #: ``return``: the jobs stayed past ``return_wait``, so the repaired node refilled the pool.
    refilled_instead: bool = False


def _reservations(deps: StepDeps) -> Reservations:
    return reservations_of(deps.ports.scheduler)


def reservations_of(scheduler: Scheduler) -> Reservations:
    if not isinstance(scheduler, Reservations):
        raise PermanentError("the scheduler cannot change Slurm reservations", reason=Reason.UNSUPPORTED)
    return scheduler


async def _move(deps: StepDeps, reservation: str, node: str, *, into: bool) -> bool:
    """Put ``node`` into (or take it out of) ``reservation``: one read-modify-write of its node list,
    under the capacity lock, so two incidents giving back (or taking) at once never each write the
    list they read and lose the other's node. ``False``: it already was where asked."""
    reservations = _reservations(deps)
    async with deps.capacity_lock:
        held = await reservations.reservation(reservation) or ()
        if (node in held) == into:
            return False
        await reservations.set_reservation_nodes(
            reservation, [*held, node] if into else [n for n in held if n != node]
        )
        return True


def _pool(
    ctx: StepContext[CapacityResult] | StepContext[GiveBackResult] | UndoContext, name: str | None
) -> PoolSettings:
    for pool in ctx.deps.settings.capacity.pools:
        if pool.name == name:
            return pool
    raise PermanentError(f"pool {name} is no longer configured", reason=Reason.MISCONFIGURED)


async def undo_capacity(ctx: UndoContext, result: CapacityResult) -> str | Kept | None:
    """Return the taken node to its pool while no job runs there; kept (``Kept``) while one does,
    so a rollback asked again once it has ended returns it."""
    if result.node is None:
        return None
    if result.reservation is None:
        return await _undo_lend(ctx, result)
    held = await _reservations(ctx.deps).reservation(result.reservation) or ()
    if result.node in held:
        return f"capacity: {result.node} is in reservation {result.reservation}"
    jobs = await ctx.deps.ports.scheduler.jobs_on_node(result.node)
    if jobs:
        return Kept(f"capacity: {result.node} left in the partition: {_runs_there(jobs)}")
    if not await _move(ctx.deps, result.reservation, result.node, into=True):
        return f"capacity: {result.node} is in reservation {result.reservation}"
    ctx.deps.metrics.actions.labels("capacity_return").inc()
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
    if ctx.progress.node is not None:  # a take under way (or intent stored before a crash): finish it
        if ctx.progress.reservation is None:
            return await _take_lent(ctx)
        if ctx.progress.taken_at is not None:
            await _told(ctx)  # told once: a crash may have come between the take's record and its notice
            return Done(ctx.progress, f"took {ctx.progress.node}")
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
        if now.running and now.state != "COMPLETING" and now.restarts > before.restarts:
            continue  # Slurm started it again by itself (on a free node, or the repaired one)
        # Still RUNNING with the same restart count is the interrupted run, not yet requeued (Slurm
        # kills it a moment after DOWN): wait for it like any other state that is not a stall.
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
                # Said, then saved: a crash between says it again under the same key, which the
                # outbox posts once. Each change of reason is its own notice: the same reason may
                # come back.
                told = ctx.progress.told_waiting + 1
                await ctx.tell(
                    Notice(
                        ctx.incident.id,
                        "capacity",
                        f"{ctx.node}: no node to lend; job {stalled[0].job_id} waits for the repair",
                        (choice.why,),
                        node=ctx.node,
                    ),
                    key=f"waiting:{told}",
                )
                await ctx.save(replace(ctx.progress, waiting=choice.why, told_waiting=told))
                await ctx.note("capacity_none", f"job {stalled[0].job_id} waits for the repair: {choice.why}")
            return Wait(ctx.poll, choice.why)
        pool = next(p for p in ctx.settings.capacity.pools if p.name == choice.pool)
        await ctx.save(
            replace(
                ctx.progress, node=choice.node, pool=pool.name, reservation=pool.reservation, why=choice.why
            )
        )
    if pool.reservation is None:
        return await _take_lent(ctx)
    return await _take(ctx)


async def _take_lent(ctx: StepContext[CapacityResult]) -> Done[CapacityResult] | Wait:
    """A take from a Kubernetes pool, one stage a pass (``bot.engine.steps.lending``)."""
    pool = _pool(ctx, ctx.progress.pool)
    node = ctx.progress.node
    if ctx.progress.joined_at is not None:
        await _told(ctx, _joined(ctx.progress))  # told once: a crash may have come before it was
        return Done(ctx.progress, f"took {node}")
    progress, waiting = await lending.take(
        ctx, pool, lent=lambda: lent_changed(ctx.deps), kept=lambda: _kept_with_the_jobs(ctx)
    )
    if waiting is None:
        await _told(ctx, _joined(progress))
        return Done(progress, f"took {node} from pool {pool.name}")
    if not waiting.startswith("gave up"):
        return Wait(ctx.poll, waiting)
    assert node is not None
    await lending.lending(ctx.deps).lend_back(node, incident_id=ctx.incident.id)
    await ctx.acted("capacity_return", f"{node} handed back to pool {pool.name}: {waiting}", node=node)
    await ctx.save(
        replace(
            CapacityResult(),
            passed_over=(*progress.passed_over, node),
            waiting=f"{node} {waiting}",
            told_waiting=progress.told_waiting,
        )
    )
    await lent_changed(ctx.deps)
    return Wait(ctx.poll, waiting)


def _joined(progress: CapacityResult) -> str:
    return f"{progress.node} joined the job's partition as Slurm node {progress.slurm_node}"


async def _told(ctx: StepContext[CapacityResult], *done: str) -> None:
    """The lend, told once per run of the step (its key names the node lent)."""
    await ctx.tell(
        Notice(
            ctx.incident.id,
            "capacity",
            f"{ctx.node}: lent {ctx.progress.node} to the stalled job",
            (ctx.progress.why, *done, "It is given back when the repair is done."),
            node=ctx.node,
        ),
        key=f"lent:{ctx.progress.node}",
    )


async def _kept_with_the_jobs(ctx: StepContext[CapacityResult]) -> bool:
    """The give-back has kept the taken node with the jobs (``refill``), the repaired node in its
    place: it ran while the take was still under way (it waits for ``taken_at`` only)."""
    back = await ctx.result(GiveBackResult)
    return back is not None and back.given_back_at is not None and back.node != ctx.progress.node


def _runs_there(jobs: Sequence[JobSnapshot]) -> str:
    return f"job {', '.join(j.job_id for j in jobs)} runs there"


async def _undo_lend(ctx: UndoContext, result: CapacityResult) -> str | Kept | None:
    assert result.node is not None
    if result.slurm_node is not None:
        jobs = await ctx.deps.ports.scheduler.jobs_on_node(result.slurm_node)
        if jobs:
            return Kept(f"capacity: {result.node} left with the jobs: {_runs_there(jobs)}")
    left = None
    if result.relabelled_at is not None:  # the join ran: its command is undone first
        left = await lending.leave(ctx.deps, _pool(ctx, result.pool), result.node, ctx.incident.id)
    if not await lending.lending(ctx.deps).lend_back(result.node, incident_id=ctx.incident.id):
        return f"capacity: {result.node} is not lent to this incident"
    if left is not None:
        ctx.deps.metrics.actions.labels("capacity_leave_command").inc()
        return f"capacity: {result.node} left the partition{lending.said(left)}; back in pool {result.pool}"
    ctx.deps.metrics.actions.labels("capacity_return").inc()
    return f"capacity: {result.node} back in pool {result.pool}"


async def _choose(ctx: StepContext[CapacityResult], down: SlurmDownResult) -> Choice:
    taken, busy = await taken_elsewhere(ctx.deps.store, ctx.incident.id)
    failed = (down.slurm_nodes or (ctx.node,))[0]
    pools = ctx.settings.capacity.pools
    views = await pool_views(ctx.ports, pools, busy, passed_over=ctx.progress.passed_over)
    for view in views:
        spare = [m for m in view.members if m.idle]
        ctx.deps.metrics.capacity_idle.labels(view.pool.name).set(len(spare))
        ctx.deps.metrics.capacity_idle_gpus.labels(view.pool.name).set(sum(m.gpus or 0 for m in spare))
    need = await need_of(ctx.ports, pools, ctx.incident.id, ctx.node, failed, down.gpus.get(failed))
    return choose(need, views, taken)


async def need_of(
    ports: Ports, pools: Sequence[PoolSettings], incident_id: str, node: str, failed: str, gpus: int | None
) -> Need:
    """What the failed node was: its Slurm node ``failed`` with ``gpus`` GPUs, and (where a pool is
    a Kubernetes selector) its GPU model from the Kubernetes node ``node``."""
    gpu_type = None
    if ports.cluster is not None and any(pool.reservation is None for pool in pools):
        facts = await ports.cluster.node(node)
        gpu_type = facts.labels.get(lending.GPU_PRODUCT_LABEL) if facts else None
    return Need(incident_id, failed, gpu_type=gpu_type, gpus=gpus)


async def pool_views(
    ports: Ports, pools: Sequence[PoolSettings], busy: set[str], *, passed_over: Sequence[str] = ()
) -> list[PoolView]:
    """Each pool and its members now, as ``choose`` sees them: read only. The one read of the pools,
    for the step's choice and for ``pitcrew plan --live`` (``bot.report``), so both say the same."""
    views = []
    for pool in pools:
        if pool.reservation is None:
            found = await lending.view(lending.lender_of(ports.cluster), pool, busy, OPT_OUT_LABEL)
            left = tuple(m for m in found.members if m.name not in passed_over)
            views.append(replace(found, members=left))
            continue
        held = await reservations_of(ports.scheduler).reservation(pool.reservation)
        if held is None:
            raise PermanentError(
                f"pool {pool.name}: no Slurm reservation {pool.reservation}", reason=Reason.MISCONFIGURED
            )
        members = []
        for name in held:
            state = await ports.scheduler.node(name)
            idle = "IDLE" in state.states and state.in_service
            members.append(Candidate(name, idle=idle, gpus=state.gpus, open_incident=name in busy))
        # A Slurm reservation cannot be emptied: it keeps at least one node.
        kept = max(pool.min_idle, 1)
        views.append(PoolView(Pool(pool.name, pool.kind, kept, pool.max_lend), tuple(members)))
    return views


#: The store's index of ended incidents whose take still holds a node out of its pool (a take a
#: rollback kept, or a failed incident's): ``Store.memory`` under this name, keyed by incident. The
#: pools' guards and the lent gauge count these beside the open incidents (``claimants``).
HELD = "capacity_held"


@dataclass(frozen=True, slots=True)
class Claimant:
    """An incident as the pools see it: an open one with its node, or an ended one whose take still
    holds a node (``node`` ``None``: it has no open incident on it); and its steps' records."""

    id: str
    node: str | None
    steps: dict[str, StepRecord]

    def took(self) -> CapacityResult | None:
        """What its ``capacity`` step took (or means to): ``None`` if it has no such step."""
        record = self.steps.get("capacity")
        return None if record is None else codec.decode_record(CapacityResult, record.result)


async def claimants(store: Store) -> tuple[list[Claimant], list[str]]:
    """Every open incident, its node and its steps read once, and every ended one indexed as holding
    a node (``HELD``) that still does (``lent_out``'s rule); and the indexed ones that no longer do,
    ended (their take given back since, or the incident pruned), for the leader to forget. Read
    only (``pitcrew plan --live`` reads it too)."""
    found, opened = [], set()
    for incident_id, _state, _at in await store.active():
        incident = await store.incident(incident_id)
        found.append(
            Claimant(incident_id, incident.node if incident else None, await store.steps_of(incident_id))
        )
        opened.add(incident_id)
    stale = []
    for incident_id in sorted(await store.memory(HELD)):
        if incident_id in opened:  # indexed as it ends: counted as open until it has
            continue
        ended = Claimant(incident_id, None, await store.steps_of(incident_id))
        if lent_out([ended]):
            found.append(ended)
        else:
            stale.append(incident_id)
    return found, stale


async def hold(store: Store, incident_id: str, now: datetime) -> bool:
    """Index ``incident_id`` under ``HELD`` while its take holds a node out of its pool, and forget
    it once it does not; written only where the index says otherwise. Called before an incident
    ends, so an incident never ends holding a node the index does not name (a crash between the two
    leaves an open incident indexed, which counts once), and again after a rollback undid its steps
    (``lent_changed``). Whether its ``capacity`` step chose a node (what the lent gauge may count)."""
    ending = Claimant(incident_id, None, await store.steps_of(incident_id))
    took = ending.took()
    if took is None:
        return False
    entry = {"pool": took.pool, "node": took.node} if lent_out([ending]) else None
    if (await store.memory(HELD)).get(incident_id) != entry:
        await store.remember(HELD, {incident_id: entry}, now)
    return took.node is not None


def taken_from(opened: Sequence[Claimant], incident_id: str | None) -> tuple[list[Taken], set[str]]:
    """Nodes incidents other than ``incident_id`` took (or mean to) and have not given back, open
    ones' and those ended ones' that still hold a node (``claimants``); the nodes of the open ones
    (each has an open incident)."""
    taken, busy = [], set()
    for other in opened:
        if other.id == incident_id:
            continue
        if other.node is not None:
            busy.add(other.node)
        took = other.took()
        if took is None:
            continue
        back = other.steps.get("give_back")
        returned = back is not None and codec.decode_record(GiveBackResult, back.result).given_back_at
        if took.node and took.pool and not returned:
            taken.append(Taken(took.node, took.pool, other.id))
    return taken, busy


async def taken_elsewhere(store: Store, incident_id: str | None) -> tuple[list[Taken], set[str]]:
    """``taken_from`` the incidents as the store holds them now (``claimants``)."""
    found, _ = await claimants(store)
    return taken_from(found, incident_id)


def lent_out(opened: Sequence[Claimant]) -> Counter[str]:
    """Nodes out of each pool (``pitcrew_capacity_lent_nodes``), as the store holds them: an
    incident's take recorded (``taken_at``: the node has left its pool, whether or not the step has
    finished since), not given back (``given_back_at``) and not undone. A take given up is saved
    without ``taken_at``; a take only intended has none yet."""
    out: Counter[str] = Counter()
    for incident in opened:
        record = incident.steps.get("capacity")
        if record is None or record.status in NOT_STANDING:
            continue
        took = incident.took()
        if took is None or not took.node or not took.pool or took.taken_at is None:
            continue
        back = incident.steps.get("give_back")
        if back is not None and codec.decode_record(GiveBackResult, back.result).given_back_at is not None:
            continue
        out[took.pool] += 1
    return out


async def show_lent(
    store: Store,
    pools: Sequence[PoolSettings],
    metrics: Metrics,
    lock: asyncio.Lock,
    clock: Callable[[], datetime],
) -> list[Claimant]:
    """Set ``pitcrew_capacity_lent_nodes`` to what the store holds (``lent_out``): its only
    setter, but for the 0 a process sets when it stops leading. Each change is saved before it is
    shown (``lent_changed``), and each show reads and sets under ``lock``, so the last show to run
    began after every change shown before it: a read taken before a change never overwrites it.
    (Counted up and down where each change was made, a change was lost to a pool read's older
    snapshot, or a take was counted before the store held it, until the next read.) Ended
    incidents indexed as holding a node that no longer do are forgotten. The incidents read
    (``claimants``), for a caller that needs them too (a pool read's ``taken_from``)."""
    async with lock:
        found, stale = await claimants(store)
        out = lent_out(found)
        for pool in pools:
            metrics.capacity_lent.labels(pool.name).set(out[pool.name])
        if stale:
            await store.remember(HELD, dict.fromkeys(stale), clock())
    return found


async def lent_changed(deps: StepDeps, incident_id: str | None = None) -> None:
    """A take, give-back, give-up or undo saved: the lent gauge shown again (``show_lent``), last
    in its step, or of an incident that ended once ``hold`` has said its take chose a node
    (``IncidentFlow._close``). With ``incident_id`` (a rollback undid its steps): only if its
    ``capacity`` step chose a node, its index entry first brought up to date (``hold``: an ended
    incident's take still out is counted until it is given back).

    A failed read is logged, not raised: the change is done and saved, and a retry of its step
    must not skip what comes after it (the next pool read shows the gauge again)."""
    if not deps.settings.capacity.pools:
        return
    try:
        if incident_id is not None and not await hold(deps.store, incident_id, deps.clock()):
            return
        await show_lent(deps.store, deps.settings.capacity.pools, deps.metrics, deps.lent_lock, deps.clock)
    except Exception:
        log.warning("pitcrew_capacity_lent_nodes not shown again: the store was not read", exc_info=True)


async def left_out(store: Store, incident_id: str) -> str | None:
    """What an incident that fails leaves out of a pool, said in its escalation: the node its take
    holds (``lent_out``'s rule), which the lent gauge and the pool's ``max_lend`` go on counting
    after the incident has ended, or ``None``."""
    ending = Claimant(incident_id, None, await store.steps_of(incident_id))
    took = ending.took()
    if took is None or not lent_out([ending]):
        return None
    return (
        f"{took.node}, taken from pool {took.pool} for the stalled job, stays out of it: "
        "pitcrew_capacity_lent_nodes and the pool's max_lend count it until it is back, and a rollback "
        "puts it back once no job runs there (asked while one does, it keeps the node: ask again after)."
    )


async def _take(ctx: StepContext[CapacityResult]) -> Done[CapacityResult]:
    node, reservation = ctx.progress.node, ctx.progress.reservation
    assert node is not None and reservation is not None
    await _move(ctx.deps, reservation, node, into=False)
    taken = replace(ctx.progress, taken_at=ctx.clock())
    await ctx.save(taken)
    await ctx.acted(
        "capacity_take", f"took {node} out of reservation {reservation}: {ctx.progress.why}", node=node
    )
    await lent_changed(ctx.deps)
    await _told(ctx)
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
        if took is None or took.node is None:
            await ctx.save(replace(ctx.progress, closed=True))
            return Done(ctx.progress, "no node was taken")
    if took.reservation is None:
        return await _give_back_lent(ctx, took)
    down = await ctx.result(SlurmDownResult) or SlurmDownResult()
    node = ctx.progress.node
    if node is None:
        # refill: the repaired node joins the reservation, under the Slurm name it came back with
        node = (slurm_nodes_back(down, await ctx.result(WaitReadyResult)) or (ctx.node,))[0]
        if _returning(ctx):
            state = await ctx.ports.scheduler.node(took.node)
            idle = "IDLE" in state.states and state.in_service
            busy = None if idle else f"{took.node} is not idle yet ({'/'.join(sorted(state.states))})"
            back = await _return_or_refill(ctx, busy)
            if isinstance(back, Wait):
                return back
            node = took.node if back else node
    await ctx.save(replace(ctx.progress, node=node))
    await _move(ctx.deps, took.reservation, node, into=True)
    done = replace(ctx.progress, node=node, given_back_at=ctx.clock())
    await ctx.save(done)
    pool = took.pool or ""
    away = (ctx.clock() - (took.taken_at or ctx.clock())).total_seconds()
    ctx.deps.metrics.capacity_away.labels(pool).observe(max(away, 0.0))
    await _count_saved(ctx, took)
    await ctx.acted(
        "capacity_give_back",
        f"{node} added to reservation {took.reservation}: pool {pool} whole again after {away:.0f}s",
        node=node,
    )
    await lent_changed(ctx.deps)
    return Done(done, f"{node} back in pool {pool}")


async def _give_back_lent(
    ctx: StepContext[GiveBackResult], took: CapacityResult
) -> Done[GiveBackResult] | Wait:
    """A Kubernetes pool made whole: the repaired node joins it with the labels the lent node had
    (``refill``: the lent node stays with the jobs), or the lent node goes back as it was once no
    job runs there (``return``)."""
    assert took.node is not None
    if took.taken_at is None:
        return Wait(ctx.poll, f"the take of {took.node} is under way")
    lender = lending.lending(ctx.deps)
    pool = took.pool or ""
    back = ctx.progress.node == took.node  # the return decided before a restart
    if not back and ctx.progress.labels is None and _returning(ctx):
        running = took.slurm_node is not None and await ctx.ports.scheduler.jobs_on_node(took.slurm_node)
        decided = await _return_or_refill(ctx, f"{took.node} still runs a job" if running else None)
        if isinstance(decided, Wait):
            return decided
        back = decided
    progress = ctx.progress
    if back:
        await ctx.save(replace(progress, node=took.node))
        if took.relabelled_at is not None:
            left = await lending.leave(ctx.deps, _pool(ctx, took.pool), took.node, ctx.incident.id)
            if left is not None:
                await ctx.acted(
                    "capacity_leave_command",
                    f"{took.node} left the partition{lending.said(left)}",
                    node=took.node,
                    output=left[-lending.OUTPUT_KEPT :],
                )
        await lender.lend_back(took.node, incident_id=ctx.incident.id)
        node = took.node
    else:
        if progress.labels is None:
            ready = await ctx.result(WaitReadyResult)
            repaired = (ready.node if ready else None) or ctx.node
            facts = await lender_node(ctx, took.node)
            prior = lent_prior(facts) if facts is not None else None
            if prior is None:  # the marks are gone already: nothing left to copy from
                labels: dict[str, str | None] = {}
            else:
                labels = dict(prior.labels)
            progress = replace(progress, node=repaired, labels=labels)
            await ctx.save(progress)
        node = progress.node or ctx.node
        if progress.labels:
            await lender.set_labels(node, progress.labels)
        await lender.keep_lent(took.node, incident_id=ctx.incident.id)
    done = replace(progress, node=node, given_back_at=ctx.clock())
    await ctx.save(done)
    away = (ctx.clock() - (took.taken_at or ctx.clock())).total_seconds()
    ctx.deps.metrics.capacity_away.labels(pool).observe(max(away, 0.0))
    await _count_saved(ctx, took)
    await ctx.acted(
        "capacity_give_back", f"{node} joined pool {pool}: whole again after {away:.0f}s", node=node
    )
    await lent_changed(ctx.deps)
    return Done(done, f"{node} in pool {pool}")


def _returning(ctx: StepContext[GiveBackResult]) -> bool:
    """``give_back: return``, and not yet given up for ``refill`` (``_return_or_refill``)."""
    return ctx.settings.capacity.give_back == "return" and not ctx.progress.refilled_instead


async def _return_or_refill(ctx: StepContext[GiveBackResult], busy: str | None) -> bool | Wait:
    """``give_back: return``: True when the lent node can go back now (``busy`` is ``None``); a Wait
    while the jobs still run there, bounded by ``capacity.return_wait``; past it False: the repaired
    node refills the pool instead, so the pool is whole and the job is left alone (a training job
    may run for days, and the repaired node waits out of service meanwhile)."""
    if busy is None:
        return True
    limit = ctx.settings.capacity.return_wait
    since = ctx.progress.return_wait_since
    if since is None:
        since = ctx.clock()
        await ctx.save(replace(ctx.progress, return_wait_since=since))
    if ctx.clock() - since < limit:
        return Wait(
            ctx.poll, f"{busy}: it goes back once no job runs there (at most {format_duration(limit)})"
        )
    await ctx.save(replace(ctx.progress, refilled_instead=True))
    await ctx.note(
        "return_refilled",
        f"{busy} after {format_duration(limit)}: the repaired node refills the pool instead",
    )
    return False


async def lender_node(ctx: StepContext[GiveBackResult], name: str) -> dict[str, str] | None:
    """The lent node's annotations (where the take recorded what it changed)."""
    cluster = ctx.ports.cluster
    facts = await cluster.node(name) if cluster is not None else None
    return dict(facts.annotations) if facts is not None else None


async def _count_saved(ctx: StepContext[GiveBackResult], took: CapacityResult) -> float:
    """Job GPU-hours the taken node saved: the interrupted jobs' GPUs times the time from the node
    joining their partition to the repaired node being Ready (what they would have waited)."""
    ready = await ctx.result(WaitReadyResult)
    down = await ctx.result(SlurmDownResult) or SlurmDownResult()
    joined = took.joined_at or took.taken_at
    if ready is None or ready.ready_at is None or joined is None:
        return 0.0
    gpus = sum(j.gpus or 0 for j in down.jobs or ())
    hours = max((ready.ready_at - joined).total_seconds(), 0.0) / 3600 * gpus
    ctx.deps.metrics.capacity_saved.labels(took.pool or "").inc(hours)
    return hours
