"""The Kubernetes side of ``capacity`` and ``give_back``: pools by label selector.

A take from a Kubernetes pool (``capacity.pools[].selector``) is, in order, each stage
persisted before the next so that a resumed step continues where it stopped and repeats
nothing: (1) one guarded patch on the node (``Lending.lend``: the incident's mark with what the
node was, the cordon for a lender, the pool's labels off); (2) for a lender, its pods evicted
through the Eviction API, their disruption budgets honoured for at most the pool's
``evict_grace`` (past it the node is handed back and the job waits for the repair); (3) only
then the NodeSet's labels on and the take's cordon lifted in one patch (``Lending.join``:
slurm-operator runs no NodeSet pod on a cordoned node and drains the Slurm node of one), or the
pool's ``join_command`` run (``bot.domain.pool_command``), so no job lands beside a pod still
leaving; (4) the wait until
the node's slurmd is registered and in service. The give-back keeps the lent node with
the jobs and lets the repaired node take its place in the pool (``refill``), or returns the
lent node exactly as it was once no job runs there (``return``; after the pool's
``leave_command``, which undoes its ``join_command``). Only what the take recorded on the node is
undone, and a command runs only on a node lent to this incident.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING

from bot.config import PoolSettings
from bot.domain import pool_command
from bot.domain.capacity import Candidate, PoolView
from bot.domain.capacity import Pool as DomainPool
from bot.domain.ownership import lent_to
from bot.engine.context import StepContext, StepDeps
from bot.engine.errors import PermanentError, Reason, TransientError
from bot.engine.ports import Cluster, Lend, Lending, PodRef

if TYPE_CHECKING:
    from bot.engine.steps.capacity import CapacityResult

#: Node label naming the GPU model (NVIDIA GPU feature discovery).
GPU_PRODUCT_LABEL = "nvidia.com/gpu.product"


def lending(deps: StepDeps) -> Lending:
    return lender_of(deps.ports.cluster)


def lender_of(cluster: Cluster | None) -> Lending:
    if not isinstance(cluster, Lending):
        raise PermanentError(
            "the cluster cannot lend nodes (a selector pool needs Kubernetes)", reason=Reason.UNSUPPORTED
        )
    return cluster


def lend_of(pool: PoolSettings, incident_id: str) -> Lend:
    leave = tuple(dict.fromkeys([*pool.selector_labels(), *pool.leave_labels]))
    return Lend(incident_id, dict(pool.join_labels), leave, cordon=pool.kind == "lender")


async def view(lender: Lending, pool: PoolSettings, busy: set[str], opt_out_label: str) -> PoolView:
    """The pool's members now, as the choice sees them (a lent node no longer matches the selector)."""
    assert pool.selector is not None
    members = []
    for node in await lender.pool_nodes(pool.selector):
        idle = node.ready and not node.unschedulable and lent_to(node.annotations) is None
        members.append(
            Candidate(
                node.name,
                idle=idle,
                gpu_type=node.labels.get(GPU_PRODUCT_LABEL),
                gpus=node.gpus,
                opt_out=node.labels.get(opt_out_label) == "true",
                open_incident=node.name in busy,
            )
        )
    return PoolView(DomainPool(pool.name, pool.kind, pool.min_idle, pool.max_lend), tuple(members))


#: The end of a pool command's output kept in the timeline.
OUTPUT_KEPT = 2000


async def run(deps: StepDeps, pool: PoolSettings, node: str, incident_id: str, argv: Sequence[str]) -> str:
    """A pool command for ``node``, its placeholders filled; its output."""
    words = pool_command.fill(argv, node=node, incident=incident_id, pool=pool.name)
    timeout = pool.command_timeout.total_seconds()
    return await lending(deps).pool_command(node, words, incident_id=incident_id, limit=timeout)


async def leave(deps: StepDeps, pool: PoolSettings, node: str, incident_id: str) -> str | None:
    """Before a lent node goes back: the pool's ``leave_command``, only on a node still lent to this
    incident; its output (``None``: not run — no command, or not ours)."""
    if not pool.leave_command or deps.ports.cluster is None:
        return None
    facts = await deps.ports.cluster.node(node)
    if facts is None or lent_to(facts.annotations) != incident_id:
        return None
    return await run(deps, pool, node, incident_id, pool.leave_command)


def said(output: str) -> str:
    """The output's last line, for a timeline entry's words."""
    lines = output.strip().splitlines()
    return f": {lines[-1]}" if lines else ""


def _workload(pod: PodRef) -> bool:
    """A pod the take must move off a lender: not a DaemonSet's, a mirror, a slurmd, nor leaving already."""
    return not pod.mirror and pod.owner_kind != "DaemonSet" and not pod.nodeset_pod and not pod.terminating


async def take(
    ctx: StepContext[CapacityResult],
    pool: PoolSettings,
    *,
    lent: Callable[[], Awaitable[None]],
    kept: Callable[[], Awaitable[bool]],
) -> tuple[CapacityResult, str | None]:
    """Advance the take one stage; the progress and, while not joined, what it waits for. ``lent``
    is awaited once the node's leaving its pool is saved (the lent gauge shown again); ``kept``
    says whether the give-back has already kept the node with the jobs (``refill`` while the take
    was still under way: its marks are gone, and it joins by its labels alone)."""
    node = ctx.progress.node
    assert node is not None
    lender = lending(ctx.deps)
    progress = ctx.progress
    if progress.taken_at is None:
        if await lender.lend(node, lend_of(pool, ctx.incident.id)):
            ctx.deps.metrics.actions.labels("capacity_lend").inc()
        progress = replace(progress, taken_at=ctx.clock())
        await ctx.save(progress)
        await ctx.acted("capacity_take", f"took {node} from pool {pool.name}: {progress.why}", node=node)
        await lent()
    if progress.evicted_at is None:
        cluster = ctx.deps.ports.cluster
        assert cluster is not None  # lending() above
        left = [p for p in await cluster.pods_on_node(node) if _workload(p)] if pool.kind == "lender" else []
        refused = []
        for pod in left:
            try:
                await cluster.evict(pod)
                ctx.deps.metrics.actions.labels("evict").inc()
            except TransientError as exc:
                if exc.reason != Reason.PDB:
                    raise
                refused.append(str(exc))
        if left:
            spent = (ctx.clock() - progress.taken_at).total_seconds() if progress.taken_at else 0.0
            if refused and spent > pool.evict_grace.total_seconds():
                return progress, f"gave up: {refused[0]}"
            return progress, f"{len(left)} pod(s) leaving {node}" + (f"; {refused[0]}" if refused else "")
        progress = replace(progress, evicted_at=ctx.clock())
        await ctx.save(progress)
    if progress.relabelled_at is None:
        if pool.join_command:
            output = await run(ctx.deps, pool, node, ctx.incident.id, pool.join_command)
            await ctx.acted(
                "capacity_join_command",
                f"{node} joined by {pool.join_command[0]}{said(output)}",
                node=node,
                output=output[-OUTPUT_KEPT:],
            )
        elif not await lender.join(node, dict(pool.join_labels), incident_id=ctx.incident.id):
            if not await kept():
                raise PermanentError(f"{node} is no longer lent to this incident", reason=Reason.CONFLICT)
            await lender.set_labels(node, dict(pool.join_labels))  # uncordoned as it was kept
        progress = replace(progress, relabelled_at=ctx.clock())
        await ctx.save(progress)
    names = await ctx.ports.slurm_names(node)
    if not names:
        return progress, f"{node}: no slurmd registered yet"
    try:
        state = await ctx.ports.scheduler.node(names[0])
    except PermanentError as exc:
        if exc.reason != Reason.UNKNOWN_NODE:
            raise
        return progress, f"{node}: Slurm node {names[0]} not registered yet"
    if not state.in_service:  # IDLE, or already running the job that waited for it
        return progress, f"{node}: Slurm node {names[0]} is {'/'.join(sorted(state.states))}"
    progress = replace(progress, slurm_node=names[0], joined_at=ctx.clock())
    await ctx.save(progress)
    return progress, None
