"""The engine: a supervised worker per active incident, resumed from the store on start.

One asyncio task per active incident gives per-node serialisation (one active incident
per node); a semaphore bounds how many steps run at once. The supervisor rescans the
store when woken (a delivery arrived, a command was given) and every ``poll_interval``,
so nothing depends on an in-memory queue that a crash would lose.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from datetime import datetime
from typing import Any

from bot.config import Config
from bot.domain import planner
from bot.domain.catalog import severity
from bot.domain.guards import evaluate
from bot.domain.incident import STEP_STATE, State, can_move
from bot.domain.playbooks import DESTRUCTIVE, MUTATING
from bot.domain.policy import Mode
from bot.engine.admission import PAUSE, Admission, plan_document, post_safely
from bot.engine.context import Ports
from bot.engine.executor import Executor
from bot.engine.metrics import Metrics
from bot.engine.ports import Notice
from bot.engine.rollback import undo
from bot.store.base import IncidentRecord, NewEvent, Store

log = logging.getLogger(__name__)
ROLLBACK = "rollback"
_SCAN_BEAT = 0.02
#: Waits that a signal ends (approvals, watching, pause) still look again this often.
_RECHECK = 30.0


class Engine:
    def __init__(
        self, config: Config, store: Store, ports: Ports, metrics: Metrics, clock: Callable[[], datetime]
    ) -> None:
        self.config = config
        self.store = store
        self.ports = ports
        self.metrics = metrics
        self.clock = clock
        self.admission = Admission(config, store, ports, metrics, clock)
        self._slots = asyncio.Semaphore(config.settings.engine.workers)
        self.executor = Executor(config, store, ports, metrics, clock, self._slots)
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._rolling_back: set[str] = set()  # rolled back by a command right now: no worker
        self._signals: dict[str, asyncio.Event] = {}
        self._wake = asyncio.Event()
        self._main: asyncio.Task[None] | None = None

    # ----------------------------------------------------------------- lifecycle
    async def start(self) -> None:
        self._main = asyncio.create_task(self._supervise(), name="pitcrew-engine")

    async def stop(self) -> None:
        tasks = [t for t in [self._main, *self._tasks.values()] if t is not None]
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks.clear()
        self._main = None

    def wake(self) -> None:
        self._wake.set()

    def signal(self, incident_id: str) -> None:
        """Something changed for this incident (approval, resolution): stop waiting."""
        self._signals.setdefault(incident_id, asyncio.Event()).set()
        self._wake.set()

    def signal_all(self) -> None:
        """A switch changed (resume): every waiting incident looks again."""
        for event in self._signals.values():
            event.set()
        self._wake.set()

    @property
    def running(self) -> bool:
        return self._main is not None and not self._main.done()

    async def idle(self) -> None:
        """Wait until every incident task has finished or is waiting (used by tests and demos)."""
        while pending := [t for t in self._tasks.values() if not t.done()]:
            await asyncio.wait(pending)

    # ---------------------------------------------------------------- supervisor
    async def _supervise(self) -> None:
        interval = self.config.settings.engine.poll_interval.total_seconds()
        while True:
            self._wake.clear()
            try:
                await self._scan()
            except Exception:  # the supervisor must outlive a bad scan
                log.exception("engine scan failed")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), timeout=interval)
            # A burst of deliveries wakes us many times: one scan per short beat is enough.
            await asyncio.sleep(_SCAN_BEAT)

    async def _scan(self) -> None:
        active = await self.store.active()
        now = self.clock()
        counts: dict[str, int] = {state.value: 0 for state in State if not state.terminal}
        for incident_id, state, _ in active:
            counts[state.value] += 1
            task = self._tasks.get(incident_id)
            if incident_id not in self._rolling_back and (task is None or task.done()):
                self._tasks[incident_id] = asyncio.create_task(
                    self._guarded_run(incident_id), name=incident_id
                )
        for state_name, count in counts.items():
            self.metrics.incidents_active.labels(state_name).set(count)
        oldest = min((opened for _, _, opened in active), default=None)
        self.metrics.oldest_active.set((now - oldest).total_seconds() if oldest else 0)
        self.metrics.paused.set(1 if await self.store.switch(PAUSE) else 0)
        live = {incident_id for incident_id, _, _ in active}
        for incident_id in [i for i, t in self._tasks.items() if t.done()]:
            self._tasks.pop(incident_id)
        for incident_id in [i for i in self._signals if i not in live and i not in self._tasks]:
            self._signals.pop(incident_id)

    async def _guarded_run(self, incident_id: str) -> None:
        try:
            await self._run(incident_id)
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception(
                "incident worker crashed; the supervisor will restart it", extra={"incident": incident_id}
            )
            await asyncio.sleep(self.config.settings.engine.poll_interval.total_seconds())

    # ------------------------------------------------------------- one incident
    async def _run(self, incident_id: str) -> None:
        while True:
            incident = await self.store.incident(incident_id)
            if incident is None or incident.state.terminal:
                return
            steps = await self.store.steps_of(incident_id)
            if ROLLBACK in steps:
                await self._finish_rollback(incident, steps[ROLLBACK].result.get("actor", "unknown"))
                return
            if incident.state is State.OPEN or incident.plan is None:
                await self.admission.admit(incident)
                continue
            if incident.faults_changed:
                await self._replan(incident)
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
                await self._wait_signal(incident.id, None)
                return False
        target = STEP_STATE[step]
        if incident.state is not target and can_move(incident.state, target):
            await self.store.transition(
                incident.id, target, self.clock(), event=NewEvent("state", outcome=target.value)
            )
        return True

    async def _wait_signal(self, incident_id: str, limit: float | None) -> None:
        """Sleep until signalled (approval, resolution, resume) or ``limit`` seconds pass."""
        event = self._signals.setdefault(incident_id, asyncio.Event())
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(event.wait(), timeout=max(min(limit or _RECHECK, _RECHECK), 0.001))
        event.clear()

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
        await self._wait_signal(incident.id, (self.config.settings.engine.watch_max - age).total_seconds())
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
        await self._wait_signal(incident.id, (approval.deadline - now).total_seconds())
        return None

    async def _replan(self, incident: IncidentRecord) -> None:
        """A new fault arrived on an incident already under way: escalate if it is more severe."""
        now = self.clock()
        world = await self.admission.world(incident, now)
        fresh = planner.plan(
            incident.node, incident.faults, world.history, self.config.policy, self.config.playbooks, now
        )
        current = incident.playbook or "ignore"
        if severity(fresh.playbook) <= severity(current):
            await self.store.ack_faults(incident.id)
            await self.store.record(
                incident.id,
                NewEvent("fault_attached", detail=f"new fault on the node; {current} already covers it"),
                now,
            )
            return
        verdict = evaluate(fresh, world, self.config.policy, now)
        document = plan_document(fresh, verdict, fresh.runs_mutating_steps)
        if fresh.runs_mutating_steps and not verdict.allowed:
            await self.store.ack_faults(incident.id)
            await self.store.record(
                incident.id,
                NewEvent(
                    "escalation_blocked", detail=f"{current} → {fresh.playbook} refused: {verdict.summary()}"
                ),
                now,
            )
            return
        done = await self.store.steps_of(incident.id)
        returned = done.get("slurm_resume") is not None and done["slurm_resume"].status == "ok"
        # Steps already done carry over — unless the node was already returned to service, in
        # which case the new playbook starts from the top (the node must be taken out again).
        keep = (
            set()
            if returned
            else {s for s, r in done.items() if r.status in {"ok", "skipped"} and s != "notify"}
        )
        for name, record in done.items():
            if name not in keep and name != ROLLBACK and record.status in {"ok", "skipped", "running"}:
                await self.store.step_finished(
                    incident.id,
                    name,
                    "superseded",
                    now,
                    result=record.result,
                    event=NewEvent("step_superseded", step=name),
                )
        index = next((i for i, s in enumerate(fresh.steps) if s not in keep), len(fresh.steps))
        await self.store.save_plan(
            incident.id,
            document,
            fresh.playbook,
            fresh.mode.value,
            [
                NewEvent(
                    "replanned",
                    detail=f"{current} → {fresh.playbook}: a more severe fault arrived",
                    data={"reasons": list(fresh.reasons)},
                )
            ],
            now,
        )
        await self.store.advance(incident.id, index, now)

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

    # ----------------------------------------------------------------- rollback
    async def request_rollback(self, incident: IncidentRecord, actor: str) -> None:
        """Persist the request, stop the incident's worker, then undo (resumable after a crash)."""
        self._rolling_back.add(incident.id)
        try:
            now = self.clock()
            await self.store.step_finished(
                incident.id,
                ROLLBACK,
                "running",
                now,
                result={"actor": actor},
                event=NewEvent("rollback_requested", actor=actor),
            )
            task = self._tasks.pop(incident.id, None)
            if task is not None and task is not asyncio.current_task():
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
            fresh = await self.store.incident(incident.id)
            assert fresh is not None
            await self._finish_rollback(fresh, actor)
        finally:
            self._rolling_back.discard(incident.id)

    async def _finish_rollback(self, incident: IncidentRecord, actor: str) -> None:
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
