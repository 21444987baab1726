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
from collections.abc import Callable
from datetime import datetime

from bot.config import Config
from bot.domain.incident import State
from bot.engine.admission import PAUSE, ROLLBACK, Admission
from bot.engine.context import Ports
from bot.engine.executor import Executor
from bot.engine.flow import IncidentFlow
from bot.engine.metrics import Metrics
from bot.engine.signals import Signals
from bot.store.base import IncidentRecord, NewEvent, Store

log = logging.getLogger(__name__)
_SCAN_BEAT = 0.02


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
        self.signals = Signals()
        self.flow = IncidentFlow(
            config, store, ports, metrics, clock, self.admission, self.executor, self.signals
        )
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._rolling_back: set[str] = set()  # rolled back by a command right now: no worker
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
        self.signals.forget(live | set(self._tasks))

    async def _guarded_run(self, incident_id: str) -> None:
        try:
            await self.flow.run(incident_id)
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception(
                "incident worker crashed; the supervisor will restart it", extra={"incident": incident_id}
            )
            await asyncio.sleep(self.config.settings.engine.poll_interval.total_seconds())

    # ------------------------------------------------------------- one incident

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
            await self.flow.finish_rollback(fresh, actor)
        finally:
            self._rolling_back.discard(incident.id)
