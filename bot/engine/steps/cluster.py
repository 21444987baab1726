"""Kubernetes steps that empty the node: cordon (with pitcrew's taint and ownership mark) and drain.

Both need a Kubernetes cluster; on Slurm-only sites (``integrations.cluster: none``) the
executor records them as not applicable.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import datetime, timedelta

from bot.domain.incident import State
from bot.domain.jobs import JobSnapshot
from bot.domain.ownership import owns_node, slinky_cordon_annotations
from bot.domain.playbooks import repairs_in_place
from bot.engine.context import Done, StepContext, StepResult, UndoContext, Wait
from bot.engine.errors import PermanentError, Reason, TransientError
from bot.engine.ports import Cluster, Notice, PodRef
from bot.engine.registry import REGISTRY
from bot.engine.steps.put_back import LooksAround, look_for_newcomers, newcomers
from bot.engine.steps.slurm import SlurmDownResult
from bot.engine.trust import fault_class


def cluster_of(ports_cluster: Cluster | None) -> Cluster:
    if ports_cluster is None:
        raise PermanentError("no Kubernetes cluster is configured", reason=Reason.MISCONFIGURED)
    return ports_cluster


@dataclass(frozen=True, slots=True)
class CordonResult(StepResult):
    #: pitcrew cordoned the node for this incident (False: it was cordoned by someone else).
    owned: bool = False
    #: Intent, persisted before the call.
    cordoning: bool = False
    absent: bool = False
    #: The lemon label was set (intent, persisted before the call).
    lemon: bool = False


async def release_cordon(cluster: Cluster, node_name: str, incident_id: str) -> bool:
    """Uncordon only if the node still carries this incident's annotation (rollback and resume)."""
    node = await cluster.node(node_name)
    if node is None or not owns_node(node.annotations, incident_id):
        return False
    await cluster.uncordon(node_name, incident_id=incident_id)
    return True


async def undo_cordon(ctx: UndoContext, result: CordonResult) -> str:
    if result.lemon and ctx.deps.ports.cluster is not None:
        # A rollback says pitcrew was wrong about this node: it is no lemon either.
        await ctx.deps.ports.cluster.set_labels(ctx.node, {ctx.deps.settings.lemon.label: None})
    if not result.owned and not result.cordoning:
        return "cordon: the node was cordoned by someone else; left as is"
    if ctx.deps.ports.cluster is not None and await release_cordon(
        ctx.deps.ports.cluster, ctx.node, ctx.incident.id
    ):
        ctx.count("uncordon")
        return f"cordon: {ctx.node} uncordoned and untainted"
    return "cordon: the node no longer carries pitcrew's annotation; left as is"


@REGISTRY.step(
    CordonResult,
    state=State.RUNNING,
    timeout=timedelta(seconds=60),
    attempts=5,
    would="cordon and taint the node, annotated with the incident id",
    undo=undo_cordon,
    mutating=True,
    destructive=True,
    port="cluster",
    needs_cluster=True,
)
async def cordon(ctx: StepContext[CordonResult]) -> Done[CordonResult] | Wait:
    cluster = cluster_of(ctx.ports.cluster)
    node = await cluster.node(ctx.node)
    if node is None:
        return Done(CordonResult(absent=True), "node is not in Kubernetes; nothing to cordon")
    if node.unschedulable:
        mine = owns_node(node.annotations, ctx.incident.id)
        if not mine:
            await ctx.note("not_owned", f"node {ctx.node} was already cordoned by someone else: left as is")
        await _mark_lemon(ctx, cluster)  # a lemon is labelled whoever cordoned it (and after a restart)
        return Done(CordonResult(owned=mine, lemon=bool(ctx.plan.lemon)), "already cordoned")
    if ctx.settings.slinky:
        # slurm-operator drains the Slurm node with this reason once it sees the cordon.
        await cluster.set_annotations(ctx.node, slinky_cordon_annotations(ctx.reason()))
    await ctx.save(replace(ctx.progress, cordoning=True))
    await cluster.cordon(ctx.node, incident_id=ctx.incident.id, reason=ctx.reason())
    await ctx.acted("cordon", f"node {ctx.node} cordoned and tainted", node=ctx.node)
    after = await cluster.node(ctx.node)
    if after is None or not after.unschedulable or not owns_node(after.annotations, ctx.incident.id):
        raise TransientError(f"node {ctx.node} not yet cordoned", reason=Reason.NOT_APPLIED)
    await _mark_lemon(ctx, cluster)
    return Done(CordonResult(owned=True, lemon=bool(ctx.plan.lemon)), "cordoned")


async def _mark_lemon(ctx: StepContext[CordonResult], cluster: Cluster) -> None:
    """A lemon (``Plan.lemon``) carries the lemon label from its cordon on, so it is found for an RMA."""
    if not ctx.plan.lemon:
        return
    label = ctx.settings.lemon.label
    found = not ctx.progress.lemon  # counted once per incident, whatever retries follow
    await ctx.save(replace(ctx.progress, lemon=True))
    if found:
        ctx.deps.metrics.lemon_nodes.labels(ctx.node, fault_class(ctx.plan)).inc()
    await cluster.set_labels(ctx.node, {label: "true"})
    await ctx.acted(
        "lemon",
        f"node {ctx.node} labelled {label}=true: remediation {len(ctx.plan.lemon) + 1} within the lemon window"
        f" (earlier: {', '.join(ctx.plan.lemon)})",
        node=ctx.node,
    )


@dataclass(frozen=True, slots=True)
class DrainResult(LooksAround):
    evicted: tuple[str, ...] = ()
    #: Of ``evicted``, the pods a StatefulSet-mode NodeSet makes again under the same name
    #: (``PodRef.nodeset_replica``): the demand ``replace`` waits on, though not made again yet.
    nodeset_replicas: tuple[str, ...] = ()
    #: Slinky NodeSet slurmd pods (``PodRef.nodeset_pod``, either scaling mode) left on the node,
    #: its repair keeping the machine (``repairs_in_place``): the reset or reboot restarts them there.
    nodeset_kept: tuple[str, ...] = ()
    #: The pod being evicted right now (intent).
    evicting: str | None = None
    #: When the drain first found Slurm jobs still running after DRAIN (the grace clock).
    slurm_wait_since: datetime | None = None
    requeueing: str | None = None
    requeued: tuple[str, ...] = ()
    #: Jobs Slurm will not requeue, left running (their people told, once each): never asked again.
    kept: tuple[str, ...] = ()


@REGISTRY.step(
    DrainResult,
    state=State.RUNNING,
    timeout=timedelta(minutes=15),
    attempts=50,
    would="evict the node's pods through the Eviction API",
    undo="evicted pods are not brought back; they reschedule once the node is uncordoned",
    mutating=True,
    destructive=True,
    port="cluster",
    needs_cluster=True,
)
async def drain(ctx: StepContext[DrainResult]) -> Done[DrainResult] | Wait:
    cluster = cluster_of(ctx.ports.cluster)
    node = await cluster.node(ctx.node)
    if node is None:
        return Done(ctx.progress, "node is gone; nothing to drain")
    put_back = await look_for_newcomers(ctx)
    waited = await _slurm_jobs_still_running(ctx) or await newcomers(ctx, put_back)
    if waited is not None:
        return waited
    evicted = list(ctx.progress.evicted)
    pods = await _to_drain(ctx, cluster)
    force = bool(ctx.spec.options.get("force_delete_on_dead_node", False)) and not node.ready
    # On a node that is not Ready no kubelet confirms a deletion: a terminating pod (evicted, or
    # marked by the taint manager on its own) stays Terminating until it is force-deleted.
    left = [p for p in pods if (p.ref not in evicted and not p.terminating) or (force and p.terminating)]
    blocked: list[str] = []
    refused: list[PermanentError] = []
    for pod in left:
        await ctx.save(replace(ctx.progress, evicting=pod.ref))
        try:
            if force:
                await cluster.delete_pod(pod, force=True)
                await ctx.acted("force_delete", f"pod {pod.ref} force-deleted (node not ready)", pod=pod.ref)
            else:
                await cluster.evict(pod)
                await ctx.acted("evict", f"pod {pod.ref} evicted", pod=pod.ref)
        except TransientError as exc:  # one pod's error never keeps the pods after it from their turn
            blocked.append(str(exc))
            continue
        except PermanentError as exc:
            refused.append(exc)
            continue
        if pod.ref not in evicted:
            evicted.append(pod.ref)
        replicas = ctx.progress.nodeset_replicas
        if pod.nodeset_replica and pod.ref not in replicas:
            replicas = (*replicas, pod.ref)
        await ctx.save(
            replace(ctx.progress, evicted=tuple(evicted), nodeset_replicas=replicas, evicting=None)
        )
    if refused:
        where = "" if node.ready else f"node {ctx.node} is not Ready (no kubelet confirms a deletion); "
        raise PermanentError(
            f"{where}{len(refused)} pod(s) cannot be drained: {'; '.join(str(e) for e in refused)}"
            + (f"; also retried: {'; '.join(blocked)}" if blocked else ""),
            reason=refused[0].reason,
        )
    if blocked:  # retried until the step's deadline; the escalation names each pod and its budget
        raise TransientError(
            f"{len(blocked)} eviction(s) failed: {'; '.join(blocked)}",
            reason=Reason.PDB if all("PodDisruptionBudget" in b for b in blocked) else Reason.UNAVAILABLE,
        )
    if left:  # what this pass evicted may be gone already, or still terminating
        pods = await _to_drain(ctx, cluster)
    if pods and not node.ready and not force:
        raise PermanentError(
            f"node {ctx.node} is not Ready, so no kubelet will confirm the deletion of its "
            f"{len(pods)} terminating pod(s): {_refs(pods)}; they stay Terminating until force-deleted "
            "(drain option force_delete_on_dead_node with kubernetes.force_delete_not_ready)",
            reason=Reason.NOT_ALLOWED,
        )
    if pods:
        # An evicted pod terminates before it is gone: the node is empty only once a listing finds
        # none. At the deadline this is what the escalation reports as left on the node.
        return Wait(ctx.poll, f"{len(pods)} pod(s) still on the node, terminating: {_refs(pods)}")
    return Done(ctx.progress, f"{len(evicted)} pod(s) evicted")


async def _to_drain(ctx: StepContext[DrainResult], cluster: Cluster) -> list[PodRef]:
    """The node's pods the drain empties it of: not DaemonSet or mirror pods (their controllers
    keep them on the node), and, where the repair keeps the machine (``repairs_in_place``), not the
    slurmd pods of a Slinky NodeSet (``PodRef.nodeset_pod``), in either scaling mode: evicted from
    the cordoned node, such a pod does not come back to it while the reset or reboot would restart
    it here. In StatefulSet mode it is made again unbound and placed on another node, taking the
    Slurm node with it; in DaemonSet mode it is not made again until the uncordon (the node fails
    the pod's taint predicates, slurm-operator ``PodShouldRunOnNode``), which comes after
    ``wait_ready``: the Slurm node would come back nowhere. The Slurm node is out of service
    already (``slurm_down``, or slurm-operator's drain on the cordon), and its jobs have left
    (``_slurm_jobs_still_running``). Those left are recorded, and said once."""
    pods = [p for p in await cluster.pods_on_node(ctx.node) if not p.mirror and p.owner_kind != "DaemonSet"]
    if not repairs_in_place(ctx.plan.steps):
        return pods
    kept = [p.ref for p in pods if p.nodeset_pod and p.ref not in ctx.progress.nodeset_kept]
    if kept:
        await ctx.save(replace(ctx.progress, nodeset_kept=(*ctx.progress.nodeset_kept, *kept)))
        await ctx.note(
            "nodeset_kept",
            f"slurmd pod(s) {', '.join(kept)} left on {ctx.node}: evicted from the cordoned node, their "
            "NodeSet would not make them again here (StatefulSet mode: elsewhere, the Slurm node with "
            "them; DaemonSet mode: not until the uncordon); the repair restarts them here",
            pods=list(kept),
        )
    return [p for p in pods if not p.nodeset_pod]


def _refs(pods: list[PodRef]) -> str:
    return ", ".join(p.ref for p in pods[:10]) + (" …" if len(pods) > 10 else "")


async def _slurm_jobs_still_running(ctx: StepContext[DrainResult]) -> Wait | None:
    """After DRAIN, let running jobs finish within a grace period, then requeue them. With Slinky
    the DRAIN is slurm-operator's, on the cordon, and it too lets jobs run: it keeps the slurmd
    pod's ``pod-protect`` (its budget refusing the eviction) while the Slurm node is busy, so the
    same grace and requeue apply, or the drain would wait out its deadline behind a long job."""
    down = await ctx.result(SlurmDownResult)
    if down is None or down.action not in ("drain", "slinky") or not down.jobs:
        return None
    grace = float(ctx.spec.options.get("slurm_drain_grace_seconds", 600))
    running = []
    for job in down.jobs:
        snapshot = await ctx.ports.scheduler.job(job.job_id)
        if snapshot is not None and snapshot.running and set(snapshot.nodes) & set(down.slurm_nodes or ()):
            running.append(snapshot)
    if not running:
        return None
    since = ctx.progress.slurm_wait_since
    if since is None:  # the grace clock starts the first time the drain finds jobs still running
        since = ctx.clock()
        await ctx.save(replace(ctx.progress, slurm_wait_since=since))
    if (ctx.clock() - since).total_seconds() < grace:
        held = " (slurm-operator keeps the slurmd pod protected meanwhile)" if down.action == "slinky" else ""
        return Wait(
            ctx.poll,
            f"waiting for {len(running)} job(s) to finish on the drained node{held}, "
            f"requeued after {grace:g}s: {', '.join(j.job_id for j in running)}",
        )
    requeued = list(ctx.progress.requeued)
    kept: list[str] = []
    for snapshot in running:
        if snapshot.job_id in requeued:
            continue
        why = snapshot.not_requeueable
        if why is None and snapshot.job_id in ctx.progress.kept:
            why = "it refused the requeue"  # the flag reads back as it was: pitcrew asks once
        if why is None:
            why = await _requeue(ctx, snapshot, grace)
            if why is None:
                requeued.append(snapshot.job_id)
                continue
        await _keep(ctx, snapshot, why, grace)
        kept.append(f"{snapshot.who}, which Slurm will not requeue: {why}")
    if kept:
        # At the step's deadline this is what the escalation says is left on the node.
        return Wait(
            ctx.poll,
            f"waiting for {len(kept)} job(s) to leave the drained node, left running: "
            f"{'; '.join(kept)}. pitcrew does not end a job it cannot bring back: it may finish, or "
            "its owner or an admin scancel it",
        )
    return Wait(ctx.poll, "requeued jobs are leaving the node")


async def _requeue(ctx: StepContext[DrainResult], job: JobSnapshot, grace: float) -> str | None:
    """Requeue one job: ``None`` once done (or gone), else why Slurm refused it, as it does a job
    that became not requeueable after it was read (``scontrol update Requeue=0``). Any other
    refusal escalates, in words that name the job."""
    await ctx.save(replace(ctx.progress, requeueing=job.job_id))
    try:
        await ctx.ports.scheduler.requeue(job.job_id)
    except PermanentError as exc:
        if exc.reason == Reason.UNKNOWN_JOB:
            return None  # ended and forgotten since it was read: it has left the node
        if exc.reason == Reason.NOT_REQUEUEABLE:
            return f"it refused the requeue ({exc})"
        raise PermanentError(
            f"{job.who} still runs on the drained node {ctx.node} after the {grace:g}s grace and Slurm "
            f"refused to requeue it ({exc}); pitcrew does not end it: let it finish, or have its owner "
            f"or an admin requeue or scancel it, then see to the node",
            reason=exc.reason,
        ) from exc
    await ctx.acted(
        "slurm_requeue", f"job {job.job_id} requeued after the drain grace period", job=job.job_id
    )
    await ctx.save(replace(ctx.progress, requeued=(*ctx.progress.requeued, job.job_id), requeueing=None))
    return None


async def _keep(ctx: StepContext[DrainResult], job: JobSnapshot, why: str, grace: float) -> None:
    """Leave a job Slurm will not requeue running, and tell its people once: ending it would lose
    its work for good (nothing brings it back), so a human decides, and the drain waits for it."""
    if job.job_id in ctx.progress.kept:
        return
    await ctx.tell(
        Notice(
            ctx.incident.id,
            "job_not_requeueable",
            f"{ctx.node}: {job.who} cannot be requeued; pitcrew leaves it running",
            (
                f"Why Slurm will not requeue it: {why}.",
                f"The node is drained for repair ({ctx.plan.summary}); the job still runs there "
                f"{grace:g}s after the drain. pitcrew does not end a job it cannot bring back.",
                f"What you can do: let it finish (the repair goes on once it has left the node), or end "
                f"it once it has saved what it needs (`scancel {job.job_id}`) and resubmit it with "
                "sbatch --requeue, so that next time it is moved rather than waited for.",
                "If it is still there when the drain step's time runs out, the incident goes to a human.",
            ),
            severity="warning",
            node=ctx.node,
        ),
        key=f"job_not_requeueable:{job.job_id}",
    )
    await ctx.save(replace(ctx.progress, kept=(*ctx.progress.kept, job.job_id)))
    await ctx.note("job_not_requeueable", f"{job.who} left running: {why}", job=job.job_id)
