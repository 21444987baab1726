"""The ports the engine drives: what pitcrew needs from each far side, and nothing more.

Each integration in ``bot.integrations`` implements one of these Protocols and raises only
``TransientError`` / ``PermanentError`` (``bot.engine.errors``). Methods that change the far
side are idempotent where the far side allows it (setting DOWN twice is harmless), but the
engine still checks state first and acts only when needed, so a retried or resumed step
never repeats a destructive call.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Protocol, runtime_checkable

from bot.domain.jobs import JobSnapshot, SlurmNodeState
from bot.domain.nodemap import SlurmdPod
from bot.domain.ownership import Taint
from bot.store.base import Json, OutboxItem


@dataclass(frozen=True, slots=True)
class PartitionNodes:
    """The Slurm partitions a node is in and how many distinct nodes they hold together."""

    nodes: int
    partitions: tuple[str, ...]


@runtime_checkable
class Scheduler(Protocol):
    """Slurm, through ``scontrol``/``squeue`` or slurmrestd."""

    async def node(self, name: str) -> SlurmNodeState:
        """State and reason of one Slurm node; ``PermanentError(reason=Reason.UNKNOWN_NODE)`` if absent."""
        ...

    async def jobs_on_node(self, name: str) -> list[JobSnapshot]:
        """Jobs currently running on ``name`` (record them *before* downing the node)."""
        ...

    async def job(self, job_id: str) -> JobSnapshot | None:
        """One job, or ``None`` once Slurm has forgotten it."""
        ...

    async def nodes(self) -> list[SlurmNodeState]:
        """Every Slurm node with its state and reason, in one read (the breaker's snapshot of
        nodes out of service, ``bot.engine.fleet``); on 22.05 also those of its partitions the list
        hides (powered-down ``State=CLOUD`` nodes), each read alone."""
        ...

    async def partition_nodes(self, name: str) -> PartitionNodes | None:
        """The partitions ``name`` is in and their distinct node count (the breaker's fleet
        where Kubernetes gives none); ``None`` when the node is in no partition."""
        ...

    async def down(self, name: str, reason: str) -> None:
        """Set the node DOWN with ``reason``: running jobs are killed and requeued if they allow it.
        DRAIN too, after it: under ReturnToService=2 Slurm gives a DOWN node back when its slurmd
        registers again, and only the DRAIN flag outlives that."""
        ...

    async def drain(self, name: str, reason: str) -> None:
        """Set the node DRAIN with ``reason``: running jobs finish, no new job starts."""
        ...

    async def resume(self, name: str) -> None:
        """Return the node to service (``State=RESUME``). The caller checks ownership first."""
        ...

    async def requeue(self, job_id: str) -> None:
        """Requeue one job (used after DRAIN when the playbook wants the job moved)."""
        ...

    async def signal_job(self, job_id: str, signal: str) -> None:
        """Send ``signal`` (a name: ``USR1``) to the job's batch step, e.g. to make it checkpoint now."""
        ...


@runtime_checkable
class Reservations(Protocol):
    """Slurm reservations holding spare nodes apart (``capacity.pools[].reservation``)."""

    async def reservation(self, name: str) -> tuple[str, ...] | None:
        """The nodes the reservation holds, or ``None`` when there is no such reservation."""
        ...

    async def set_reservation_nodes(self, name: str, nodes: Sequence[str]) -> None:
        """Make the reservation hold exactly ``nodes`` (at least one: Slurm cannot empty one)."""
        ...


@dataclass(frozen=True, slots=True)
class ClusterNode:
    """One Kubernetes node as the engine needs it."""

    name: str
    unschedulable: bool = False
    ready: bool = True
    taints: tuple[Taint, ...] = ()
    labels: Mapping[str, str] = field(default_factory=dict)
    annotations: Mapping[str, str] = field(default_factory=dict)
    #: Allocatable GPUs (``None``: the far side does not say).
    gpus: int | None = None


@dataclass(frozen=True, slots=True)
class OldNodeLook:
    """What a look at the node a replacement took away found (``Cluster.termination_held``)."""

    #: Nothing is left to take away (the deleted NodeClaim is gone), or nothing to look at for this
    #: replacement: no later look is needed.
    gone: bool = False
    #: Why the far side cannot finish taking it away, naming what holds it; ``None`` while nothing does.
    held: str | None = None


@dataclass(frozen=True, slots=True)
class PodRef:
    namespace: str
    name: str
    owner_kind: str | None = None
    mirror: bool = False
    terminating: bool = False
    #: A slurmd pod of a StatefulSet-mode Slinky NodeSet (slurm-operator's default): once it is gone
    #: its NodeSet makes it again under the same name, unbound, wherever kube-scheduler places it.
    nodeset_replica: bool = False

    @property
    def ref(self) -> str:
        return f"{self.namespace}/{self.name}"

    @property
    def nodeset_pod(self) -> bool:
        """A slurmd pod of a Slinky NodeSet, in either scaling mode: its controller is the NodeSet
        (slurm-operator makes it from the NodeSet's template with the NodeSet as controllerRef,
        ``NewNodeSetStatefulSetPod``, ``NewNodeSetDaemonSetPod``), not a DaemonSet's."""
        return self.owner_kind == "NodeSet"


@runtime_checkable
class Cluster(Protocol):
    """Kubernetes: cordon, drain, replace. Ownership lives in a node annotation."""

    async def node(self, name: str) -> ClusterNode | None: ...

    async def count_nodes(self) -> int: ...

    async def nodes(self) -> list[ClusterNode]:
        """Every node of the fleet (``kubernetes.node_selector``) in one list (the breaker's
        snapshot of nodes out of service, ``bot.engine.fleet``)."""
        ...

    async def cordon(self, name: str, *, incident_id: str, reason: str) -> None:
        """Mark unschedulable, add pitcrew's taint and the ownership annotation."""
        ...

    async def uncordon(self, name: str, *, incident_id: str) -> None:
        """Undo exactly what ``cordon`` added for ``incident_id``; never touch anything else."""
        ...

    async def set_annotations(self, name: str, annotations: Mapping[str, str | None]) -> None: ...

    async def set_labels(self, name: str, labels: Mapping[str, str | None]) -> None:
        """Set or (``None``) remove node labels; no other key is touched."""
        ...

    async def pods_on_node(self, name: str) -> list[PodRef]: ...

    async def slurmd_pods(self, namespace: str, selector: Mapping[str, str]) -> list[SlurmdPod]:
        """slurmd pods of a Slinky NodeSet (for mapping Kubernetes nodes to Slurm nodes)."""
        ...

    async def evict(self, pod: PodRef) -> None:
        """Eviction API; a PDB refusal (429) raises ``TransientError(reason=Reason.PDB)``."""
        ...

    async def delete_pod(self, pod: PodRef, *, force: bool) -> None: ...

    async def replace(
        self,
        name: str,
        *,
        strategy: str,
        incident_id: str,
        slurm_nodes: Sequence[str] = (),
        nodeset_pods: Sequence[str] = (),
    ) -> str:
        """Start a replacement and return a handle (e.g. the Machine or NodeClaim deleted).

        ``strategy="watch"`` starts nothing: another system is replacing the node (``repair_owner``)
        and the handle only says what ``successor`` waits for. ``slurm_nodes``: the Slurm nodes the
        node carried, by which a slurmd pod its NodeSet made again elsewhere is known;
        ``nodeset_pods``: the drain's ``PodRef.nodeset_replica`` pods (``namespace/name``), which their
        NodeSet makes again under that name even when it has not yet."""
        ...

    async def replacement_started(self, name: str, *, incident_id: str) -> bool: ...

    async def replacement_handle(self, name: str, *, strategy: str) -> str | None:
        """What ``replace`` (``strategy="reboot"``: ``reboot``) would record, read without acting, so
        the step persists it before the call (the old node may be gone, or rebooted, by the time a
        crashed step resumes); ``None``: nothing to record."""
        ...

    async def repair_owner(self, name: str) -> str | None:
        """Who else is already repairing or replacing the node (a controller, a taint), else ``None``."""
        ...

    async def successor(self, name: str, *, handle: str | None) -> ClusterNode | None:
        """The node serving in ``name``'s place: the same node, or the replacement ``handle`` started."""
        ...

    async def held_up(self, name: str, *, handle: str) -> str | None:
        """While ``successor`` finds none: what the far side last said, since the replacement
        ``handle`` of ``name`` began, about why it makes no node for it (Karpenter's
        ``FailedScheduling`` on the placeholder pod), or ``None``. Read only."""
        ...

    async def termination_held(self, name: str, *, handle: str) -> OldNodeLook:
        """Once the replacement ``handle`` of ``name`` started: whether the far side has taken the
        old node away, and if not what keeps it from doing so (Karpenter's termination waiting on
        pods it may not evict, a ``do-not-disrupt`` annotation or a budget allowing no eviction, or
        on volumes to detach), naming them. Read only."""
        ...

    async def cancel_replacement(self, name: str, *, incident_id: str) -> bool: ...

    async def reboot(self, name: str, *, incident_id: str, rung: str) -> str | None:
        """Reboot the node; a handle ``successor`` can tell the rebooted node by (``None``: none).
        ``rung``: the playbook of the incident's repair ladder this call is made in (``reset_gpu``
        and ``NodeValidator.validate`` too): a retried or resumed call of the same rung finds what
        its first made (a Job), a later rung's never takes an earlier one's verdict for its own."""
        ...

    async def reset_gpu(self, name: str, gpus: Sequence[str], *, incident_id: str, rung: str) -> None: ...


@dataclass(frozen=True, slots=True)
class Lend:
    """What taking a node from a Kubernetes pool changes on it (``capacity.pools[].selector``)."""

    incident_id: str
    #: Labels set once the node is free, so the jobs' Slinky NodeSet selects it (``join_labels``):
    #: ``lend`` records what they were and ``Lending.join`` sets them.
    join: Mapping[str, str]
    #: Label keys removed while lent: the pool's selector and ``leave_labels``.
    leave: tuple[str, ...]
    #: Cordon the node first (a lender: no new inference pod lands while its pods are evicted);
    #: ``Lending.join`` lifts it as the node joins the NodeSet.
    cordon: bool


@runtime_checkable
class Lending(Cluster, Protocol):
    """Kubernetes pools: nodes lent to Slurm for a stalled job, and given back exactly.

    Every write is one guarded patch carrying the incident's mark (``bot.domain.ownership``
    ``lent_marks``) and what the node was before, so a resumed take or give-back finds what it
    already did, and a give-back restores only what the take changed."""

    async def pool_nodes(self, selector: str) -> list[ClusterNode]:
        """The nodes the label selector selects now (a lent node no longer matches it)."""
        ...

    async def lend(self, name: str, lend: Lend) -> bool:
        """Mark, (cordon,) take the pool's labels off, recording what the node was (the join labels
        included); ``False`` when this incident's take is already on the node."""
        ...

    async def join(self, name: str, labels: Mapping[str, str], *, incident_id: str) -> bool:
        """The node joins the jobs' NodeSet once its pods have left: its ``join_labels`` on and the
        take's cordon lifted, in one guarded patch (slurm-operator runs no NodeSet pod on a
        cordoned node, and drains the Slurm node of one: a lender kept cordoned never served the
        job). ``False`` if the node is not lent to this incident (nothing is written)."""
        ...

    async def lend_back(self, name: str, *, incident_id: str) -> bool:
        """Restore the labels and cordon the take changed, drop the marks; ``False`` if not ours."""
        ...

    async def keep_lent(self, name: str, *, incident_id: str) -> bool:
        """The node stays with the jobs (``give_back: refill``): uncordon it if the take cordoned it
        and drop the marks, keeping its new labels; ``False`` if not ours."""
        ...

    async def pool_command(self, name: str, argv: Sequence[str], *, incident_id: str, limit: float) -> str:
        """Run a pool's ``join_command`` or ``leave_command`` for node ``name`` (its placeholders
        filled, ``bot.domain.pool_command``) without a shell; its output. A non-zero exit is a
        ``PermanentError``; past ``limit`` seconds it is killed, a ``TransientError``."""
        ...


@runtime_checkable
class NodeValidator(Protocol):
    """A cluster that can prove a repaired node healthy before it returns (an operator's Job)."""

    async def validate(self, name: str, *, incident_id: str, rung: str) -> bool | None:
        """``True`` when the validation passed, ``None`` when none is configured; a failed one raises
        ``PermanentError(reason=Reason.JOB_FAILED)``."""
        ...


@dataclass(frozen=True, slots=True)
class Notice:
    """One message for humans. ``actions`` are the commands offered (approve, rollback, …)."""

    incident_id: str | None
    kind: str
    title: str
    lines: tuple[str, ...] = ()
    severity: str = "info"
    actions: tuple[str, ...] = ()
    node: str | None = None
    #: The step that posts it and what it is about in that step's run (``StepContext.tell``): the
    #: outbox posts a notice with a ``key`` at most once per incident, run of its step and key
    #: (without an incident, once per step and key for good: ``Store.told``).
    step: str | None = None
    key: str | None = None

    @classmethod
    def from_record(cls, record: Mapping[str, object]) -> Notice:
        """The notice back from ``record()`` (as the outbox stores it); unknown keys are ignored."""

        def strings(key: str) -> tuple[str, ...]:
            value = record.get(key)
            return tuple(str(v) for v in value) if isinstance(value, list | tuple) else ()

        def text(key: str) -> str | None:
            value = record.get(key)
            return None if value is None else str(value)

        return cls(
            text("incident_id"),
            str(record.get("kind", "")),
            str(record.get("title", "")),
            strings("lines"),
            severity=str(record.get("severity") or "info"),
            actions=strings("actions"),
            node=text("node"),
        )

    def record(self) -> dict[str, Json]:
        """The notice as one journal or log record (what humans were told, nothing more); with its
        ``node``, the outbox's payload; ``from_record`` reads either back."""
        return {
            "incident_id": self.incident_id,
            "kind": self.kind,
            "title": self.title,
            "lines": list(self.lines),
            "severity": self.severity,
            "actions": list(self.actions),
        }


@runtime_checkable
class Notifier(Protocol):
    """Slack (or a log of what would have been posted). Returns a message reference."""

    async def post(self, notice: Notice) -> str | None: ...


@runtime_checkable
class Destination(Protocol):
    """Where the outbox sender (``bot.engine.outbox``) delivers notices: Slack, later Grafana.

    ``deliver`` is called for one item at a time, in order per incident, until it returns (the
    item is delivered; the answer is its reference) or raises ``PermanentError`` (given up,
    audited). ``TransientError`` (with ``retry_after`` when the far side gave one) retries it
    later, with backoff. A delivery may be repeated after a crash (``item.attempts > 1``): the
    destination must then find what it already posted and update it instead of posting twice.
    ``more`` says that later items of the same incident are waiting right behind this one (a
    destination may leave a summary update to the last of them).
    """

    @property
    def name(self) -> str: ...

    async def deliver(self, item: OutboxItem, *, more: bool = False) -> str | None: ...


@dataclass(frozen=True, slots=True)
class Probe:
    """What ``pitcrew check-config --live`` prints for one far side: reachable and allowed, or what is missing.

    ``missing`` names each permission, scope or object the far side refused (a Kubernetes verb,
    a Slack scope, a channel), so the installer knows exactly what to grant. ``unable`` names
    operations the far side cannot do here (``("requeue", why)``) although it is reachable: the
    playbooks that need one are refused by ``check-config --live``.
    """

    system: str
    ok: bool
    detail: str
    missing: tuple[str, ...] = ()
    unable: tuple[tuple[str, str], ...] = ()


@runtime_checkable
class Probeable(Protocol):
    """An adapter that can check its far side without changing anything (``check-config --live``)."""

    async def probe(self) -> Probe: ...


@runtime_checkable
class MetricsQuery(Protocol):
    """Prometheus HTTP API: instant queries for progress and still-firing checks."""

    async def instant(self, promql: str) -> list[tuple[dict[str, str], float]]: ...


@dataclass(frozen=True, slots=True)
class Region:
    """One incident as a region on the dashboards' time axis: from the fault to the close."""

    incident_id: str
    node: str
    fault_class: str
    playbook: str
    start: datetime
    summary: str = ""

    @property
    def tags(self) -> tuple[str, ...]:
        """What a dashboard's annotation query filters on (``pitcrew``), what a human reads, and
        the incident's own tag (``incident_tag``) by which a redelivery finds what it created."""
        return ("pitcrew", self.node, self.fault_class, self.playbook, incident_tag(self.incident_id))


def incident_tag(incident_id: str) -> str:
    """The one tag naming an incident's annotation: searched before creating, never created twice."""
    return f"incident:{incident_id}"


@runtime_checkable
class Annotator(Protocol):
    """Grafana: one region annotation per incident, opened at the fault and closed at the end."""

    async def open_region(self, region: Region) -> int:
        """Create the annotation (time = the fault); returns its id for ``close_region``."""
        ...

    async def close_region(self, annotation_id: int, end: datetime, text: str | None = None) -> None:
        """Set the annotation's end time (``timeEnd``), and its text when given (the outcome)."""
        ...

    async def find_region(self, incident_id: str) -> int | None:
        """The id of the incident's annotation if Grafana already has it (by ``incident_tag``)."""
        ...
