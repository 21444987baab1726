"""The Slurm watch: every poll, Slurm nodes that Slurm (or a health check, or a person) took out
become alerts in the store, and the ones Slurm returned resolve.

Runs inside the engine's scan, so only in the process that leads the store, and writes through
the engine's fenced store: a deposed process opens nothing. What it ingests is an alert like any
other (``bot.domain.slurm_watch``): it opens an incident or attaches to the node's active one, and
everything after - guards, mode, pause, opt-out, the playbook - is the engine's as for a Prometheus
alert. It must not act on Slurm or Kubernetes itself, nor judge whose a reason is
(``bot.domain.slurm_watch.out_by_others`` does).
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime

from bot import logger
from bot.domain.catalog import Catalog
from bot.domain.faults import classify
from bot.domain.labels import Subject, node_name
from bot.domain.slurm_watch import ALERTNAME, SLURM_FAULT, Outage, out_by_others, outage
from bot.engine.deps import EngineDeps
from bot.engine.errors import PitcrewError
from bot.engine.ports import Scheduler
from bot.store.base import Delivery, IncomingAlert

log = logger(__name__)
RECEIVER = "pitcrew-slurm-watch"


class SlurmWatch:
    def __init__(
        self, deps: EngineDeps, catalog: Catalog, *, signal: Callable[[str], None], wake: Callable[[], None]
    ) -> None:
        self._deps, self._catalog, self._signal, self._wake = deps, catalog, signal, wake
        self._last: datetime | None = None

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
        try:
            nodes = await lister.nodes()
        except PitcrewError as exc:
            log.warning("slurm watch: cannot list nodes", extra={"error": str(exc), "reason": exc.reason})
            return
        current = [outage(n, now) for n in nodes if out_by_others(n) and await self._ours_to_watch(n.name)]
        alerts = [self._alert(o) for o in current]
        alerts += await self._returned({o.fingerprint for o in current}, now)
        if not alerts:
            return
        delivery = Delivery(RECEIVER, "slurm", "firing", 0, tuple(alerts))
        outcome = await self._deps.store.ingest(delivery, now)
        self._deps.metrics.incidents_opened.inc(len(outcome.opened))
        for incident_id in set(outcome.changed) | set(outcome.resolved_in):
            self._signal(incident_id)
        if outcome.opened:
            log.info("slurm watch opened incidents", extra={"incidents": outcome.opened})
            self._wake()

    async def _ours_to_watch(self, name: str) -> bool:
        """The Slurm node is the Kubernetes node of the same name (identity mapping)."""
        try:
            node_name(name)
            return list(await self._deps.ports.slurm_names(name)) == [name]
        except (ValueError, PitcrewError):
            return False

    def _alert(self, found: Outage) -> IncomingAlert:
        subject = Subject(
            node=found.node,
            gpu=None,
            gpu_uuid=None,
            pci_bus_id=None,
            xid=None,
            xid_text=None,
            fault_label=SLURM_FAULT,
            message=found.annotations["description"],
        )
        return IncomingAlert(
            fingerprint=found.fingerprint,
            starts_at=found.starts_at,
            ends_at=None,
            status="firing",
            alertname=ALERTNAME,
            node=found.node,
            labels=found.labels,
            annotations=found.annotations,
            fault=classify(subject, self._catalog),
        )

    async def _returned(self, current: set[str], now: datetime) -> list[IncomingAlert]:
        """The watch's firing alerts of active incidents that Slurm no longer shows: resolved
        (known to the store, so they need no fault to find their incident)."""
        store = self._deps.store
        return [
            IncomingAlert(
                fingerprint=a.fingerprint,
                starts_at=a.starts_at,
                ends_at=now,
                status="resolved",
                alertname=a.alertname,
                node=a.node,
                labels=a.labels,
                annotations=a.annotations,
                fault=None,
            )
            for incident_id, _, _ in await store.active()
            for a in await store.alerts_of(incident_id)
            if a.alertname == ALERTNAME and a.status == "firing" and a.fingerprint not in current
        ]
