"""Kubernetes steps: cordon, drain, reset, reboot, replace, wait until ready.

Destructive calls happen at most once per incident: the intent is persisted before the
call, and a step resumed after a crash with an unconfirmed intent asks the far side (or,
where the far side cannot tell, assumes the call was made and lets ``wait_ready`` judge).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from datetime import datetime

from bot.domain.nodemap import slinky_cordon_annotations
from bot.engine.context import Done, StepContext, Wait
from bot.engine.errors import TransientError
from bot.engine.ports import OWNER_ANNOTATION, Cluster


def _poll(ctx: StepContext) -> float:
    return ctx.config.settings.engine.poll_interval.total_seconds()


async def cordon(ctx: StepContext) -> Done | Wait:
    cluster = ctx.ports.cluster
    node = await cluster.node(ctx.node)
    if node is None:
        return Done({"owned": False, "absent": True}, "node is not in Kubernetes; nothing to cordon")
    owner = node.annotations.get(OWNER_ANNOTATION)
    if node.unschedulable:
        mine = owner == ctx.incident.id
        if not mine:
            await ctx.note("not_owned", f"node {ctx.node} was already cordoned by someone else: left as is")
        return Done({"owned": mine}, "already cordoned")
    if ctx.config.settings.slurm.node_mapping == "slinky":
        # slurm-operator drains the Slurm node with this reason once it sees the cordon.
        await cluster.set_annotations(ctx.node, slinky_cordon_annotations(ctx.reason()))
    await ctx.intend(cordoning=True)
    await cluster.cordon(ctx.node, incident_id=ctx.incident.id, reason=ctx.reason())
    await ctx.acted("cordon", f"node {ctx.node} cordoned and tainted", node=ctx.node)
    after = await cluster.node(ctx.node)
    if after is None or not after.unschedulable or after.annotations.get(OWNER_ANNOTATION) != ctx.incident.id:
        raise TransientError(f"node {ctx.node} not yet cordoned", reason="not_applied")
    return Done({"owned": True}, "cordoned")


async def release_cordon(cluster: Cluster, node_name: str, incident_id: str) -> bool:
    """Uncordon only if the node still carries this incident's annotation (rollback and resume)."""
    node = await cluster.node(node_name)
    if node is None or node.annotations.get(OWNER_ANNOTATION) != incident_id:
        return False
    await cluster.uncordon(node_name, incident_id=incident_id)
    return True


async def drain(ctx: StepContext) -> Done | Wait:
    cluster = ctx.ports.cluster
    node = await cluster.node(ctx.node)
    if node is None:
        return Done({"evicted": ctx.progress.get("evicted", [])}, "node is gone; nothing to drain")
    waited = await _slurm_jobs_still_running(ctx)
    if waited is not None:
        return waited
    evicted: list[str] = list(ctx.progress.get("evicted", []))
    pods = [p for p in await cluster.pods_on_node(ctx.node) if not p.mirror and p.owner_kind != "DaemonSet"]
    left = [p for p in pods if p.ref not in evicted and not p.terminating]
    force = bool(ctx.spec.options.get("force_delete_on_dead_node", False)) and not node.ready
    blocked = 0
    for pod in left:
        await ctx.intend(evicting=pod.ref)
        try:
            if force:
                await cluster.delete_pod(pod, force=True)
                await ctx.acted("force_delete", f"pod {pod.ref} force-deleted (node not ready)", pod=pod.ref)
            else:
                await cluster.evict(pod)
                await ctx.acted("evict", f"pod {pod.ref} evicted", pod=pod.ref)
        except TransientError as exc:
            if exc.reason != "pdb":
                raise
            blocked += 1
            continue
        evicted.append(pod.ref)
        await ctx.intend(evicted=evicted, evicting=None)
    remaining = [p for p in pods if p.ref not in evicted]
    if blocked:
        raise TransientError(f"{blocked} eviction(s) refused by a PodDisruptionBudget", reason="pdb")
    if remaining or any(p.terminating for p in pods):
        return Wait(_poll(ctx), f"{len(pods)} pod(s) still terminating")
    return Done({"evicted": evicted}, f"{len(evicted)} pod(s) evicted")


async def _slurm_jobs_still_running(ctx: StepContext) -> Wait | None:
    """After DRAIN, let running jobs finish within a grace period, then requeue them."""
    down = ctx.result_of("slurm_down")
    if down.get("action") != "drain" or not down.get("jobs"):
        return None
    grace = float(ctx.spec.options.get("slurm_drain_grace_seconds", 600))
    since = ctx.progress.get("slurm_wait_since")
    running = []
    for job in down["jobs"]:
        snapshot = await ctx.ports.scheduler.job(job["job_id"])
        if (
            snapshot is not None
            and snapshot.running
            and set(snapshot.nodes) & set(down.get("slurm_nodes", []))
        ):
            running.append(snapshot)
    if not running:
        return None
    if since is None:  # the grace clock starts the first time the drain finds jobs still running
        since = ctx.clock().isoformat()
        await ctx.intend(slurm_wait_since=since)
    elapsed = (ctx.clock() - datetime.fromisoformat(since)).total_seconds()
    if elapsed < grace:
        return Wait(_poll(ctx), f"waiting for {len(running)} job(s) to finish on the drained node")
    requeued: list[str] = list(ctx.progress.get("requeued", []))
    for snapshot in running:
        if snapshot.job_id in requeued:
            continue
        await ctx.intend(requeueing=snapshot.job_id)
        await ctx.ports.scheduler.requeue(snapshot.job_id)
        await ctx.acted("slurm_requeue", f"job {snapshot.job_id} requeued after the drain grace period")
        requeued.append(snapshot.job_id)
        await ctx.intend(requeued=requeued)
    return Wait(_poll(ctx), "requeued jobs are leaving the node")


async def _issue_once(
    ctx: StepContext, action: str, words: str, call: Callable[[], Awaitable[object]]
) -> Done:
    """Run a destructive call at most once per incident, even across crashes."""
    if ctx.progress.get("issued"):
        return Done(dict(ctx.progress), f"{words} already issued")
    if ctx.progress.get("issuing"):
        # A crash hit between intent and confirmation: never issue twice.
        await ctx.note("assumed_issued", f"{words} may have been issued before a restart; not issuing again")
        await ctx.intend(issued=True, assumed=True)
        return Done(dict(ctx.progress), f"{words} assumed issued")
    await ctx.intend(issuing=True)
    try:
        handle = await call()
    except Exception:
        await ctx.intend(issuing=False)
        raise
    await ctx.intend(issued=True, handle=handle if isinstance(handle, str) else None)
    await ctx.acted(action, words, node=ctx.node)
    return Done(dict(ctx.progress), words)


async def reset_gpu(ctx: StepContext) -> Done | Wait:
    gpus = sorted({f["gpu"] for f in ctx.plan.get("faults", []) if f.get("gpu")})
    return await _issue_once(
        ctx,
        "reset_gpu",
        f"GPU reset on {ctx.node} ({', '.join(gpus) or 'all GPUs'})",
        lambda: ctx.ports.cluster.reset_gpu(ctx.node, gpus, incident_id=ctx.incident.id),
    )


async def reboot(ctx: StepContext) -> Done | Wait:
    return await _issue_once(
        ctx,
        "reboot",
        f"reboot of {ctx.node}",
        lambda: ctx.ports.cluster.reboot(ctx.node, incident_id=ctx.incident.id),
    )


async def replace(ctx: StepContext) -> Done | Wait:
    cluster = ctx.ports.cluster
    if not ctx.progress.get("issued"):
        # The far side knows whether the replacement started: trust it over our own intent, so
        # a crash between intent and call neither doubles the replacement nor loses it.
        if await cluster.replacement_started(ctx.node, incident_id=ctx.incident.id):
            await ctx.intend(issued=True)
        elif ctx.progress.get("issuing"):
            await ctx.note(
                "not_issued", "the replacement had not reached the far side before a restart; issuing it"
            )
            await ctx.intend(issuing=False)
    strategy = str(ctx.spec.options.get("strategy", "delete-node"))
    return await _issue_once(
        ctx,
        "replace",
        f"replacement of {ctx.node} ({strategy})",
        lambda: cluster.replace(ctx.node, strategy=strategy, incident_id=ctx.incident.id),
    )


async def wait_ready(ctx: StepContext) -> Done | Wait:
    node = await ctx.ports.cluster.node(ctx.node)
    if node is None or not node.ready:
        return Wait(_poll(ctx), f"node {ctx.node} not Ready yet")
    for name in ctx.result_of("slurm_down").get("slurm_nodes", []):
        state = await ctx.ports.scheduler.node(name)
        if "NOT_RESPONDING" in state.states:
            return Wait(_poll(ctx), f"slurmd on {name} has not registered yet")
    return Done({"ready_at": ctx.clock().isoformat()}, f"node {ctx.node} is Ready")
