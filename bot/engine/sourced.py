"""What pitcrew's own alert sources share: their finds become alerts in the store, and the alerts
they no longer find resolve.

A source (``SlurmWatch``, ``HungJobs``) runs inside the engine's scan, so only in the process that
leads, and writes through the engine's fenced store: a deposed process opens nothing. It looks at a
far side, turns what it finds into ``bot.domain.sourced.Sourced`` records, and files them here with
the resolutions of its earlier alerts that it did not find again: one delivery, as Alertmanager's.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from datetime import datetime

from bot import logger
from bot.domain.catalog import Catalog
from bot.domain.faults import classify
from bot.domain.labels import Subject
from bot.domain.sourced import Sourced
from bot.engine.deps import EngineDeps
from bot.store.base import AlertRecord, Delivery, IncomingAlert, IngestOutcome

log = logger(__name__)


class AlertSource:
    """One of pitcrew's own alert sources: its ``alertname``, the catalog ``fault`` its alerts carry,
    and the ``receiver`` its deliveries are filed under."""

    def __init__(
        self,
        deps: EngineDeps,
        catalog: Catalog,
        *,
        alertname: str,
        fault: str,
        receiver: str,
        look_again: Callable[[IngestOutcome], None],
        opened: Callable[[], None],
    ) -> None:
        self._deps, self._catalog, self._look_again, self._opened = deps, catalog, look_again, opened
        self.alertname, self.fault, self.receiver = alertname, fault, receiver

    def firing(self, found: Sourced) -> IncomingAlert:
        subject = Subject(
            node=found.node,
            gpu=None,
            gpu_uuid=None,
            pci_bus_id=None,
            xid=None,
            xid_text=None,
            fault_label=self.fault,
            message=found.annotations["description"],
        )
        return IncomingAlert(
            fingerprint=found.fingerprint,
            starts_at=found.starts_at,
            ends_at=None,
            status="firing",
            alertname=self.alertname,
            node=found.node,
            labels=found.labels,
            annotations=found.annotations,
            fault=classify(subject, self._catalog),
        )

    async def firing_alerts(self) -> list[AlertRecord]:
        """This source's alerts still firing in active incidents (one read of each such incident)."""
        store = self._deps.store
        return [
            a
            for incident_id, _, _ in await store.active()
            for a in await store.alerts_of(incident_id)
            if a.alertname == self.alertname and a.status == "firing"
        ]

    def ended(self, firing: Iterable[AlertRecord], current: set[str], now: datetime) -> list[IncomingAlert]:
        """Of this source's ``firing`` alerts, those it no longer finds: resolved (known to the store,
        so they need no fault to find their incident)."""
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
            for a in firing
            if a.fingerprint not in current
        ]

    async def file(
        self, found: Iterable[Sourced], now: datetime, firing: Iterable[AlertRecord] | None = None
    ) -> None:
        """What this look found, firing, and what it no longer finds, resolved: one delivery.
        ``firing``: ``firing_alerts`` if the look read them already."""
        found = list(found)
        alerts = [self.firing(f) for f in found]
        before = await self.firing_alerts() if firing is None else firing
        alerts += self.ended(before, {f.fingerprint for f in found}, now)
        if not alerts:
            return
        delivery = Delivery(self.receiver, "slurm", "firing", 0, tuple(alerts))
        outcome = await self._deps.store.ingest(delivery, now)
        self._deps.metrics.incidents_opened.inc(len(outcome.opened))
        self._look_again(outcome)
        if outcome.opened:
            log.info("incidents opened", extra={"source": self.receiver, "incidents": outcome.opened})
            self._opened()
