"""Repairing the node: reset its GPU, reboot it or replace it — then wait until it is back.

Destructive calls happen at most once per incident: the intent is persisted before the
call, and a step resumed after a crash with an unconfirmed intent asks the far side (or,
where the far side cannot tell, assumes the call was made and lets ``wait_ready`` judge).
On Slurm-only sites (no Kubernetes cluster) the repair is handed to humans, and
``wait_ready`` waits for the Slurm node to go away and come back.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import Any, TypeVar

from bot import logger
from bot.domain.incident import State
from bot.domain.jobs import SlurmdSeen, SlurmNodeState, slurmd_started_again
from bot.domain.nodemap import read_from_node
from bot.domain.ownership import is_pitcrew_reason
from bot.engine.context import Done, Facts, Results, StepContext, UndoContext, Wait
from bot.engine.errors import PermanentError, PitcrewError, Reason, TransientError
from bot.engine.fleet import LEFT_BEHIND
from bot.engine.ports import Cluster, NodeValidator, Notice, OldNodeLook
from bot.engine.registry import REGISTRY
from bot.engine.steps.cluster import DrainResult
from bot.engine.steps.put_back import (
    NEWCOMERS_WAITED_FOR,
    LooksAround,
    look_around,
    newcomers,
    put_back_meanwhile,
)
from bot.engine.steps.slurm import SlurmDownResult

log = logger(__name__)


@dataclass(frozen=True, slots=True)
class IssueResult(LooksAround):
    """A repair's call (``_issue_once``); ``replace``, refusing while work remains on the node
    (``_replacement_held``), looks beside its retries for the node put back (``LooksAround``)."""

    #: Intent: the call may be on its way (persisted before it).
    issuing: bool = False
    issued: bool = False
    #: A restart found the intent unconfirmed and did not issue again.
    assumed: bool = False
    handle: str | None = None
    #: When the call was about to be made (the intent's time).
    issued_at: datetime | None = None
    #: A reboot's or replacement's: the Slurm nodes' slurmds as Slurm reported them just before the
    #: call (persisted before its intent, ``_read_slurmd_before``); ``wait_ready`` waits for others
    #: (``slurmd_started_again``). None: not read (an intent persisted by an older pitcrew).
    slurmd_before: tuple[SlurmdSeen, ...] | None = None
    #: No cluster to act through: humans were asked to do it (and when).
    handed_over: bool = False
    handed_over_at: datetime | None = None

    @property
    def before_call(self) -> bool:
        """Nothing issued yet, nor on its way, nor handed to humans: what is read or looked for
        before the call (``_read_slurmd_before``, ``_not_under_newcomers``) still can be."""
        return not (self.issued or self.issuing or self.handed_over)


@dataclass(frozen=True, slots=True)
class ResetResult(IssueResult):
    pass


@dataclass(frozen=True, slots=True)
class RebootResult(IssueResult):
    pass


@dataclass(frozen=True, slots=True)
class ReplaceResult(IssueResult):
    #: Another system was already replacing the node (pitcrew started nothing and waited for it).
    repaired_by: str | None = None


Issued = TypeVar("Issued", bound=IssueResult)


async def _issue_once(
    ctx: StepContext[Issued], action: str, words: str, call: Callable[[], Awaitable[object]]
) -> Done[Issued]:
    """Run a destructive call at most once per incident, even across crashes."""
    if ctx.progress.issued or ctx.progress.handed_over:
        return Done(ctx.progress, f"{words} already issued")
    if ctx.progress.issuing:
        # A crash hit between intent and confirmation: never issue twice.
        await ctx.note("assumed_issued", f"{words} may have been issued before a restart; not issuing again")
        await ctx.save(replace(ctx.progress, issued=True, assumed=True))
        return Done(ctx.progress, f"{words} assumed issued")
    await ctx.save(replace(ctx.progress, issuing=True, issued_at=ctx.clock()))
    try:
        handle = await call()
    except Exception:
        await ctx.save(replace(ctx.progress, issuing=False))
        raise
    handle = handle if isinstance(handle, str) else ctx.progress.handle
    await ctx.save(replace(ctx.progress, issued=True, handle=handle))
    if handle:  # what was acted on: the Machine or NodeClaim deleted, the Job started
        words = f"{words}: {handle}"
    await ctx.acted(action, words, node=ctx.node)
    return Done(ctx.progress, words)


async def _not_under_newcomers(ctx: StepContext[Issued]) -> Wait | None:
    """Before a reset or a reboot is issued: the node emptied by the drain may have been put back
    in service by other hands since (between the drain's end and the call, a retry's backoff) and
    taken a job, which the call would kill. Looked for (``put_back``) at every pass until the call,
    not every ``LOOK_AGAIN`` as a wait's look (a retry comes within seconds), and waited for like
    the drain's newcomers; once issued, nothing is looked for."""
    if not ctx.progress.before_call:
        return None
    told = await put_back_meanwhile(ctx, replaced=False, meanwhile=NEWCOMERS_WAITED_FOR)
    return await newcomers(ctx, told)


async def _read_slurmd_before(ctx: StepContext[Issued]) -> None:
    """Before a reboot or replacement is issued (or handed to humans), and until it is: persist the
    incident's Slurm nodes' slurmds as Slurm reports them, read again at each try (the latest before
    the call), so ``wait_ready`` knows the slurmd the repair ends by Slurm's own word. A Slurm node
    Slurm does not know is recorded with no start time."""
    if not ctx.progress.before_call:
        return
    down = await ctx.result(SlurmDownResult)
    seen = []
    for name in (down.slurm_nodes if down else None) or ():
        try:
            started = (await ctx.ports.scheduler.node(name)).slurmd_started_at
        except PermanentError as exc:
            if exc.reason != Reason.UNKNOWN_NODE:
                raise
            started = None
        seen.append(SlurmdSeen(name, started))
    await ctx.save(replace(ctx.progress, slurmd_before=tuple(seen)))


async def _hand_over(ctx: StepContext[Issued], what: str) -> Done[Issued]:
    """No cluster to act through: ask humans, once, and let ``wait_ready`` watch for the result."""
    if not ctx.progress.handed_over:
        await _read_slurmd_before(ctx)
        await ctx.tell(
            Notice(
                ctx.incident.id,
                "handover",
                f"{ctx.node}: {what} by hand",
                (
                    f"pitcrew has no Kubernetes cluster to {what} {ctx.node} through (integrations.cluster: none).",
                    "The Slurm node stays out of service with pitcrew's reason; pitcrew returns it once "
                    "its slurmd has started again after the repair.",
                ),
                severity="warning",
                node=ctx.node,
            ),
            key="handover",
        )
        await ctx.save(replace(ctx.progress, handed_over=True, handed_over_at=ctx.clock()))
        await ctx.note("handed_over", f"{what} handed to humans: no Kubernetes cluster")
    return Done(ctx.progress, f"{what} handed to humans")


@REGISTRY.step(
    ResetResult,
    state=State.RUNNING,
    timeout=timedelta(minutes=10),
    attempts=3,
    would="reset the faulty GPU(s)",
    undo="a GPU reset cannot be undone",
    mutating=True,
    destructive=True,
    port="cluster",
)
async def reset_gpu(ctx: StepContext[ResetResult]) -> Done[ResetResult] | Wait:
    cluster = ctx.ports.cluster
    if cluster is None:
        return await _hand_over(ctx, "reset the GPU(s) of")
    waited = await _not_under_newcomers(ctx)
    if waited is not None:
        return waited
    gpus = sorted({f.gpu for f in ctx.plan.faults if f.gpu})
    return await _issue_once(
        ctx,
        "reset_gpu",
        f"GPU reset on {ctx.node} ({', '.join(gpus) or 'all GPUs'})",
        lambda: cluster.reset_gpu(ctx.node, gpus, incident_id=ctx.incident.id, rung=ctx.rung),
    )


@REGISTRY.step(
    RebootResult,
    state=State.RUNNING,
    timeout=timedelta(minutes=20),
    attempts=3,
    would="reboot the node",
    undo="a reboot cannot be undone",
    mutating=True,
    destructive=True,
    port="cluster",
)
async def reboot(ctx: StepContext[RebootResult]) -> Done[RebootResult] | Wait:
    cluster = ctx.ports.cluster
    if cluster is None:
        return await _hand_over(ctx, "reboot")
    waited = await _not_under_newcomers(ctx)
    if waited is not None:
        return waited
    await _read_slurmd_before(ctx)
    if not ctx.progress.issued and not ctx.progress.issuing and ctx.progress.handle is None:
        # The boot id before the reboot, persisted first: wait_ready waits for it to change.
        handle = await cluster.replacement_handle(ctx.node, strategy="reboot")
        if handle is not None:
            await ctx.save(replace(ctx.progress, handle=handle))
    return await _issue_once(
        ctx,
        "reboot",
        f"reboot of {ctx.node}",
        lambda: cluster.reboot(ctx.node, incident_id=ctx.incident.id, rung=ctx.rung),
    )


async def undo_replace(ctx: UndoContext, result: ReplaceResult) -> str:
    cluster = ctx.deps.ports.cluster
    if cluster is None or result.handed_over:
        return "replace: handed to humans; nothing for pitcrew to cancel"
    if await cluster.replacement_started(ctx.node, incident_id=ctx.incident.id):
        return "replace: the replacement has already started and cannot be cancelled"
    if await cluster.cancel_replacement(ctx.node, incident_id=ctx.incident.id):
        ctx.count("cancel_replacement")
        return "replace: replacement cancelled before it started"
    return "replace: no replacement to cancel"


@REGISTRY.step(
    ReplaceResult,
    state=State.RUNNING,
    timeout=timedelta(minutes=5),
    attempts=5,
    would="start a replacement of the node",
    undo=undo_replace,
    mutating=True,
    destructive=True,
    port="cluster",
    name="replace",
)
async def replace_node(ctx: StepContext[ReplaceResult]) -> Done[ReplaceResult] | Wait:
    cluster = ctx.ports.cluster
    if cluster is None:
        return await _hand_over(ctx, "replace")
    if not ctx.progress.issued:
        # The far side knows whether the replacement started: trust it over our own intent, so
        # a crash between intent and call neither doubles the replacement nor loses it.
        if await cluster.replacement_started(ctx.node, incident_id=ctx.incident.id):
            await ctx.save(replace(ctx.progress, issued=True))
        elif ctx.progress.issuing:
            await ctx.note(
                "not_issued", "the replacement had not reached the far side before a restart; issuing it"
            )
            await ctx.save(replace(ctx.progress, issuing=False))
    await _read_slurmd_before(ctx)
    if not ctx.progress.issued and not ctx.progress.issuing:
        await look_around(ctx, lambda: put_back_meanwhile(ctx, replaced=False, meanwhile=_NOT_UNDER_JOBS))
        held = await _replacement_held(ctx, cluster)
        if held is not None:
            return held
    # Unset: the strategy the cluster adapter is configured with (kubernetes.replace.strategy).
    strategy = str(ctx.spec.options.get("strategy", "configured"))
    if not ctx.progress.issued and not ctx.progress.issuing and ctx.progress.handle is None:
        # Persisted before the call: wait_ready needs it to recognise the replacement, and after a
        # crash between the delete and its answer the old node (which carries it too) may be gone.
        handle = await cluster.replacement_handle(ctx.node, strategy=strategy)
        if handle is not None:
            await ctx.save(replace(ctx.progress, handle=handle))
    down = await ctx.result(SlurmDownResult)
    slurm_nodes = (down.slurm_nodes if down else None) or ()
    drained = await ctx.result(DrainResult)
    return await _issue_once(
        ctx,
        "replace",
        f"replacement of {ctx.node}" + ("" if strategy == "configured" else f" ({strategy})"),
        lambda: cluster.replace(
            ctx.node,
            strategy=strategy,
            incident_id=ctx.incident.id,
            slurm_nodes=slurm_nodes,
            nodeset_pods=drained.nodeset_replicas if drained else (),
        ),
    )


#: What ``replace`` does about a Slurm node put back before it is issued (``put_back_meanwhile``).
_NOT_UNDER_JOBS = (
    "The replacement does not start while jobs run on it (unless the playbook's replace option "
    "force says so): it waits for them to leave, and the incident goes to a human if they are "
    "still there when the step's time runs out."
)


async def _replacement_held(ctx: StepContext[ReplaceResult], cluster: Cluster) -> Done[ReplaceResult] | None:
    """No second replacement where another system holds the node's repair; none while work remains.

    Another repair system (a deleting Machine or NodeClaim, a Karpenter or cluster-autoscaler
    taint) is recorded as the owner and ``wait_ready`` waits for its replacement. Slurm jobs
    or workload pods still on the node refuse the replacement (retried until the deadline,
    then escalated) unless the playbook's ``force`` option says otherwise, which is audited.
    """
    owner = await cluster.repair_owner(ctx.node)
    if owner is not None:
        # Strategy "watch" starts nothing: it records on the node what to wait for.
        handle = await cluster.replace(ctx.node, strategy="watch", incident_id=ctx.incident.id)
        await ctx.note("repair_elsewhere", f"{ctx.node} is already being repaired by {owner}: waiting for it")
        await ctx.save(replace(ctx.progress, issued=True, handle=handle, repaired_by=owner))
        return Done(ctx.progress, f"replacement left to {owner}")
    down = await ctx.result(SlurmDownResult)
    jobs = []
    for name in (down.slurm_nodes if down else None) or ():
        jobs += [j.job_id for j in await ctx.ports.scheduler.jobs_on_node(name)]
    pods = [
        p.ref
        for p in await cluster.pods_on_node(ctx.node)
        if not p.mirror and p.owner_kind != "DaemonSet" and not p.terminating
    ]
    if not jobs and not pods:
        return None
    what = ", ".join([*(f"Slurm job {j}" for j in jobs), *(f"pod {p}" for p in pods)])
    if not ctx.spec.options.get("force", False):
        raise TransientError(
            f"{ctx.node} still runs {what}: not replacing it", reason=Reason.WORKLOAD_REMAINS
        )
    await ctx.note("forced", f"replacing {ctx.node} although it still runs {what} (option force)")
    return None


@dataclass(frozen=True, slots=True)
class WaitReadyResult(LooksAround):
    ready_at: datetime | None = None
    #: The node found Ready: the same node, or its replacement.
    node: str | None = None
    #: The operator's validation Job passed on it.
    validated: bool = False
    #: Slurm-only sites: the Slurm node was seen not responding (its repair took it away).
    seen_gone: bool = False
    #: The Slurm node(s) the node found Ready serves, by the node mapping: after a replacement,
    #: the successor's, which may be new names (``None``: the failed node's, ``slurm_nodes_back``).
    slurm_nodes: tuple[str, ...] | None = None
    #: What keeps the replaced node from going (``Cluster.termination_held``), once told; and the
    #: replaced node seen gone, after which it is not looked at again.
    termination_held: str | None = None
    old_node_gone: bool = False


def slurm_nodes_back(down: SlurmDownResult | None, ready: WaitReadyResult | None) -> tuple[str, ...]:
    """The Slurm nodes the repair brought back: those ``wait_ready`` found the repaired node serving,
    else (not yet known, or the same node) the failed node's."""
    if ready is not None and ready.slurm_nodes is not None:
        return ready.slurm_nodes
    return (down.slurm_nodes if down else None) or ()


def left_behind(down: SlurmDownResult | None, ready: WaitReadyResult | None) -> tuple[str, ...]:
    """The failed node's Slurm nodes its replacement does not serve: records whose slurmd went with
    the old machine (a Slinky DaemonSet-mode NodeSet names its Slurm node after the Kubernetes node,
    and a replacement has a new name). Nothing runs there again; pitcrew never RESUMEs them."""
    back = set(slurm_nodes_back(down, ready))
    return tuple(n for n in (down.slurm_nodes if down else None) or () if n not in back)


async def served_at_rollback(ctx: UndoContext) -> tuple[WaitReadyResult | None, bool]:
    """For a rollback: what ``wait_ready`` found, and whether which Slurm nodes the repair brought
    back is still unknown. Until ``wait_ready`` records the Slurm nodes a replacement serves, and
    where the node mapping reads them from the node (``read_from_node``), they are read now from
    the successor as ``wait_ready`` reads them. Unknown (True): a replacement went ahead and no
    successor serving a Slurm node has come yet; the failed node's records may be ghosts, their
    slurmd gone with the old machine, and none is RESUMEd."""
    facts = await Facts(ctx.deps, ctx.incident.id).results()
    ready, replaced = facts.of(WaitReadyResult), facts.of(ReplaceResult)
    cluster = ctx.deps.ports.cluster
    if (
        (ready is not None and ready.slurm_nodes is not None)
        or cluster is None
        or replaced is None
        or not replaced.issued
        or not read_from_node(ctx.deps.settings.node_mapping)
        # cancelled (``undo_replace`` runs first): the failed node stays, with its Slurm nodes
        or not await cluster.replacement_started(ctx.node, incident_id=ctx.incident.id)
    ):
        return ready, False
    if replaced.handle is None:
        successor = await cluster.node(ctx.node)
    else:
        successor = await cluster.successor(ctx.node, handle=replaced.handle)
    if successor is None:
        return ready, True
    served = tuple(await ctx.deps.ports.slurm_names(successor.name))
    if not served:
        return ready, True
    return replace(ready or WaitReadyResult(), node=successor.name, slurm_nodes=served), False


@REGISTRY.step(
    WaitReadyResult,
    state=State.VERIFYING,
    timeout=timedelta(minutes=45),
    # A look that fails for a moment (an API request timing out) is retried with backoff like any
    # step's call; waiting (``Wait``) uses up no attempt, and a failed validation is permanent.
    attempts=5,
    would="wait for the node (or its replacement) to be Ready and its slurmd registered",
    undo="waiting changes nothing",
    port="cluster",
)
async def wait_ready(ctx: StepContext[WaitReadyResult]) -> Done[WaitReadyResult] | Wait:
    facts = await ctx.results()  # one read of the other steps' results a poll
    down = facts.of(SlurmDownResult)
    slurm_nodes = (down.slurm_nodes if down else None) or ()
    if ctx.ports.cluster is None:
        return await _slurm_node_back(ctx, slurm_nodes, facts)
    # A replacement's or a reboot's handle says which node, in which state, counts as back.
    replaced = facts.of(ReplaceResult)
    await _look_around(ctx, ctx.ports.cluster, replaced)
    issued = [r for r in (replaced, facts.of(RebootResult)) if r and r.issued]
    handle = next((r.handle for r in issued if r.handle), None)
    if handle is None:  # reset, reboot, or no replacement: the same node
        node = await ctx.ports.cluster.node(ctx.node)
    else:
        node = await ctx.ports.cluster.successor(ctx.node, handle=handle)
    if node is None:
        waiting = f"no replacement for {ctx.node} has registered yet"
        if handle is not None:  # said in the timeline as it changes, in the escalation if it runs out
            said = await ctx.ports.cluster.held_up(ctx.node, handle=handle)
            waiting += f"; {said}" if said else ""
        return Wait(ctx.poll, waiting)
    if not node.ready:
        return Wait(ctx.poll, f"node {node.name} not Ready yet")
    if node.name != ctx.node and node.unschedulable:
        return Wait(ctx.poll, f"replacement {node.name} is not schedulable yet")
    if node.gpus == 0:
        return Wait(ctx.poll, f"node {node.name} reports no allocatable GPUs yet")
    still = await _faults_still_reported(ctx, node.name)
    if still is not None:
        return still
    if not ctx.progress.validated and isinstance(ctx.ports.cluster, NodeValidator):
        try:
            passed = await ctx.ports.cluster.validate(node.name, incident_id=ctx.incident.id, rung=ctx.rung)
        except PermanentError as exc:
            if exc.reason != Reason.JOB_FAILED:
                raise
            raise PermanentError(
                f"validation of {node.name} failed, so it is not returned to Slurm; replace it: {exc}",
                reason=Reason.VALIDATION_FAILED,
            ) from exc
        if passed:
            await ctx.save(replace(ctx.progress, validated=True))
            await ctx.note("validated", f"validation Job passed on {node.name}")
    restart = _slurmd_restarted_by(ctx, issued)
    read_again = replaced is not None and replaced.issued and read_from_node(ctx.settings.node_mapping)
    if read_again:
        # A replacement serves the Slurm nodes the node mapping finds on it, which need not be the
        # failed node's: pitcrew's rule for any node, applied to the successor.
        slurm_nodes = tuple(await ctx.ports.slurm_names(node.name))
        if not slurm_nodes:
            return Wait(ctx.poll, f"replacement {node.name} serves no Slurm node yet (no slurmd there)")
    elif read_from_node(ctx.settings.node_mapping):
        away = await _served_elsewhere(ctx, node.name, slurm_nodes)
        if away is not None:
            return away
    for name in slurm_nodes:
        try:
            state = await ctx.ports.scheduler.node(name)
        except PermanentError as exc:
            if exc.reason != Reason.UNKNOWN_NODE or not read_again:
                raise
            # A new dynamic node (Slinky's slurmd) is unknown to slurmctld until its slurmd registers.
            return Wait(ctx.poll, f"slurmd on {name} has not registered yet (Slurm does not know it)")
        if "NOT_RESPONDING" in state.states:
            return Wait(ctx.poll, f"slurmd on {name} has not registered yet")
        if restart is not None and restart.started_again(state) is False:
            # The repair ended the slurmd; the record answers for it until slurmctld finds it gone
            # (SlurmdTimeout). A RESUME now would be undone by the new slurmd's registration: a
            # node not DOWN whose boot is later than its last answer is set DOWN "Node unexpectedly
            # rebooted" (node_mgr.c validate_node_specs), kept under ReturnToService 0 or 1.
            return Wait(ctx.poll, f"slurmd on {name} has not registered again since the {restart.what}")
    done = replace(ctx.progress, ready_at=ctx.clock(), node=node.name, slurm_nodes=slurm_nodes)
    behind = left_behind(down, done)
    if behind:
        # No node stands behind these records any more: the breaker does not count them (fleet.py).
        left = {"incident": ctx.incident.id, "replaced_by": node.name}
        await ctx.deps.store.remember(LEFT_BEHIND, dict.fromkeys(behind, left), ctx.clock())
        await ctx.note(
            "left_behind",
            f"{node.name} serves Slurm node(s) {', '.join(slurm_nodes)}, not the failed node's "
            f"{', '.join(behind)}, whose slurmd went with the old machine: pitcrew does not resume "
            f"{'it' if len(behind) == 1 else 'them'}, and leaves the record as it is (slurm-operator "
            "deletes it under pruneSlurmNodeRecords: NodeNotFound; a dynamic node's is deleted by "
            f"scontrol delete NodeName={','.join(behind)})",
        )
    return Done(done, f"node {node.name} is Ready")


async def _served_elsewhere(
    ctx: StepContext[WaitReadyResult], node: str, slurm_nodes: tuple[str, ...]
) -> Wait | None:
    """After a repair in place (a reset, a reboot), where the node mapping reads the Slurm nodes
    from the node: the repaired node must still serve the failed node's Slurm nodes. A NodeSet's
    slurmd pod that left it all the same (deleted by hand, or ended by a graceful node shutdown,
    after which slurm-operator deletes the failed pod, ``processNodeSetPod``) does not come back to
    the cordoned node: in StatefulSet mode it is made again unbound and kube-scheduler places it on
    another node, where its Slurm node, the same name, registers a new slurmd, which proves nothing
    of this machine; in DaemonSet mode it is made again only once the node is uncordoned
    (``PodShouldRunOnNode``). The wait goes on, saying so, and the escalation says it if it runs
    out; the Slurm node is not returned."""
    served = set(await ctx.ports.slurm_names(node))
    away = [name for name in slurm_nodes if name not in served]
    if not away:
        return None
    return Wait(
        ctx.poll,
        f"{node} does not serve Slurm node {', '.join(away)} any more: its slurmd pod is not on the node, "
        "and its NodeSet makes a pod gone from a cordoned node again elsewhere (StatefulSet mode: a slurmd "
        "registered there is not this repair's proof) or not until the uncordon (DaemonSet mode), so the "
        "Slurm node is not returned: see where its pod is (kubectl get pods -o wide)",
    )


@dataclass(frozen=True, slots=True)
class _Restart:
    """A repair after which the Slurm nodes' slurmds must have started again, and what says so."""

    what: str
    before: tuple[SlurmdSeen, ...] | None
    #: Only for an intent without ``before`` (an older pitcrew's): when it was issued or handed over.
    since: datetime | None

    def started_again(self, state: SlurmNodeState) -> bool | None:
        return slurmd_started_again(state, self.before, self.since)


def _slurmd_restarted_by(ctx: StepContext[WaitReadyResult], issued: Sequence[IssueResult]) -> _Restart | None:
    """The repair after which the node's slurmd must have started again, under any node mapping:
    a reboot ends it (the node's boot), and so does a replacement (the old machine's goes with it;
    one serving the same Slurm node name, as under ``identity`` or a StatefulSet-mode NodeSet's
    replica, registers the same record again). An intent an older pitcrew persisted, with no start
    times read, keeps the rule it was issued under: under ``slinky`` a start time at or after the
    intent's time, elsewhere none (the wait ends at not NOT_RESPONDING). None: no such repair."""
    for result in issued:
        what = "replacement" if isinstance(result, ReplaceResult) else "reboot"
        if result.slurmd_before is not None:
            return _Restart(what, result.slurmd_before, None)
        if ctx.settings.slinky and result.issued_at is not None:
            return _Restart(what, None, result.issued_at)
    return None


async def _look_around(
    ctx: StepContext[WaitReadyResult],
    cluster: Cluster,
    replaced: ReplaceResult | None,
) -> None:
    """What the wait looks at beside the repaired node (``look_around``): the incident's Slurm nodes
    put back by other hands (``put_back_meanwhile``), and the replaced node its own repair system
    cannot take away. Each is said once; neither holds the wait up."""

    async def look() -> None:
        issued = replaced is not None and replaced.issued
        await put_back_meanwhile(ctx, replaced=issued, meanwhile=_REPAIR_GOES_ON)
        if replaced is not None and replaced.issued and replaced.handle:
            await _old_node_held(ctx, cluster, replaced.handle)

    await look_around(ctx, look)


#: What ``wait_ready`` does about a Slurm node put back before the repair is confirmed.
_REPAIR_GOES_ON = "It goes on with the repair."


async def _old_node_held(ctx: StepContext[WaitReadyResult], cluster: Cluster, handle: str) -> None:
    """While the wait polls, until it is told or the old node is seen gone: ``look_at_old_node``,
    recorded before humans are told (``tell_old_node_held``)."""
    if ctx.progress.termination_held is not None or ctx.progress.old_node_gone:
        return
    look = await look_at_old_node(ctx, cluster, handle)
    if look is None or (not look.gone and look.held is None):
        return
    await ctx.save(replace(ctx.progress, termination_held=look.held, old_node_gone=look.gone))
    if look.held is not None:
        await tell_old_node_held(ctx, look.held)


async def look_at_old_node(ctx: StepContext[Any], cluster: Cluster, handle: str) -> OldNodeLook | None:
    """Whether the replaced node's own repair system has taken it away, or cannot (Karpenter's
    termination waiting on a pod it may not evict, or on volumes to detach): then it stays, its
    instance billed, and nothing else would say so. A read that fails (the API server away, or a
    role without the reads ``check-config --live`` asks for) is logged: ``None``, look again later."""
    try:
        return await cluster.termination_held(ctx.node, handle=handle)
    except PitcrewError as exc:
        log.info("could not look whether the replaced node is held", extra={"reason": str(exc)})
        return None


#: The timeline event and notice kind, and the notice's key, of a replaced node that is not going away.
TERMINATION_HELD = "termination_held"


def old_node_held_notice(incident_id: str, node: str, held: str) -> Notice:
    """What humans are told of a replaced node its repair system cannot take away (a warning)."""
    return Notice(
        incident_id,
        TERMINATION_HELD,
        f"{node}: the replaced node is not going away",
        (held,),
        severity="warning",
        node=node,
    )


#: The old node still there when the watch after ``close`` ends, nothing seen holding it.
OLD_NODE_STAYED = "old_node_stayed"


def old_node_stayed(node: str, watched: timedelta) -> str:
    """What the timeline says of an old node still there at the end of the watch after ``close``."""
    minutes = round(watched.total_seconds() / 60)
    return (
        f"{node}, which the replacement took away, is still there {minutes} minutes after the incident "
        "closed, and nothing pitcrew can see holds it (no eviction refused, pod stuck terminating, "
        "volume or delete hook); pitcrew looks at it no more"
    )


def old_node_stayed_notice(incident_id: str, node: str, watched: timedelta) -> Notice:
    """What humans are told of it (info, once): its instance may still run and be billed."""
    return Notice(
        incident_id,
        OLD_NODE_STAYED,
        f"{node}: the replaced node is still there",
        (
            old_node_stayed(node, watched),
            f"see whether its deletion is under way (kubectl get node {node}; its NodeClaim or Machine) "
            "and why it has not finished",
        ),
        severity="info",
        node=node,
    )


async def tell_old_node_held(ctx: StepContext[Any], held: str) -> None:
    """Humans told what holds the replaced node: the timeline and a warning notice (one per
    incident, key ``termination_held``). It holds neither the successor's path nor the incident."""
    await ctx.note(TERMINATION_HELD, held)
    await ctx.tell(old_node_held_notice(ctx.incident.id, ctx.node, held), key=TERMINATION_HELD)


async def _faults_still_reported(ctx: StepContext[WaitReadyResult], node: str) -> Wait | None:
    """Where the playbook gives a ``fault_query`` (PromQL, ``{node}`` substituted) and Prometheus is
    configured, the node must no longer report the fault: a resolved alert alone is not proof."""
    promql = ctx.spec.options.get("fault_query")
    if not promql or ctx.ports.query is None:
        return None
    series = await ctx.ports.query.instant(str(promql).replace("{node}", node))
    if series:
        return Wait(ctx.poll, f"Prometheus still reports the fault on {node} ({len(series)} series)")
    return None


async def _slurm_node_back(
    ctx: StepContext[WaitReadyResult], slurm_nodes: tuple[str, ...], facts: Results
) -> Done[WaitReadyResult] | Wait:
    """Without Kubernetes, the sign of a repair is the node's slurmd starting again after the
    repair was handed to humans (``slurmd_started_again``: another start time than Slurm reported
    as it was handed over), or, where Slurm does not say when slurmd started, going away and coming
    back. A node still running the slurmd it had at the fault is not repaired."""
    repairs = [facts.of(kind) for kind in (ResetResult, RebootResult, ReplaceResult)]
    handed = [(r.handed_over_at, r) for r in repairs if r is not None and r.handed_over_at is not None]
    restart = None
    if handed:  # the last handed over; an older pitcrew's intent: started since it was handed over
        at, last = max(handed, key=lambda pair: pair[0])
        restart = _Restart("repair", last.slurmd_before, at if last.slurmd_before is None else None)
    gone = ctx.progress.seen_gone
    for name in slurm_nodes:
        state = await ctx.ports.scheduler.node(name)
        if "NOT_RESPONDING" in state.states:
            if not gone:
                await ctx.save(replace(ctx.progress, seen_gone=True))
            return Wait(ctx.poll, f"slurmd on {name} is away (being repaired)")
        restarted = restart is not None and restart.started_again(state) is True
        if not (restarted or gone):
            return Wait(ctx.poll, f"waiting for the repair of {name}: its slurmd has not started again")
        if state.taken_out and not is_pitcrew_reason(state.reason):
            return Wait(ctx.poll, f"{name} is back but held by someone else: {state.reason!r}")
    return Done(WaitReadyResult(ready_at=ctx.clock(), seen_gone=gone), "the Slurm node is back")
