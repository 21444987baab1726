"""One incident's way through its playbook: plan, the node track and the job track, approvals, close.

The engine's supervisor runs one ``IncidentFlow.run`` per active incident. Every decision
reads the incident back from the store first, so a flow resumed after a crash (or a
restart) continues exactly where the store says it stopped.

Two tracks. The **node track** is the playbook's steps in order (``cordon → drain →
replace → wait_ready → slurm_resume``), its cursor the incident's ``step_index``. The
**job track** (steps the registry puts on ``Track.JOB``: ``confirm_resumed``) starts as
soon as the steps it needs are done (the Slurm node is out) and runs beside the node track;
its progress lives in its own step records, so it resumes after a crash like the node
track does. ``close`` waits for both: the incident ends when both tracks have ended.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from dataclasses import replace
from datetime import datetime
from typing import Any

from bot import logger
from bot.domain.durations import format_duration
from bot.domain.incident import State, can_move
from bot.domain.planner import Plan
from bot.domain.playbooks import APPROVE, CLOSE
from bot.domain.policy import Mode
from bot.domain.returns import FaultBack
from bot.engine import returned, trust
from bot.engine.admission import PAUSE, Admission, post_safely
from bot.engine.deps import EngineDeps
from bot.engine.executor import HELD, Executor
from bot.engine.locks import IncidentLocks
from bot.engine.ports import Notice
from bot.engine.registry import Track
from bot.engine.rollback import ROLLBACK, RollbackHeld, RollbackRecord, undo
from bot.engine.signals import Signals
from bot.engine.steps.capacity import hold, left_out, lent_changed
from bot.engine.tasks import cancel_and_wait
from bot.store import codec
from bot.store.base import SUPERSEDED, Deposed, IncidentRecord, NewEvent, StepRecord

log = logger(__name__)
_ENDED = frozenset({"ok", "skipped", "failed", "undone"})


class IncidentFlow:
    def __init__(
        self,
        deps: EngineDeps,
        admission: Admission,
        executor: Executor,
        signals: Signals,
        locks: IncidentLocks,
    ) -> None:
        self.deps = deps
        self.locks = locks
        self.store = deps.store
        self.metrics = deps.metrics
        self.clock = deps.clock
        self.registry = deps.registry
        self.admission = admission
        self.executor = executor
        self.signals = signals

    async def run(self, incident_id: str) -> None:
        job_track: asyncio.Task[None] | None = None
        try:
            while True:
                incident, steps = await self.store.incident_and_steps(incident_id)
                if incident is None:
                    return
                rollback = steps.get(ROLLBACK)
                if incident.state.terminal and (
                    rollback is None or (rollback.status == "ok" and incident.state is State.ROLLED_BACK)
                ):
                    return  # a rollback of a closed incident still under way goes on below
                if rollback is not None:  # requested before a crash: finish it, never re-run a finished one
                    async with self.locks.work(incident_id):
                        if await self.carry_on_rollback(incident, rollback) is not None:
                            return
                    await self.signals.wait(incident_id, None)  # held by a pause: resume signals it
                    continue
                if incident.state is State.OPEN or incident.plan is None:
                    await self.admission.admit(incident)
                    continue
                if incident.faults_changed:
                    await cancel_and_wait(job_track)  # the new plan restarts it
                    job_track = None
                    await self.admission.replan(incident)
                    continue
                plan = incident.plan
                if job_track is None or job_track.done():
                    job_track = self._start_job_track(incident, plan, steps)
                if await self._node_track(incident, plan, steps, job_track):
                    return
        finally:
            await cancel_and_wait(job_track)

    # ---------------------------------------------------------------- node track
    async def _node_track(
        self,
        incident: IncidentRecord,
        plan: Plan,
        steps: Mapping[str, StepRecord],
        job_track: asyncio.Task[None] | None,
    ) -> bool:
        """One move of the node track; True when the flow is over. ``steps``: as read at the top
        of this move."""
        order = plan.steps
        hands_off = not (plan.acts and plan.mode is not Mode.OBSERVE)
        if incident.step_index >= len(order):
            return await self._finish(incident, hands_off)
        step = order[incident.step_index]
        self.metrics.incidents.show_incident(incident, step)  # the active-incidents table's row
        if step == CLOSE:
            # Watching before the look reads the alerts: a fault back filed meanwhile still ends the wait.
            self.signals.watch_returns(incident.id, True)
            watch = await returned.look(self.store, self.deps.playbooks, incident, steps)
            self.signals.watch_returns(incident.id, watch is not None)
            if watch is not None and watch.back is not None:
                await cancel_and_wait(job_track)  # the next rung restarts it
                return await self._fault_back(incident, watch.back)
            if not await self._job_track_ended(incident, plan, job_track, steps):
                return False
            if hands_off and await self._still_firing(incident, steps):
                return False
            if watch is not None and await self._watching_return(incident, watch, steps):
                return False
        if step == APPROVE:
            decided = await self._approval(incident)
            if decided is None:
                return False
            if not decided:
                return True
        elif self.registry[step].track is Track.NODE:
            idle = job_track is None or job_track.done()  # no job track writes the job steps
            if await self.executor.skip_ahead(incident, steps, jobs=idle):
                return False  # the next move reads where the node track now stands
            if not await self._enter(incident, step):
                return False
            # The step's record as read at the top of this move: only this track writes it.
            outcome = await self.executor.run(incident, step, steps, then=incident.step_index + 1)
            if outcome.status == HELD:
                await self.signals.wait(incident.id, None)  # resume signals every incident
                return False
            if outcome.status == "failed":
                if await self.admission.climb(incident, step, outcome.detail) is not None:
                    return False  # the next rung is planned: the node track goes on there
                await self._escalate(incident, step, outcome.detail)
                return True
            if outcome.advanced:
                return False
        await self.store.advance(incident.id, incident.step_index + 1, self.clock())
        return False

    async def _enter(self, incident: IncidentRecord, step: str) -> bool:
        """Move to the state this step runs in; hold every mutating step while paused (returning
        the node too: a paused pitcrew changes nothing, ``bot.engine.pause``)."""
        definition = self.registry[step]
        if incident.mode == Mode.OBSERVE.value:
            return True  # observe mode runs nothing on a node: the incident stays guarded, never "running"
        if definition.mutating:
            pause = await self.store.switch(PAUSE)
            if pause is not None:
                await self.store.record(
                    incident.id,
                    NewEvent("held", step=step, detail=f"paused by {pause.get('set_by')}"),
                    self.clock(),
                )
                await self.signals.wait(incident.id, None)
                return False
        target = definition.state
        if incident.state is not target and can_move(incident.state, target):
            await self.store.transition(
                incident.id, target, self.clock(), event=NewEvent("state", outcome=target.value)
            )
        return True

    # ----------------------------------------------------------------- job track
    def _job_steps(self, plan: Plan) -> list[str]:
        return [s for s in plan.steps if s in self.registry and self.registry[s].track is Track.JOB]

    def _start_job_track(
        self, incident: IncidentRecord, plan: Plan, steps: Mapping[str, StepRecord]
    ) -> asyncio.Task[None] | None:
        pending = [s for s in self._job_steps(plan) if _status(steps, s) not in _ENDED]
        if not pending:
            return None
        needs = {n for s in pending for n in self.registry[s].needs}
        if not all(_status(steps, n) in {"ok", "skipped"} for n in needs):
            return None  # the Slurm node is not out yet
        return asyncio.create_task(self._run_job_track(incident.id, pending), name=f"{incident.id}/job")

    async def _run_job_track(self, incident_id: str, pending: list[str]) -> None:
        try:
            await self._job_steps_in_turn(incident_id, pending)
        except (asyncio.CancelledError, Deposed):
            raise
        except Exception:  # the node track restarts it on its next move
            log.exception("job track crashed", extra={"incident": incident_id})
            await self.deps.timer.sleep(self.deps.settings.poll_interval.total_seconds())

    async def _job_steps_in_turn(self, incident_id: str, pending: list[str]) -> None:
        for step in pending:
            while True:
                incident = await self.store.incident(incident_id)
                if incident is None or incident.state.terminal:
                    return
                outcome = await self.executor.run(incident, step)
                if outcome.status != HELD:
                    break
                await self.signals.wait(incident_id, None)
            if outcome.status == "failed":
                await self._job_step_failed(incident, step, outcome.detail)
                break
        self.signals.signal(incident_id)  # a node track waiting at close looks again

    async def _job_track_ended(
        self,
        incident: IncidentRecord,
        plan: Plan,
        job_track: asyncio.Task[None] | None,
        steps: Mapping[str, StepRecord],
    ) -> bool:
        """At ``close``: True once every job-track step has ended; a failed one fails the incident.
        ``steps``: as read at the top of this move. A job step ended then is ended still (only a
        replan or a climb, each a move of its own, starts the job track afresh); one still open
        then may have ended since, as the job track runs beside this one: then they are read again."""
        job_steps = self._job_steps(plan)
        if not job_steps:
            return True  # no job track: nothing to read

        def still_open(steps: Mapping[str, StepRecord]) -> list[str]:
            return [s for s in job_steps if _status(steps, s) not in _ENDED]

        open_steps = still_open(steps)
        if open_steps:
            steps = await self.store.steps_of(incident.id)  # fresh: the job track runs beside this one
            open_steps = still_open(steps)
        if open_steps:
            if job_track is None or job_track.done():
                # Its prerequisites never completed (skipped by a replan?): nothing will run it.
                log.warning("job track cannot start", extra={"incident": incident.id, "steps": open_steps})
                return True
            await self.signals.wait(incident.id, None)
            return False
        failed = [s for s in job_steps if _status(steps, s) == "failed"]
        if failed:
            detail = await self.executor.failure(incident.id, failed[0])
            # Told when the step failed, unless pitcrew died before: once either way.
            await self._job_step_failed(incident, failed[0], detail)
            await self._close(incident, State.FAILED, f"{failed[0]} failed: {detail}")
            return False
        return True

    async def _job_step_failed(self, incident: IncidentRecord, step: str, detail: str) -> None:
        await self._tell(
            incident,
            "escalation",
            f"{step} failed — the interrupted training job needs a human",
            (detail, "The node track goes on; the incident will end as failed."),
            step=step,
            severity="critical",
            actions=("rollback",),
        )

    # ----------------------------------------------------------------- waiting
    async def _still_firing(self, incident: IncidentRecord, steps: Mapping[str, StepRecord]) -> bool:
        """Hands-off and observe incidents stay open while their alerts fire, so repeats attach.
        ``steps``: as read at the top of this move (only this method marks ``watching``)."""
        firing = await self.store.firing(incident.id)
        age = self.clock() - incident.opened_at
        watch_max = self.deps.settings.watch_max
        if not firing or age >= watch_max:
            return False
        if "watching" not in steps:
            await self.store.step_finished(
                incident.id,
                "watching",
                "running",
                self.clock(),
                event=NewEvent(
                    "watching", detail=f"{firing} alert(s) still firing; closes when they resolve"
                ),
            )
        await self.signals.wait(incident.id, (watch_max - age).total_seconds())
        return True

    async def _watching_return(
        self, incident: IncidentRecord, watch: returned.ReturnLook, steps: Mapping[str, StepRecord]
    ) -> bool:
        """The node is back and its playbook has a next rung: stay open until ``fault_returns_within``
        has passed, woken early when one of the incident's faults fires again."""
        now = self.clock()
        if watch.until is None:
            return False
        marked = steps.get(returned.RETURN_WATCH)  # only this method writes it
        if now >= watch.until:
            if marked is not None and marked.status == "running":
                waited = format_duration(watch.until - watch.returned.at)
                await self.store.step_finished(
                    incident.id,
                    returned.RETURN_WATCH,
                    "ok",
                    now,
                    event=NewEvent(
                        "return_watch", outcome="ok", detail=f"the fault did not come back in {waited}"
                    ),
                )
            return False
        if marked is None:
            until = watch.until.isoformat(timespec="seconds")
            faults = ", ".join(sorted(f.short for f in incident.faults))
            await self.store.step_finished(
                incident.id,
                returned.RETURN_WATCH,
                "running",
                now,
                event=NewEvent(
                    "return_watch",
                    detail=f"node back ({watch.returned.step}); open until {until}: {faults} firing "
                    f"again before then climbs to {watch.next_rung}",
                ),
            )
        # The intake signals a fault back; another replica's intake cannot: look again each poll.
        poll = self.deps.settings.poll_interval.total_seconds()
        await self.signals.wait(incident.id, min((watch.until - now).total_seconds(), poll))
        return True

    async def _fault_back(self, incident: IncidentRecord, back: FaultBack) -> bool:
        """The fault came back after the node's return: climb to the next rung, or humans take over
        when a guard refuses it. True when the flow is over."""
        step, detail = back.returned.step, back.words()
        self.signals.watch_returns(incident.id, False)  # the next rung's own return is watched anew
        if await self.admission.climb(incident, step, detail, back=True) is not None:
            return False
        await self._escalate(incident, step, detail, what="the fault came back after the repair")
        return True

    async def _approval(self, incident: IncidentRecord) -> bool | None:
        """True approved, False stopped (rejected/expired), None still waiting."""
        policy = self.deps.policy.approvals
        key = f"approve@{incident.playbook}"
        now = self.clock()
        approval = await self.store.approval(incident.id)
        if approval is None or approval.step != key:
            approval = await self.store.request_approval(
                incident.id, key, policy.approvers, now + policy.timeout, now
            )
            await self.store.record(
                incident.id,
                NewEvent(
                    "approval_requested",
                    step=APPROVE,
                    detail=f"approvers: {', '.join(policy.approvers)}; "
                    f"deadline {approval.deadline.isoformat(timespec='seconds')}",
                ),
                now,
            )
        # The request first, then the state: an incident shown awaiting approval always has one
        # to decide (read in between, it had none), and a crash in between resumes here.
        if approval.status == "pending" and incident.state is not State.AWAITING_APPROVAL:
            await self.store.transition(
                incident.id,
                State.AWAITING_APPROVAL,
                now,
                event=NewEvent("state", outcome="awaiting_approval"),
            )
        if approval.status == "approved":
            self._waited(incident, approval.requested_at, approval.decided_at or now)
            return True
        if approval.status == "rejected":
            self._waited(incident, approval.requested_at, approval.decided_at or now)
            trust.overridden(self.metrics, incident, "rejected")
            await self._close(incident, State.SUPPRESSED, f"rejected by {approval.decided_by}")
            return False
        if approval.status == "expired" or now >= approval.deadline:
            await self.store.decide_approval(incident.id, "expired", "pitcrew", now)
            self.metrics.approvals.labels("expired").inc()
            self._waited(incident, approval.requested_at, now)
            deadline = approval.deadline.isoformat(timespec="minutes")
            await self._tell(
                incident,
                "approval_expired",
                "approval timed out, nothing was done",
                (f"Nobody approved {incident.playbook} before {deadline}.",),
                step=APPROVE,
                severity="warning",
            )
            await self._close(incident, State.SUPPRESSED, "approval timed out: nothing was done")
            return False
        await self.signals.wait(incident.id, (approval.deadline - now).total_seconds())
        return None

    def _waited(self, incident: IncidentRecord, requested: datetime, decided: datetime) -> None:
        seconds = max((decided - requested).total_seconds(), 0.0)
        self.metrics.approval_wait.labels(incident.playbook or "none").observe(seconds)

    # ------------------------------------------------------------------- ending
    async def _finish(self, incident: IncidentRecord, hands_off: bool) -> bool:
        """Close after the last step — unless a delivery just brought a new fault (replan) or,
        for a hands-off incident, a firing alert (watch again, and close later)."""
        plan = incident.plan
        if plan is not None and plan.acts and plan.mode is Mode.OBSERVE:
            state, outcome = State.SUPPRESSED, f"observe mode: {incident.playbook} was not run"
        else:
            state, outcome = State.RESOLVED, "resolved"
        # A hands-off incident waits for its alerts to resolve — but only up to watch_max: after
        # that it closes even while they fire, or it would close-and-reopen for ever.
        watching = hands_off and self.clock() - incident.opened_at < self.deps.settings.watch_max
        if await self._close(incident, state, outcome, unless="firing" if watching else "new_fault"):
            return True
        fresh = await self.store.incident(incident.id)
        if fresh is not None and not fresh.faults_changed and watching:
            now = self.clock()
            await self.store.step_finished(
                incident.id,
                CLOSE,
                "superseded",
                now,
                event=NewEvent(SUPERSEDED, step=CLOSE, detail="alerts fire again"),
            )
            await self.store.advance(incident.id, max(incident.step_index - 1, 0), now)
        return False

    async def _close(
        self, incident: IncidentRecord, state: State, outcome: str, unless: str | None = None
    ) -> bool:
        # A take it still holds stays counted once it has ended: indexed before the end.
        took = bool(self.deps.steps.capacity.pools) and await hold(self.store, incident.id, self.clock())
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
        self.metrics.incidents.drop(incident.id)
        if took:  # its index entry is up to date (``hold`` above): the gauge shown again
            await lent_changed(self.executor.step_deps)
        return True

    async def _tell(
        self,
        incident: IncidentRecord,
        kind: str,
        title: str,
        lines: tuple[str, ...],
        *,
        step: str,
        once: bool = True,
        **extra: Any,
    ) -> None:
        """A notice about one incident outside any step's run: a failing notifier never stops the
        engine. It is told before the change it announces commits (an incident's end), and once
        per run of the ``step`` it is about (keyed by its kind): a crash between the two tells it
        once, when the flow comes back to the same place; told after the end, it would be lost.
        ``once=False``: news each time it is told (a rollback asked again of a rolled-back incident)."""
        notice = Notice(
            incident.id,
            kind,
            f"{incident.node}: {title}",
            lines,
            node=incident.node,
            step=step,
            key=kind if once else None,
            **extra,
        )
        await post_safely(self.deps.ports, self.store, self.clock, notice)

    async def _escalate(
        self, incident: IncidentRecord, step: str, detail: str, *, what: str | None = None
    ) -> None:
        what = what or f"{step} failed"
        lent = await left_out(self.store, incident.id) if self.deps.steps.capacity.pools else None
        await self._tell(
            incident,
            "escalation",
            f"{what} — a human must take over",
            (
                detail,
                *((lent,) if lent else ()),
                "Nothing further will be done automatically. Roll back with `pitcrew rollback "
                f"{incident.id}` to undo what pitcrew did.",
            ),
            step=step,
            severity="critical",
            actions=("rollback",),
        )
        if await self._close(incident, State.FAILED, f"{what}: {detail}"):
            self.metrics.steps.labels(step, "escalated").inc()

    async def undo_and_close(self, incident: IncidentRecord, actor: str) -> list[str] | None:
        """Undo what pitcrew did, end the incident ``rolled_back`` and tell humans; the caller holds
        the incident's work lock. Every active state may end so (before anything was done there
        is simply nothing to undo), so a rollback never leaves an incident to be rolled back again.

        ``None``: a pause held the next change (``bot.engine.pause``); what was undone so far is
        kept in the rollback's record, and the rollback goes on (from the store) after resume."""
        steps = await self.store.steps_of(incident.id)
        record = (
            codec.decode_record(RollbackRecord, steps[ROLLBACK].result)
            if ROLLBACK in steps
            else RollbackRecord(actor)
        )
        deps = self.deps.step_deps(forced=True) if record.forced else self.executor.step_deps
        try:
            undid = await undo(incident, steps, deps, self.registry, actor, tried=record.kept)
        except RollbackHeld as held:
            so_far = replace(
                record,
                report=(*record.report, *held.undid.report),
                kept=(*record.kept, *held.undid.kept),
            )
            await self.store.step_finished(
                incident.id,
                ROLLBACK,
                "running",
                self.clock(),
                result=codec.encode_record(so_far),
                event=NewEvent(
                    "rollback_held", actor=actor, detail=f"{held}; the rollback goes on after resume"
                ),
            )
            await lent_changed(deps, incident.id)
            return None
        report = [*record.report, *undid.report]
        kept = (*record.kept, *undid.kept)
        if kept:  # asked again once the reason is gone, it tries what it kept, and only that
            report.append(f"Roll back again to undo what was kept: `pitcrew rollback {incident.id}`")
        now = self.clock()
        await self.store.step_finished(
            incident.id,
            ROLLBACK,
            "ok",
            now,
            result=codec.encode_record(RollbackRecord(actor, tuple(report), record.forced, kept)),
            event=NewEvent("rollback_done", actor=actor, detail="; ".join(report) or "nothing to undo"),
        )
        if incident.state.terminal:  # asked again of an ended incident: what it gave back is back
            await lent_changed(deps, incident.id)
        approval = await self.store.approval(incident.id)
        if approval is not None and approval.status == "pending":  # nobody may approve it any more
            await self.store.decide_approval(incident.id, "cancelled", actor, now)
        await self._rolled_back(incident, actor, report, kept)
        return report

    async def carry_on_rollback(self, incident: IncidentRecord, record: StepRecord) -> list[str] | None:
        """Finish the rollback ``record`` (its step) stands for; the caller holds the incident's
        work lock. One still ``running`` is undone (``undo_and_close``: ``None`` when a pause held
        it); one that undid everything and was cut before the incident ended ``rolled_back`` is
        told and ended. Its report."""
        rollback = codec.decode_record(RollbackRecord, record.result)
        if record.status != "ok":
            return await self.undo_and_close(incident, rollback.actor)
        if incident.state is not State.ROLLED_BACK:
            await self._rolled_back(incident, rollback.actor, rollback.report, rollback.kept)
        return list(rollback.report)

    async def _rolled_back(
        self, incident: IncidentRecord, actor: str, report: Sequence[str], kept: Sequence[str] = ()
    ) -> None:
        """Tell humans what the rollback undid (offering to roll back again what it ``kept``), then
        end the incident ``rolled_back``. A rollback asked again of a rolled-back incident is news:
        its answer is told each time."""
        await self._tell(
            incident,
            "rollback",
            f"rolled back by {actor}",
            tuple(report) or ("nothing to undo",),
            step=ROLLBACK,
            once=incident.state is not State.ROLLED_BACK,
            actions=("rollback",) if kept else (),
        )
        if incident.state is not State.ROLLED_BACK:
            trust.overridden(self.metrics, incident, "rolled_back")
            await self._close(incident, State.ROLLED_BACK, f"rolled back by {actor}")


def _status(steps: Mapping[str, StepRecord], step: str) -> str | None:
    record = steps.get(step)
    return record.status if record is not None else None
