"""The Slurm watch: every poll, Slurm nodes that Slurm (or a health check, or a person) took out
become alerts in the store, and the ones Slurm returned resolve.

Runs inside the engine's scan, so only in the process that leads the store, and writes through
the engine's fenced store: a deposed process opens nothing. What it ingests is an alert like any
other (``bot.domain.slurm_watch``): it opens an incident or attaches to the node's active one, and
everything after - guards, mode, pause, opt-out, the playbook - is the engine's as for a Prometheus
alert. It must not act on Slurm or Kubernetes itself, nor judge whose a reason is
(``bot.domain.slurm_watch.out_by_others`` does).

It also remembers, per node, the jobs running there at its last look while the node was in
service (one ``jobs_on_node`` per busy node and poll, as the hung-job watch reads them; a look
finding a busy node without a running job keeps the look before): when Slurm
sets a node DOWN its jobs leave it at once (requeued, or ended ``NODE_FAIL``), and the record of
the outage names them so the incident can follow them. The memory is kept in the store
(``bot.engine.memory``): a node Slurm takes out while pitcrew restarts or changes leader still names
the jobs the last look saw there. A node back in service and idle, or gone from Slurm's list, is
forgotten; a node that went out before any pitcrew saw it in service names no jobs.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import datetime

from bot import logger
from bot.domain.catalog import Catalog
from bot.domain.jobs import JobSnapshot, SlurmNodeState
from bot.domain.labels import node_name
from bot.domain.outages import SLURM_OUT
from bot.domain.slurm_watch import ALERTNAME, SLURM_FAULT, out_by_others, outage
from bot.engine.deps import EngineDeps
from bot.engine.errors import PermanentError, PitcrewError, Reason
from bot.engine.memory import Memory
from bot.engine.ports import Scheduler
from bot.engine.sourced import AlertSource
from bot.store.base import AlertRecord, IngestOutcome

log = logger(__name__)
RECEIVER = "pitcrew-slurm-watch"


@dataclass(frozen=True, slots=True)
class Seen:
    """The running jobs on one Slurm node at the last look while it was in service."""

    jobs: tuple[JobSnapshot, ...] = ()


class SlurmWatch(AlertSource):
    def __init__(
        self,
        deps: EngineDeps,
        catalog: Catalog,
        *,
        look_again: Callable[[IngestOutcome], None],
        opened: Callable[[], None],
    ) -> None:
        super().__init__(
            deps,
            catalog,
            alertname=ALERTNAME,
            fault=SLURM_FAULT,
            receiver=RECEIVER,
            look_again=look_again,
            opened=opened,
        )
        self._last: datetime | None = None
        #: Slurm node → the jobs on it at the last look while it was in service.
        self._memory = Memory(deps.store, RECEIVER, Seen)
        self._seen: dict[str, tuple[JobSnapshot, ...]] | None = None

    @property
    def lister(self) -> Scheduler | None:
        return self._deps.ports.scheduler

    async def poll(self) -> None:
        """One look at Slurm, at most once per ``poll_interval`` (the scan also runs on every wake)."""
        now = self._deps.clock()
        lister = self.lister
        if lister is None or (
            self._last is not None and now - self._last < self._deps.settings.poll_interval
        ):
            return
        self._last = now
        firing = await self.firing_alerts()
        try:
            nodes = await lister.nodes()
            nodes += await self._unlisted(lister, {node.name for node in nodes}, firing)
        except PitcrewError as exc:
            log.warning("slurm watch: cannot list nodes", extra={"error": str(exc), "reason": exc.reason})
            return
        if self._seen is None:
            self._seen = {name: seen.jobs for name, seen in (await self._memory.load()).items()}
        seen = self._seen
        for gone in set(seen) - {node.name for node in nodes}:
            del seen[gone]
        found = []
        for node in nodes:
            if out_by_others(node):
                if await self._ours_to_watch(node.name):
                    found.append(outage(node, now, seen.get(node.name, ())))
            else:
                await self._look_at_jobs(lister, node, seen)
        await self._memory.save({name: Seen(jobs) for name, jobs in seen.items()}, now)
        await self.file(found, now, firing)

    async def _unlisted(
        self, lister: Scheduler, listed: set[str], firing: Iterable[AlertRecord]
    ) -> list[SlurmNodeState]:
        """The nodes of this watch's firing outages that Slurm's list left out, each read alone. 22.05's
        slurmctld lists no powered-down ``State=CLOUD`` node unless ``PrivateData=cloud`` (``node_mgr.c``
        ``_is_cloud_hidden``), and power saving suspends a DOWN node too: its outage is not over for
        that. ``Scheduler.nodes`` adds such nodes of Slurm's partitions; this reads one in none. A
        node Slurm no longer knows at all is left out, and its outage ends."""
        out = {name for a in firing if (name := a.labels.get("slurm_node"))}
        found = []
        for name in sorted(out - listed):
            try:
                found.append(await lister.node(name))
            except PermanentError as exc:
                if exc.reason != Reason.UNKNOWN_NODE:
                    raise
        return found

    async def _look_at_jobs(
        self, lister: Scheduler, node: SlurmNodeState, seen: dict[str, tuple[JobSnapshot, ...]]
    ) -> None:
        """Remember the jobs on a node in service; one out of service keeps what was seen before."""
        if node.states & SLURM_OUT:
            return  # out by pitcrew's own hand (its incident recorded the jobs before DOWN), or no reason yet
        if not node.busy:
            seen.pop(node.name, None)
            return
        try:
            jobs = await lister.jobs_on_node(node.name)
        except PitcrewError as exc:
            log.warning(
                "slurm watch: cannot list jobs",
                extra={"node": node.name, "error": str(exc), "reason": exc.reason},
            )
            return
        running = tuple(j for j in jobs if j.running)
        if running or node.name not in seen:
            seen[node.name] = running
        # else: listed busy, yet no job runs there when read: the node changed between the two reads
        # (Slurm set it DOWN and ended its jobs, or they are completing). The look before stands
        # until the node is listed idle; erasing it here would leave the outage naming no job.

    async def _ours_to_watch(self, name: str) -> bool:
        """The Slurm node is the Kubernetes node of the same name (identity mapping)."""
        try:
            node_name(name)
            return list(await self._deps.ports.slurm_names(name)) == [name]
        except (ValueError, PitcrewError):
            return False
