"""The simulated far side's world: Slurm and Kubernetes modelled over a journal and an inventory.

A proving-ground tool, never a default, imported only by the demo and the tests: the crash,
storm, approval and rollback tests and ``scripts/demo`` run pitcrew against it (``python -m tests.simulator.serve``). Each call
that would change something is one JSON line, flushed and fsynced before the call returns,
so the journal survives a SIGKILL of pitcrew and is the far side's own record of what
reached it. State (is the node cordoned? which pods are left? where did the job go?) is
derived by replaying the journal over an optional inventory, modelling the effects the real
systems have: DOWN requeues a requeueable job onto a healthy node with its restart count
raised (a job Slurm cannot requeue ends NODE_FAIL); pitcrew's requeue of a job submitted
``--no-requeue`` or not a batch job is refused and the job runs on, as slurmctld refuses it; a
user's job started on a node (``job_started``, no call of pitcrew's) runs there only while the node is
in service, and pends while it is DOWN or DRAIN, as slurmctld schedules it; a
replaced node comes back Ready and uncordoned while its Slurm node stays DOWN until RESUME
(Slurm's ReturnToService=1 behaviour); a slurmd that went away with its machine leaves its Slurm
node NOT_RESPONDING (``slurmd_gone``, the far side's own record, as is ``slurmd_registered``: a
new slurmd's dynamic node, ``tests.simulator.cluster.DaemonSetNodeSet``, which also journals
slurm-operator's drain, undrain and preStop DOWN: ``operator_drain``, ``operator_undrain``, ``prestop_down``). ``latency`` models the round trip. A replaced node is
NotReady for ``replace_seconds``.
"""

from __future__ import annotations

import asyncio
import fcntl
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import yaml

from bot.domain.jobs import NO_REQUEUE, NOT_BATCH, JobSnapshot, SlurmNodeState
from bot.domain.ownership import OWNER_ANNOTATION
from bot.engine.errors import PermanentError, Reason
from bot.engine.ports import PartitionNodes


@dataclass
class _Node:
    name: str
    ready: bool = True
    unschedulable: bool = False
    labels: dict[str, str] = field(default_factory=dict)
    annotations: dict[str, str] = field(default_factory=dict)
    tainted: bool = False
    pods: dict[str, str | None] = field(default_factory=dict)  # "namespace/name" → owner kind
    slurm: str = "IDLE"
    #: The DRAIN flag on a DOWN node (the port's ``down`` sets both; a journal record with
    #: ``"drain": false`` is a DOWN whose DRAIN never came: its process stopped between them).
    drain: bool = False
    reason: str = ""
    #: Slurm partitions the node is in (inventory ``partitions``; default one partition, gpu).
    partitions: tuple[str, ...] = ("gpu",)
    replaced: bool = False
    #: Whether its slurmd answers slurmctld (a replaced node's own record does not: its slurmd went
    #: with the machine, when the replacement serves another Slurm node; ``slurmd_gone``).
    responding: bool = True
    #: When the replacement was started (a slow replacement is NotReady for a while after it).
    replaced_at: datetime | None = None


def _states(node: _Node) -> frozenset[str]:
    flags = [*(["DRAIN"] if node.drain else []), *([] if node.responding else ["NOT_RESPONDING"])]
    return frozenset({node.slurm, *flags})


@dataclass
class _Job:
    job_id: str
    name: str
    user: str
    node: str
    requeue: bool = True
    state: str = "RUNNING"
    restarts: int = 0
    #: Submitted by sbatch (inventory ``batch``, default true); ``false``: an srun or salloc job.
    batch: bool = True


def _node_from(name: str, spec: Mapping[str, Any]) -> _Node:
    pods: dict[str, str | None] = {}
    for pod in spec.get("pods", []):
        if isinstance(pod, str):
            pods[pod] = None
        else:
            pods[str(pod["pod"])] = pod.get("owner_kind")
    return _Node(
        name,
        ready=bool(spec.get("ready", True)),
        unschedulable=bool(spec.get("unschedulable", False)),
        labels=dict(spec.get("labels", {})),
        annotations=dict(spec.get("annotations", {})),
        pods=pods,
        slurm=str(spec.get("slurm_state", "IDLE")).upper(),
        reason=str(spec.get("slurm_reason", "")),
        partitions=tuple(str(p) for p in spec.get("partitions", ("gpu",))),
    )


class Journal:
    """Append-only JSON lines, fsynced; readers pick up only what is new since last time."""

    def __init__(self, path: Path | None) -> None:
        self.path = path
        self._records: list[dict[str, Any]] = []
        self._offset = 0
        self._lock = asyncio.Lock()

    async def append(self, record: dict[str, Any]) -> None:
        """Durable before it returns; the fsync runs off the event loop."""
        record = {"at": datetime.now(UTC).isoformat(), **record}
        if self.path is None:
            self._records.append(record)
            return
        async with self._lock:  # one writer at a time keeps lines whole and ordered
            await asyncio.to_thread(self._write_line, record)

    def _write_line(self, record: dict[str, Any]) -> None:
        assert self.path is not None
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self.path.open("a", encoding="utf-8") as handle:
            fcntl.flock(handle, fcntl.LOCK_EX)
            handle.write(json.dumps(record, sort_keys=True) + "\n")
            handle.flush()
            os.fsync(handle.fileno())

    def records(self) -> list[dict[str, Any]]:
        if self.path is None or not self.path.exists():
            return self._records
        with self.path.open("rb") as handle:
            handle.seek(self._offset)
            chunk = handle.read()
        complete = chunk[: chunk.rfind(b"\n") + 1]
        self._offset += len(complete)
        self._records.extend(json.loads(line) for line in complete.splitlines() if line.strip())
        return self._records


class SimulatedWorld:
    """The simulated Slurm (the Scheduler port) and the state the simulated cluster reads."""

    #: ``bot.runtime.build_app`` refuses ports that say this unless a test allows them.
    far_side = "simulator"

    def __init__(self, journal: Journal, inventory: Mapping[str, Any] | None = None) -> None:
        self.journal = journal
        inventory = inventory or {}
        self._nodes = {
            name: _node_from(name, spec or {}) for name, spec in (inventory.get("nodes") or {}).items()
        }
        self._jobs = {
            str(j["job_id"]): _Job(
                str(j["job_id"]),
                j.get("name", "job"),
                j.get("user", "user"),
                j["node"],
                bool(j.get("requeue", True)),
                batch=bool(j.get("batch", True)),
            )
            for j in inventory.get("jobs") or []
        }
        self._known_nodes = frozenset(self._nodes)
        self._applied = 0
        self.latency = 0.0
        #: Seconds a replaced node stays NotReady (its new machine booting); 0: Ready at once.
        self.replace_seconds = 0.0

    @classmethod
    def from_paths(
        cls,
        journal: Path | None,
        inventory: Path | None,
        latency: float = 0.0,
        replace_seconds: float = 0.0,
    ) -> SimulatedWorld:
        data = yaml.safe_load(inventory.read_text()) if inventory is not None else None
        world = cls(Journal(journal), data or {})
        world.latency = latency
        world.replace_seconds = replace_seconds
        return world

    def ready(self, node: _Node) -> bool:
        """Ready, unless a slow replacement is still booting."""
        if node.replaced_at is not None and self.replace_seconds:
            return node.ready and datetime.now(UTC) >= node.replaced_at + timedelta(
                seconds=self.replace_seconds
            )
        return node.ready

    async def round_trip(self) -> None:
        """Model the round trip to a real API (demos, crash tests); zero by default."""
        if self.latency:
            await asyncio.sleep(self.latency)

    # ---------------------------------------------------------------- replay
    def state(self) -> tuple[dict[str, _Node], dict[str, _Job]]:
        """The modelled far side: the inventory with every journal record applied, in order."""
        records = self.journal.records()
        for record in records[self._applied :]:
            self._apply(record, self._nodes, self._jobs)
        self._applied = len(records)
        return self._nodes, self._jobs

    def _apply(self, r: dict[str, Any], nodes: dict[str, _Node], jobs: dict[str, _Job]) -> None:
        op = r.get("op")
        node = nodes.setdefault(r["node"], _Node(r["node"])) if "node" in r else None
        # ``operator_*`` and ``prestop_down``: not pitcrew's, slurm-operator's (``DaemonSetNodeSet``).
        if op in {"slurm_drain", "operator_drain"} and node is not None and node.slurm == "DOWN":
            node.drain, node.reason = True, r["reason"]  # a flag on the DOWN, as slurmctld keeps it
        elif op in {"slurm_down", "slurm_drain", "operator_drain"} and node is not None:
            node.slurm, node.reason = ("DOWN" if op == "slurm_down" else "DRAIN"), r["reason"]
            node.drain = op == "slurm_down" and bool(r.get("drain", True))
            if op == "slurm_down":
                self._requeue_from(node, jobs, nodes)
        elif op == "prestop_down" and node is not None:
            # ``scontrol update state=down``: a DRAIN before it stays a flag on the DOWN.
            node.drain = node.drain or node.slurm == "DRAIN"
            node.slurm, node.reason = "DOWN", r["reason"]
            self._requeue_from(node, jobs, nodes)
        elif op == "operator_undrain" and node is not None:
            # UNDRAIN clears DRAIN only and takes the reason it is given (node_mgr.c ``update_node``):
            # a DOWN stays DOWN, relabelled; a drained node is IDLE again.
            if node.slurm == "DRAIN":
                node.slurm, node.reason = "IDLE", ""
            elif node.drain:
                node.drain, node.reason = False, r["reason"]
        elif op == "slurm_resume" and node is not None:
            node.slurm, node.reason, node.drain = "IDLE", "", False
        elif op == "requeue":
            requeued = jobs.get(str(r["job_id"]))
            if requeued is not None:
                self._requeue(requeued, nodes)
        elif op == "job_started":  # not pitcrew's: slurmctld scheduled a user's job on the node
            # A node out of service (DOWN, DRAIN, either as a flag) takes no new job: it pends.
            held = node is None or node.slurm in {"DOWN", "DRAIN"} or node.drain or not node.responding
            jobs[str(r["job_id"])] = _Job(
                str(r["job_id"]),
                str(r.get("name", "job")),
                str(r.get("user", "user")),
                str(r["node"]),
                bool(r.get("requeue", True)),
                state="PENDING" if held else "RUNNING",
            )
        elif op == "job_ended":  # not pitcrew's: the job finished, or a human scancelled it
            ended = jobs.get(str(r["job_id"]))
            if ended is not None:
                ended.state = str(r.get("state", "COMPLETED"))
        elif op == "slurmd_gone" and node is not None:  # not pitcrew's: the machine went away
            node.responding = False
        elif op == "slurmd_registered" and node is not None:  # not pitcrew's: a new slurmd (dynamic node)
            node.responding = True
        elif op == "cordon" and node is not None:
            node.unschedulable = node.tainted = True
            node.annotations[OWNER_ANNOTATION] = r["incident_id"]
        elif op == "uncordon" and node is not None:
            node.unschedulable = node.tainted = False
            node.annotations.pop(OWNER_ANNOTATION, None)
        elif op == "annotate" and node is not None:
            for key, value in r["annotations"].items():
                if value is None:
                    node.annotations.pop(key, None)
                else:
                    node.annotations[key] = value
        elif op == "label" and node is not None:
            for key, value in r["labels"].items():
                if value is None:
                    node.labels.pop(key, None)
                else:
                    node.labels[key] = value
        elif op in {"evict", "delete_pod"} and node is not None:
            node.pods.pop(r["pod"], None)
        elif op == "replace" and node is not None:
            # A new machine under the same name: clean, Ready, empty; Slurm keeps the DOWN.
            node.replaced, node.unschedulable, node.tainted = True, False, False
            node.replaced_at = datetime.fromisoformat(r["at"])
            node.pods = {ref: kind for ref, kind in node.pods.items() if kind == "DaemonSet"}
            node.annotations.pop(OWNER_ANNOTATION, None)
            node.ready = True

    def _requeue_from(self, node: _Node, jobs: dict[str, _Job], nodes: dict[str, _Node]) -> None:
        """A DOWN kills the node's running jobs: each is requeued (or ends)."""
        for job in jobs.values():
            if job.node == node.name and job.state == "RUNNING":
                self._requeue(job, nodes)

    def _requeue(self, job: _Job, nodes: dict[str, _Node]) -> None:
        if not job.requeue or not job.batch:  # a DOWN ends it: Slurm brings back batch jobs only
            job.state = "NODE_FAIL"
            return
        spare = next((n.name for n in nodes.values() if n.slurm == "IDLE" and n.name != job.node), None)
        job.node, job.state, job.restarts = spare or f"{job.node}-spare", "RUNNING", job.restarts + 1

    def node_record(self, name: str) -> _Node:
        """A node's modelled state; with an inventory, unknown names are refused like a real API would."""
        nodes, _ = self.state()
        if self._known_nodes and name not in nodes:
            raise PermanentError(f"unknown node {name}", reason=Reason.UNKNOWN_NODE)
        return nodes.get(name) or _Node(name)

    async def write(self, op: str, **data: Any) -> None:
        await self.round_trip()
        await self.journal.append({"op": op, **data})

    # ---------------------------------------------------------------- Scheduler
    async def node(self, name: str) -> SlurmNodeState:
        await self.round_trip()
        n = self.node_record(name)
        return SlurmNodeState(name=name, states=_states(n), reason=n.reason)

    async def nodes(self) -> list[SlurmNodeState]:
        await self.round_trip()
        nodes, _ = self.state()
        return [SlurmNodeState(name=n.name, states=_states(n), reason=n.reason) for n in nodes.values()]

    async def jobs_on_node(self, name: str) -> list[JobSnapshot]:
        await self.round_trip()
        _, jobs = self.state()
        return [self._snapshot(j) for j in jobs.values() if j.node == name and j.state == "RUNNING"]

    async def job(self, job_id: str) -> JobSnapshot | None:
        await self.round_trip()
        _, jobs = self.state()
        return self._snapshot(jobs[job_id]) if job_id in jobs else None

    async def partition_nodes(self, name: str) -> PartitionNodes | None:
        """The nodes sharing a partition with ``name``: the inventory's, plus any the journal named."""
        await self.round_trip()
        nodes, _ = self.state()
        here = nodes.get(name)
        if here is None or not here.partitions:
            return None
        members = {n.name for n in nodes.values() if set(n.partitions) & set(here.partitions)}
        return PartitionNodes(len(members), here.partitions)

    @staticmethod
    def _snapshot(job: _Job) -> JobSnapshot:
        return JobSnapshot(
            job.job_id, job.name, job.user, job.state, (job.node,), job.restarts, job.requeue, batch=job.batch
        )

    async def start_job(self, job_id: str, node: str, *, name: str = "job", user: str = "user") -> None:
        """A user's job is scheduled on ``node`` (sbatch ``-w``), no call of pitcrew's: it runs
        there if the node is in service, and pends while it is out (DOWN or DRAIN), as slurmctld
        schedules no job on such a node."""
        await self.journal.append(
            {"op": "job_started", "job_id": job_id, "node": node, "name": name, "user": user}
        )

    async def end_job(self, job_id: str, state: str = "CANCELLED") -> None:
        """The job ends by itself or by a human (``scancel``): no call of pitcrew's."""
        await self.journal.append({"op": "job_ended", "job_id": job_id, "state": state})

    async def down(self, name: str, reason: str) -> None:
        await self.write("slurm_down", node=name, reason=reason)

    async def drain(self, name: str, reason: str) -> None:
        await self.write("slurm_drain", node=name, reason=reason)

    async def resume(self, name: str) -> None:
        await self.write("slurm_resume", node=name)

    async def requeue(self, job_id: str) -> None:
        """Refused, and nothing changes, as slurmctld refuses (``job_mgr.c`` ``_job_requeue_op``): a
        job submitted not requeueable (ESLURM_DISABLED), then one that is not a batch job
        (ESLURM_BATCH_ONLY). What the adapters raise for either (``Reason.NOT_REQUEUEABLE``)."""
        _, jobs = self.state()
        job = jobs.get(job_id)
        if job is not None and (not job.requeue or not job.batch):
            await self.round_trip()
            if not job.requeue:
                meaning, said = (
                    NO_REQUEUE,
                    "Requested operation is presently disabled",
                )
            else:
                meaning, said = (
                    NOT_BATCH,
                    "Only batch jobs are accepted or processed",
                )
            raise PermanentError(
                f"requeue: Slurm will not requeue job {job_id}: {meaning} (Slurm: {said} for job {job_id})",
                reason=Reason.NOT_REQUEUEABLE,
            )
        await self.write("requeue", job_id=job_id)

    async def signal_job(self, job_id: str, signal: str) -> None:
        await self.write("signal_job", job_id=job_id, signal=signal)
