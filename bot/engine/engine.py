"""The engine: a supervised worker per active incident, resumed from the store on start.

Each worker is an ``IncidentFlow`` (``bot.engine.flow``); this module only supervises them.

One asyncio task per active incident gives per-node serialisation (one active incident
per node); a semaphore bounds how many steps run at once. The supervisor rescans the
store when woken (a delivery arrived, a command was given) and every ``poll_interval``,
so nothing depends on an in-memory queue that a crash would lose.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

from bot.domain.incident import State
from bot.engine.admission import PAUSE, Admission
from bot.engine.deps import EngineDeps
from bot.engine.executor import Executor
from bot.engine.flow import IncidentFlow
from bot.engine.locks import IncidentLocks
from bot.engine.rollback import ROLLBACK, RollbackRecord
from bot.engine.signals import Signals
from bot.store import codec
from bot.store.base import IncidentRecord, NewEvent

log = logging.getLogger(__name__)
_SCAN_BEAT = 0.02


class Engine:
    def __init__(self, deps: EngineDeps) -> None:
        self.deps = deps
        self.store = deps.store
        self.metrics = deps.metrics
        self.clock = deps.clock
        self.admission = Admission(deps)
        self._slots = asyncio.Semaphore(deps.settings.workers)
        self.locks = IncidentLocks()
        self.executor = Executor(deps, self._slots, self.locks)
        self.signals = Signals(deps.timer)
        self.flow = IncidentFlow(deps, self.admission, self.executor, self.signals, self.locks)
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._rolling_back: set[str] = set()  # rolled back by a command right now: no worker
        self._wake = asyncio.Event()
        self._main: asyncio.Task[None] | None = None
        for step in deps.registry:  # every step's series exists from the start (0, not absent)
            for outcome in ("ok", "failed", "skipped"):
                self.metrics.steps.labels(step, outcome)

    # ----------------------------------------------------------------- lifecycle
    async def start(self) -> None:
        # Rollbacks under way (held by a pause, or cut by a crash) go on, closed incidents' too.
        for incident_id in await self.store.rollbacks_under_way():
            self._start_worker(incident_id)
        self._main = asyncio.create_task(self._supervise(), name="pitcrew-engine")

    def _start_worker(self, incident_id: str) -> None:
        task = self._tasks.get(incident_id)
        if task is None or task.done():
            self._tasks[incident_id] = asyncio.create_task(self._guarded_run(incident_id), name=incident_id)

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
        self.signals.signal(incident_id)
        self._wake.set()

    def signal_all(self) -> None:
        """A switch changed (resume): every waiting incident looks again."""
        self.signals.signal_all()
        self._wake.set()

    @property
    def running(self) -> bool:
        return self._main is not None and not self._main.done()

    async def idle(self) -> None:
        """Wait until every incident task has finished (used by tests and demos)."""
        while pending := [t for t in self._tasks.values() if not t.done()]:
            await asyncio.wait(pending)

    # ---------------------------------------------------------------- supervisor
    async def _supervise(self) -> None:
        interval = self.deps.settings.poll_interval.total_seconds()
        while True:
            self._wake.clear()
            try:
                await self._scan()
            except Exception:  # the supervisor must outlive a bad scan
                log.exception("engine scan failed")
            await self.deps.timer.wait(self._wake, interval)
            # A burst of deliveries wakes us many times: one scan per short beat is enough.
            await self.deps.timer.sleep(_SCAN_BEAT)

    async def _scan(self) -> None:
        active = await self.store.active()
        now = self.clock()
        counts: dict[str, int] = {state.value: 0 for state in State if not state.terminal}
        for incident_id, state, _ in active:
            counts[state.value] += 1
            if incident_id not in self._rolling_back:
                self._start_worker(incident_id)
        for state_name, count in counts.items():
            self.metrics.incidents_active.labels(state_name).set(count)
        self.metrics.nodes_under_remediation.set(counts[State.RUNNING.value] + counts[State.VERIFYING.value])
        self.metrics.approvals_waiting.set(counts[State.AWAITING_APPROVAL.value])
        await self._show_incidents([incident_id for incident_id, _, _ in active])
        oldest = min((opened for _, _, opened in active), default=None)
        self.metrics.oldest_active.set((now - oldest).total_seconds() if oldest else 0)
        self.metrics.paused.set(1 if await self.store.switch(PAUSE) else 0)
        live = {incident_id for incident_id, _, _ in active}
        for incident_id in [i for i, t in self._tasks.items() if t.done()]:
            self._tasks.pop(incident_id)
        self.signals.forget(live | set(self._tasks))
        self.locks.forget(live | set(self._tasks))

    async def _show_incidents(self, active: list[str]) -> None:
        """One ``pitcrew_incident_info`` series per active incident, none for a closed one."""
        series = self.metrics.incidents
        series.keep_only(active)
        for incident_id in active:
            if incident_id in series:
                continue  # its flow refreshes the row at every move of the node track
            incident = await self.store.incident(incident_id)
            if incident is not None and not incident.state.terminal:
                series.show_incident(incident)

    async def _guarded_run(self, incident_id: str) -> None:
        try:
            await self.flow.run(incident_id)
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception(
                "incident worker crashed; the supervisor will restart it", extra={"incident": incident_id}
            )
            await self.deps.timer.sleep(self.deps.settings.poll_interval.total_seconds())

    # ----------------------------------------------------------------- rollback
    async def request_rollback(
        self, incident: IncidentRecord, actor: str, *, forced: bool = False
    ) -> list[str] | None:
        """Persist the request, stop the incident's worker, then undo under its work lock.

        The request is in the store first, so a crash in between resumes the rollback, not the
        playbook. Stopping the worker cancels a step call in flight (its intent is already
        persisted, and every undo reads the far side before it acts); the work lock then keeps
        any step call of the incident from running beside the undo. Returns the report, or
        ``None`` when a pause held it: its worker finishes it after resume.
        """
        self._rolling_back.add(incident.id)
        try:
            await self.store.step_finished(
                incident.id,
                ROLLBACK,
                "running",
                self.clock(),
                result=codec.encode_record(RollbackRecord(actor, forced=forced)),
                event=NewEvent("rollback_requested", actor=actor),
            )
            task = self._tasks.pop(incident.id, None)
            if task is not None and task is not asyncio.current_task():
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
            async with self.locks.work(incident.id):
                fresh = await self.store.incident(incident.id)
                assert fresh is not None
                report = await self.flow.undo_and_close(fresh, actor)
        finally:
            self._rolling_back.discard(incident.id)
        if report is None:  # held by a pause: a worker finishes it after resume
            self._start_worker(incident.id)
        return report
