"""Intake: one webhook body → parsed, classified, deduplicated and persisted alerts.

This is all the webhook does before answering 200; remediation happens later in the
executor, which ``opened`` nudges. Nothing here waits on a far side. Everything that can refuse
the input (``PayloadError``) runs before the store is written: a refused delivery leaves
nothing behind, and nothing after the write can fail on the input.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime

from bot.domain.alerts import WebhookPayload, check_times, parse_webhook
from bot.domain.catalog import Catalog
from bot.domain.faults import classify
from bot.domain.labels import LabelRules, subjects_of
from bot.engine.metrics import Metrics
from bot.store.base import Delivery, IncomingAlert, IngestOutcome, Store


def to_delivery(payload: WebhookPayload, catalog: Catalog, rules: LabelRules) -> Delivery:
    """The delivery to store; ``AlertRejected`` naming each alert whose node label is no node name."""
    alerts = []
    for alert, subject in zip(payload.alerts, subjects_of(payload, rules), strict=True):
        alerts.append(
            IncomingAlert(
                fingerprint=alert.fingerprint,
                starts_at=alert.starts_at,
                ends_at=alert.ends_at,
                status=alert.status,
                alertname=alert.alertname,
                node=subject.node,
                labels=alert.labels,
                annotations=alert.annotations,
                fault=classify(subject, catalog),
            )
        )
    return Delivery(
        receiver=payload.receiver,
        group_key=payload.group_key,
        status=payload.status,
        truncated_alerts=payload.truncated_alerts,
        alerts=tuple(alerts),
    )


class Intake:
    def __init__(
        self,
        store: Store,
        catalog: Catalog,
        rules: LabelRules,
        metrics: Metrics,
        opened: Callable[[], None] = lambda: None,
        look_again: Callable[[IngestOutcome], None] = lambda outcome: None,
    ) -> None:
        """``opened``: incidents were opened, whose flows the engine starts (``Engine.opened``);
        ``look_again``: what a stored delivery changed for incidents under way, told to their
        flows (``Engine.look_again``)."""
        self._store = store
        self._catalog = catalog
        self._rules = rules
        self._metrics = metrics
        self._opened = opened
        self._look_again = look_again

    async def accept(self, body: bytes, now: datetime) -> IngestOutcome:
        """Parse and check (``PayloadError`` on bad input, nothing stored), persist, then wake the engine."""
        payload = parse_webhook(body)
        check_times(payload, now)
        # Most deliveries are Alertmanager re-sending groups it already sent: no need to classify.
        repeats = await self._store.count_repeats(
            [(a.fingerprint, a.starts_at, a.status) for a in payload.alerts], now
        )
        if repeats is not None:
            self._metrics.alerts_received.labels("repeat").inc(repeats)
            return IngestOutcome(repeated_alerts=repeats)
        delivery = to_delivery(payload, self._catalog, self._rules)
        outcome = await self._store.ingest(delivery, now)
        received = self._metrics.alerts_received
        received.labels("new").inc(outcome.new_alerts)
        received.labels("repeat").inc(outcome.repeated_alerts)
        received.labels("unroutable").inc(outcome.unroutable)
        if delivery.truncated_alerts:
            received.labels("truncated").inc(delivery.truncated_alerts)
        self._metrics.incidents_opened.inc(len(outcome.opened))
        self._look_again(outcome)
        if outcome.opened:
            self._opened()
        return outcome
