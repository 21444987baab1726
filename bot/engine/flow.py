"""One incident's way through its playbook: plan, step after step, approvals, close.

The engine's supervisor runs one ``IncidentFlow.run`` per active incident. Every decision
reads the incident back from the store first, so a flow resumed after a crash (or a
restart) continues exactly where the store says it stopped.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import datetime
from typing import Any

from bot.config import Config
from bot.domain.incident import STEP_STATE, State, can_move
from bot.domain.playbooks import DESTRUCTIVE, MUTATING
from bot.domain.policy import Mode
from bot.engine.admission import PAUSE, ROLLBACK, Admission, post_safely
from bot.engine.context import Ports
from bot.engine.executor import Executor
from bot.engine.metrics import Metrics
from bot.engine.ports import Notice
from bot.engine.rollback import undo
from bot.engine.signals import Signals
from bot.store.base import IncidentRecord, NewEvent, Store

log = logging.getLogger(__name__)


class IncidentFlow:
    def __init__(
        self,
        config: Config,
        store: Store,
        ports: Ports,
        metrics: Metrics,
        clock: Callable[[], datetime],
        admission: Admission,
        executor: Executor,
        signals: Signals,
    ) -> None:
        self.config = config
        self.store = store
        self.ports = ports
        self.metrics = metrics
        self.clock = clock
        self.admission = admission
        self.executor = executor
        self.signals = signals

    async def run(self, incident_id: str) -> None:
        while True:
            incident = await self.store.incident(incident_id)
            if incident is None or incident.state.terminal:
                return
            steps = await self.store.steps_of(incident_id)
            if ROLLBACK in steps:
                await self.finish_rollback(incident, steps[ROLLBACK].result.get("actor", "unknown"))
                return
            if incident.state is State.OPEN or incident.plan is None:
                await self.admission.admit(incident)
                continue
            if incident.faults_changed:
                await self.admission.replan(incident)
                continue
            order = list(incident.plan.get("steps", []))
            hands_off = not (incident.plan.get("acts") and incident.mode != Mode.OBSERVE.value)
            if incident.step_index >= len(order):
                if await self._finish(incident, hands_off):
                    return
                continue
            step = order[incident.step_index]
            if step == "close" and hands_off and await self._still_firing(incident):
                continue
            if step == "approve":
                decided = await self._approval(incident)
                if decided is None:
                    continue
                if not decided:
                    return
            else:
                if not await self._enter(incident, step):
                    continue
                outcome = await self.executor.run(incident, step)
                if outcome.status == "failed":
                    await self._escalate(incident, step, outcome.detail)
                    return
            await self.store.advance(incident_id, incident.step_index + 1, self.clock())

    async def _enter(self, incident: IncidentRecord, step: str) -> bool:
        """Move to the state this step runs in; hold mutating steps while paused."""
        if step in MUTATING and incident.mode == Mode.OBSERVE.value:
            return True  # recorded as skipped by the executor; the incident does not pretend to run
        if step in DESTRUCTIVE:
            pause = await self.store.switch(PAUSE)
            if pause is not None:
                await self.store.record(
                    incident.id,
                    NewEvent("held", step=step, detail=f"paused by {pause.get('set_by')}"),
                    self.clock(),
                )
                await self.signals.wait(incident.id, None)
                return False
        target = STEP_STATE[step]
        if incident.state is not target and can_move(incident.state, target):
            await self.store.transition(
                incident.id, target, self.clock(), event=NewEvent("state", outcome=target.value)
            )
        return True

    async def _still_firing(self, incident: IncidentRecord) -> bool:
        """Hands-off and observe incidents stay open while their alerts fire, so repeats attach."""
        alerts = await self.store.alerts_of(incident.id)
        firing = [a for a in alerts if a.status == "firing"]
        age = self.clock() - incident.opened_at
        if not firing or age >= self.config.settings.engine.watch_max:
            return False
        if "watching" not in (await self.store.steps_of(incident.id)):
            await self.store.step_finished(
                incident.id,
                "watching",
                "running",
                self.clock(),
                event=NewEvent(
                    "watching", detail=f"{len(firing)} alert(s) still firing; closes when they resolve"
                ),
            )
        await self.signals.wait(incident.id, (self.config.settings.engine.watch_max - age).total_seconds())
        return True

    async def _approval(self, incident: IncidentRecord) -> bool | None:
        """True approved, False stopped (rejected/expired), None still waiting."""
        policy = self.config.policy.approvals
        key = f"approve@{incident.playbook}"
        now = self.clock()
        approval = await self.store.approval(incident.id)
        if approval is None or approval.step != key:
            if incident.state is not State.AWAITING_APPROVAL:
                await self.store.transition(
                    incident.id,
                    State.AWAITING_APPROVAL,
                    now,
                    event=NewEvent("state", outcome="awaiting_approval"),
                )
            approval = await self.store.request_approval(
                incident.id, key, policy.approvers, now + policy.timeout, now
            )
            await self.store.record(
                incident.id,
                NewEvent(
                    "approval_requested",
                    step="approve",
                    detail=f"approvers: {', '.join(policy.approvers)}; "
                    f"deadline {approval.deadline.isoformat(timespec='seconds')}",
                ),
                now,
            )
        if approval.status == "approved":
            return True
        if approval.status == "rejected":
            await self._close(incident, State.SUPPRESSED, f"rejected by {approval.decided_by}")
            return False
        if approval.status == "expired" or now >= approval.deadline:
            await self.store.decide_approval(incident.id, "expired", "pitcrew", now)
            self.metrics.approvals.labels("expired").inc()
            await self._close(incident, State.SUPPRESSED, "approval timed out: nothing was done")
            deadline = approval.deadline.isoformat(timespec="minutes")
            await self._tell(
                incident,
                "approval_expired",
                "approval timed out, nothing was done",
                (f"Nobody approved {incident.playbook} before {deadline}.",),
                severity="warning",
            )
            return False
        await self.signals.wait(incident.id, (approval.deadline - now).total_seconds())
        return None

    async def _finish(self, incident: IncidentRecord, hands_off: bool) -> bool:
        """Close after the last step — unless a delivery just brought a new fault (replan) or,
        for a hands-off incident, a firing alert (watch again, and close later)."""
        if incident.plan and incident.plan.get("acts") and incident.mode == Mode.OBSERVE.value:
            state, outcome = State.SUPPRESSED, f"observe mode: {incident.playbook} was not run"
        else:
            state, outcome = State.RESOLVED, "resolved"
        if await self._close(incident, state, outcome, unless="firing" if hands_off else "new_fault"):
            return True
        fresh = await self.store.incident(incident.id)
        if fresh is not None and not fresh.faults_changed and hands_off:
            now = self.clock()
            await self.store.step_finished(
                incident.id,
                "close",
                "superseded",
                now,
                event=NewEvent("step_superseded", step="close", detail="alerts fire again"),
            )
            await self.store.advance(incident.id, max(incident.step_index - 1, 0), now)
        return False

    async def _close(
        self, incident: IncidentRecord, state: State, outcome: str, unless: str | None = None
    ) -> bool:
        record = await self.store.transition(
            incident.id,
            state,
            self.clock(),
            outcome=outcome,
            event=NewEvent("state", outcome=state.value, detail=outcome),
            unless=unless,
        )
        if record.state is not state:
            return False
        self.metrics.incidents_closed.labels(state.value, incident.playbook or "none").inc()
        return True

    async def _tell(
        self, incident: IncidentRecord, kind: str, title: str, lines: tuple[str, ...], **extra: Any
    ) -> None:
        """A notice about one incident, outside any step: a failing notifier never stops the engine."""
        notice = Notice(incident.id, kind, f"{incident.node}: {title}", lines, node=incident.node, **extra)
        await post_safely(self.ports, self.store, self.clock, notice)

    async def _escalate(self, incident: IncidentRecord, step: str, detail: str) -> None:
        self.metrics.steps.labels(step, "escalated").inc()
        await self._close(incident, State.FAILED, f"{step} failed: {detail}")
        await self._tell(
            incident,
            "escalation",
            f"{step} failed — a human must take over",
            (
                detail,
                "Nothing further will be done automatically. Roll back with `pitcrew rollback "
                f"{incident.id}` to undo what pitcrew did.",
            ),
            severity="critical",
            actions=("rollback",),
        )

    async def finish_rollback(self, incident: IncidentRecord, actor: str) -> None:
        steps = await self.store.steps_of(incident.id)
        report = await undo(incident, steps, self.ports, self.store, self.metrics, self.clock, actor)
        await self.store.step_finished(
            incident.id,
            ROLLBACK,
            "ok",
            self.clock(),
            result={"report": report},
            event=NewEvent("rollback_done", actor=actor, detail="; ".join(report)),
        )
        if can_move(incident.state, State.ROLLED_BACK):
            await self._close(incident, State.ROLLED_BACK, f"rolled back by {actor}")
        await self._tell(
            incident, "rollback", f"rolled back by {actor}", tuple(report) or ("nothing to undo",)
        )
