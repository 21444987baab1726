"""What an incident's parent message shows now, read from the store: ``ParentViews.view``.

The notice that opened the incident (kept by the destination as ``parent:<id>``), its state and
current step, who decided what when, the buttons still possible, the Grafana dashboard and the
runbook, and whether this parent replaces one a person deleted or Slack would no longer let pitcrew
edit (``replaced:<id>``, and why: ``replaced-why:<id>``, absent before it was kept). Reads only;
``messages.parent`` turns the view into blocks.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from bot.config import GrafanaSettings
from bot.domain.incident import State
from bot.engine.ports import Notice
from bot.integrations.slack import messages
from bot.integrations.slack.errors import MessageGone
from bot.integrations.slack.messages import Decision, Mrkdwn, ParentView, escape
from bot.store.base import Event, IncidentRecord, Store, incident_ref

NAME = "slack"


def who(actor: str | None) -> Mrkdwn:
    """An actor as Slack shows it: ``slack:U0ALICE`` → a mention; others as text (escaped)."""
    if actor and actor.startswith("slack:"):
        return messages.mention(actor.removeprefix("slack:"))
    return escape(actor or "pitcrew")


class ParentViews:
    def __init__(
        self, store: Store, grafana: GrafanaSettings, runbook_url: str | None, decisions: frozenset[str]
    ) -> None:
        self._store = store
        self._grafana = grafana
        self._runbook_url = runbook_url
        #: Timeline events the parent lists as decisions.
        self._decisions = decisions

    async def view(self, incident: IncidentRecord) -> ParentView:
        base_text = await self._store.outbox_ref(NAME, incident_ref("parent", incident.id))
        base: Mapping[str, Any] = json.loads(base_text) if base_text else {}
        notice = Notice.from_record(base) if base else None
        plan = incident.plan
        lines = notice.lines if notice else tuple(f.describe() for f in incident.faults)
        title = notice.title if notice else f"{incident.node}: {incident.playbook or 'GPU fault'}"
        events = await self._store.events_of(incident.id)
        approval = await self._store.approval(incident.id)
        decisions = tuple(
            Decision(who(e.actor), e.kind.replace("_", " "), e.at)
            for e in events
            if e.kind in self._decisions
        )
        offer: list[str] = []
        if (
            approval is not None
            and approval.status == "pending"
            and incident.state is State.AWAITING_APPROVAL
        ):
            offer += ["approve", "reject"]
        # Rollback only undoes what pitcrew did: a plan that changes nothing (notify only, or
        # observe mode) has nothing to offer it for.
        if (
            plan is not None
            and plan.runs_mutating_steps
            and incident.state not in {State.ROLLED_BACK, State.SUPPRESSED}
            and not any(e.kind == "rollback_requested" for e in events)
        ):
            offer.append("rollback")
        gpus = sorted({f.gpu for f in incident.faults if f.gpu})
        runbook = await self._runbook(incident)
        return ParentView(
            incident_id=incident.id,
            node=incident.node,
            title=title,
            lines=lines,
            severity=notice.severity if notice else "warning",
            mode=incident.mode or "-",
            plan=" → ".join(plan.steps) if plan else "-",
            gpu=", ".join(gpus),
            state=incident.state.value,
            status=_status(incident, events),
            grafana=self._grafana.incident_dashboard(
                incident.first_alert_at or incident.opened_at, incident.closed_at
            ),
            runbook=runbook,
            decisions=decisions,
            offer=tuple(offer),
            replaces=await self._replaces(incident.id),
            capacity=capacity_word(events),
        )

    async def _replaces(self, incident_id: str) -> str | None:
        """Why this parent continues an earlier one (``messages.MOVED``'s key), if it does."""
        if await self._store.outbox_ref(NAME, incident_ref("replaced", incident_id)) is None:
            return None
        # Kept since parents could be replaced for another cause than deletion; none before.
        return (
            await self._store.outbox_ref(NAME, incident_ref("replaced-why", incident_id)) or MessageGone.moved
        )

    async def _runbook(self, incident: IncidentRecord) -> str | None:
        """The runbook the alert's rule names (its ``runbook_url`` annotation, the link Alertmanager
        shows too); else ``slack.runbook_url`` with the fault as anchor."""
        for alert in await self._store.alerts_of(incident.id):
            if alert.annotations.get("runbook_url"):
                return alert.annotations["runbook_url"]
        first = incident.faults[0] if incident.faults else None
        if not self._runbook_url or first is None:
            return None
        anchor = f"xid-{first.xid}" if first.xid is not None else first.kind
        return f"{self._runbook_url}#{anchor}"


def capacity_word(events: list[Event]) -> str | None:
    """The node borrowed for the stalled job, where from and why, given back or not; or why none."""
    for event in reversed(events):
        action = str(event.data.get("action", "")) if event.kind == "action" else ""
        if action.startswith("capacity_") or event.kind == "capacity_none":
            return event.detail
    return None


def _status(incident: IncidentRecord, events: list[Event]) -> str:
    plan = incident.plan
    if incident.state.terminal:
        return incident.outcome or incident.state.value
    if incident.state is State.AWAITING_APPROVAL:
        return "waiting for an approver"
    if plan is not None and incident.step_index < len(plan.steps):
        step = plan.steps[incident.step_index]
        waiting = next(
            (e.detail for e in reversed(events) if e.kind == "step_waiting" and e.step == step), ""
        )
        return f"step {incident.step_index + 1}/{len(plan.steps)}: {step}" + (
            f" ({waiting})" if waiting else ""
        )
    return incident.state.value
