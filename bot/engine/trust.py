"""pitcrew's trust ledger: its own false-positive and repeat rates, per playbook and fault class.

Counted against a remediation (a plan that would change a node):

* ``pitcrew_trust_overrides_total{action="rolled_back"}`` — humans rolled back what it did;
  ``{action="rejected"}`` — an approver refused the plan it proposed;
* ``pitcrew_trust_retests_total{outcome="passed"}`` — the remediated node came back into
  service (Ready, Slurm IDLE: its retest); ``{outcome="repeat"}`` — the same node came back
  with the same fault class within the escalation window, counted against the earlier
  remediation's playbook; ``{outcome="climbed"}`` — its repair did not clear the fault and the
  incident climbed to the playbook's next rung (``next``), counted against the rung that failed.

The labels are the remediated incident's playbook and decisive fault class.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta

from bot.domain.planner import PastIncident, Plan
from bot.engine.metrics import Metrics
from bot.store.base import IncidentRecord, Store


def fault_class(plan: Plan | None) -> str:
    """The decisive fault's class, the trust ledger's and the GPU-hours' second label."""
    return plan.decisive.fault_class if plan is not None and plan.decisive is not None else "unknown"


def remediates(incident: IncidentRecord) -> bool:
    """A plan that would change a node (observe mode included: humans judge what it proposed)."""
    return incident.plan is not None and incident.plan.acts


def overridden(metrics: Metrics, incident: IncidentRecord, action: str) -> None:
    """Humans undid (``rolled_back``) or refused (``rejected``) a remediation."""
    if remediates(incident):
        metrics.trust_overrides.labels(
            incident.playbook or "unknown", fault_class(incident.plan), action
        ).inc()


def climbed(metrics: Metrics, incident: IncidentRecord) -> None:
    """The remediation's repair did not clear the fault and the incident climbed to the next rung:
    its retest failed, counted against the rung that failed."""
    if remediates(incident):
        metrics.trust_retests.labels(
            incident.playbook or "unknown", fault_class(incident.plan), "climbed"
        ).inc()


def retest_passed(metrics: Metrics, incident: IncidentRecord) -> None:
    metrics.trust_retests.labels(incident.playbook or "unknown", fault_class(incident.plan), "passed").inc()


async def count_repeat(
    metrics: Metrics,
    store: Store,
    plan: Plan,
    history: Sequence[PastIncident],
    window: timedelta,
    now: datetime,
) -> str | None:
    """Count a repeat against the latest remediation of this node, within ``window``, whose faults
    include the new decisive fault's class; returns that incident's id."""
    if plan.decisive is None:
        return None
    recent = sorted(
        (h for h in history if h.acted and now - window <= h.opened_at <= now),
        key=lambda h: h.opened_at,
        reverse=True,
    )
    for past in recent:
        record = await store.incident(past.incident_id)
        if record is None or plan.decisive.fault_class not in {f.fault_class for f in record.faults}:
            continue
        metrics.trust_retests.labels(past.playbook, plan.decisive.fault_class, "repeat").inc()
        return past.incident_id
    return None
