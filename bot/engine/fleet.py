"""The fleet as the breaker sees it: which nodes are out of service, read at most once per interval.

The breaker counts every node out of service, whoever took it out (``bot.domain.outages``).
Reading that per alert would cost a list of every Slurm and Kubernetes node per alert — in a
storm of thousands, thousands of lists of 10,000 nodes. So the snapshot is read through the
ports (``Scheduler.nodes``, ``Cluster.nodes``: one list each, and on Slurm 22.05 a read of each
powered-down cloud node its list hides) and kept for ``max_age`` (the
engine's poll interval): a storm costs at most two reads per interval, however many alerts
it brings. Concurrent callers share one read in flight. A failed read is kept for the same
interval too (a far side that is down is not hammered), and the last good view of that far
side stands in for it; with none, the snapshot says it could not be read and the breaker
counts only pitcrew's own incidents, in words.

pitcrew's own changes made since the last read are not lost meanwhile: the store's count of
nodes under remediation (``Store.nodes_in_remediation``) is added to the snapshot.

One thing out of service is no node: a Slurm record pitcrew's replacement left behind
(``bot.engine.steps.repair.left_behind``: a Slinky DaemonSet-mode NodeSet names the Slurm node after
the Kubernetes node, the replacement registers a new one, and the old record stays, its slurmd gone
with the machine, DOWN by its pod's preStop hook, until someone deletes it; slurm-operator's
``pruneSlurmNodeRecords`` defaults to ``Never``). ``wait_ready`` remembers each in the store
(``LEFT_BEHIND``), and the read leaves such a record out once Slurm says no slurmd answers for it
(``NOT_RESPONDING``, after ``SlurmdTimeout``): counted, one such replacement would hold every later
repair at ``max_nodes`` 1 for as long as the record stays. A record under that name whose slurmd
answers (a node given the name again) is a node, and counted as any other.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta

from bot.domain.jobs import not_responding
from bot.domain.outages import Outage, OutOfService, kubernetes_outage, slurm_outage
from bot.engine.context import Ports
from bot.engine.errors import PitcrewError
from bot.store.base import Store

#: The store's memory (``Store.remember``) of Slurm records pitcrew's replacements left behind: the
#: record's name → the incident and the node that replaced its machine.
LEFT_BEHIND = "left_behind"


@dataclass(frozen=True, slots=True)
class FleetSnapshot:
    """What one read of the fleet found."""

    out_of_service: OutOfService
    #: Kubernetes' node count from the same list (``None``: no cluster, or it could not be read).
    kubernetes_nodes: int | None = None
    #: Why there is no Kubernetes count, in the breaker's words.
    kubernetes_gap: str = ""


class FleetView:
    """The cached snapshot; ``reads`` counts the lists asked of each far side (for the bench)."""

    def __init__(
        self, ports: Ports, clock: Callable[[], datetime], max_age: timedelta, store: Store | None = None
    ) -> None:
        self._ports = ports
        self._store = store
        self._clock = clock
        self._max_age = max_age
        self._lock = asyncio.Lock()
        self._snapshot: FleetSnapshot | None = None
        self._read_at: datetime | None = None
        self._slurm: list[Outage] | None = None
        self._kubernetes: tuple[list[Outage], int] | None = None
        self.reads: Counter[str] = Counter()
        #: Wall-clock seconds the last read took (the bench prints it).
        self.last_read_seconds = 0.0

    async def snapshot(self) -> FleetSnapshot:
        async with self._lock:
            now = self._clock()
            if self._snapshot is None or self._read_at is None or now - self._read_at >= self._max_age:
                began = time.perf_counter()
                self._snapshot = await self._read()
                self.last_read_seconds = time.perf_counter() - began
                self._read_at = now
            return self._snapshot

    async def _read(self) -> FleetSnapshot:
        gaps: list[str] = []
        self.reads["slurm"] += 1
        try:
            states = await self._ports.scheduler.nodes()
            ghosts = set(await self._store.memory(LEFT_BEHIND)) if self._store is not None else set()
            self._slurm = [
                o
                for s in states
                if not (s.name in ghosts and not_responding(s.states))
                and (o := slurm_outage(s.name, s.states, s.reason, s.reason_user)) is not None
            ]
        except PitcrewError as exc:
            gaps.append(f"Slurm nodes unreadable ({exc.reason})")
        count: int | None = None
        gap = "no Kubernetes cluster"
        if self._ports.cluster is not None:
            self.reads["kubernetes"] += 1
            try:
                nodes = await self._ports.cluster.nodes()
                outages = [
                    o
                    for n in nodes
                    if (
                        o := kubernetes_outage(
                            n.name,
                            unschedulable=n.unschedulable,
                            ready=n.ready,
                            taint_keys=[t.key for t in n.taints],
                            annotations=n.annotations,
                        )
                    )
                    is not None
                ]
                self._kubernetes = (outages, len(nodes))
            except PitcrewError as exc:
                gaps.append(f"Kubernetes nodes unreadable ({exc.reason})")
                gap = f"Kubernetes node count unreadable ({exc.reason})"
            if self._kubernetes is not None:
                count = self._kubernetes[1] or None
                gap = "" if count else "Kubernetes counts no nodes"
        known = [*(self._slurm or ()), *(self._kubernetes[0] if self._kubernetes else ())]
        if self._slurm is None and (self._ports.cluster is None or self._kubernetes is None):
            return FleetSnapshot(OutOfService(unread="unreadable: " + "; ".join(gaps)), count, gap)
        return FleetSnapshot(OutOfService.of(known, "; ".join(gaps)), count, gap)
