"""The engine: a supervised worker per active incident, resumed from the store on start.

Each worker is an ``IncidentFlow`` (``bot.engine.flow``); this module only supervises them.

One asyncio task per active incident gives per-node serialisation (one active incident
per node); a semaphore bounds how many steps run at once. The supervisor scans every active
incident in the store when woken (a command was given, an incident without a worker was
signalled) and every ``poll_interval``, so nothing depends on an in-memory queue that a crash
would lose. A delivery that opens an incident asks only for a look at the incidents opened since
the last look or scan (``opened``), any process's: a scan of every active incident at each
opening was what the slowest deliveries of a storm waited for.

The engine runs only while its process leads the store (``bot.engine.leadership``), and every
write it makes goes through the fenced store: when another process has taken over, a write
raises ``Deposed`` and the worker that hit it ends there, before any further call to a far side;
the leadership then stops the whole engine. Commands given to another process reach the
engine through the store, and the scan picks them up: a rollback requested there is carried out
here, an approval decided there wakes the incident waiting for it, a resume wakes every waiter.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from datetime import datetime

from bot import logger
from bot.domain.catalog import Catalog
from bot.domain.incident import State
from bot.engine.admission import PAUSE, Admission, breaker_state
from bot.engine.deps import EngineDeps
from bot.engine.executor import Executor
from bot.engine.flow import IncidentFlow
from bot.engine.hung_jobs import HungJobs
from bot.engine.locks import IncidentLocks
from bot.engine.old_nodes import OldNodeWatch
from bot.engine.pool_watch import PoolWatch
from bot.engine.rollback import ROLLBACK, RollbackRecord
from bot.engine.signals import Signals
from bot.engine.slurm_watch import SlurmWatch
from bot.engine.steps.capacity import show_lent
from bot.engine.tasks import cancel_and_wait, wait_ended
from bot.store import codec
from bot.store.base import Deposed, IncidentRecord, IngestOutcome, NewEvent

log = logger(__name__)
_SCAN_BEAT = 0.02


class Engine:
    def __init__(
        self, deps: EngineDeps, *, leading: Callable[[], bool] = lambda: True, catalog: Catalog | None = None
    ) -> None:
        """``leading``: whether this process leads the store now (``bot.engine.leadership``);
        always, for an engine that is the store's only user (tests, tools). ``catalog``: with
        ``engine.slurm_watch`` or ``engine.hung_job_after``, what the watches classify their alerts with."""
        self._leading = leading
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
        #: A scan of every active incident is asked for (``wake``), not only a look (``opened``).
        self._scan_due = False
        #: The newest incident's ``seq`` at the last scan or look: a look reads those after it.
        self._seen: int | None = None
        self._main: asyncio.Task[None] | None = None
        self._paused: bool | None = None  # the pause switch at the last scan (None: not read yet)
        self.slurm_watch = (
            SlurmWatch(deps, catalog, look_again=self.look_again, opened=self.opened)
            if deps.settings.slurm_watch and catalog is not None
            else None
        )
        self.hung_jobs = (
            HungJobs(deps, catalog, look_again=self.look_again, opened=self.opened)
            if deps.settings.hung_job_after is not None and catalog is not None
            else None
        )
        self.old_nodes = OldNodeWatch(deps)
        pools = deps.steps.capacity
        self.pool_watch = (
            PoolWatch(
                deps.ports,
                deps.store,
                pools.pools,
                deps.metrics,
                deps.clock,
                pools.read_every,
                deps.lent_lock,
            )
            if pools.pools
            else None
        )
        for step in deps.registry:  # every step's series exists from the start (0, not absent)
            for outcome in ("ok", "failed", "skipped"):
                self.metrics.steps.labels(step, outcome)

    # ----------------------------------------------------------------- lifecycle
    async def start(self) -> None:
        if self.pool_watch is not None:  # what is out of the pools now, whoever took it
            await show_lent(
                self.store, self.deps.steps.capacity.pools, self.metrics, self.deps.lent_lock, self.deps.clock
            )
        # Rollbacks under way (held by a pause, or cut by a crash) go on, closed incidents' too.
        for incident_id in await self.store.rollbacks_requested():
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
            await cancel_and_wait(task)
        self._tasks.clear()
        self._main = None
        if self.pool_watch is not None:
            await self.pool_watch.stop()
        self._forget_gauges()

    def _forget_gauges(self) -> None:
        """The scan's gauges describe the store as this engine last saw it: a process that stops
        leading must not go on exporting them beside the new leader's (dashboards sum them)."""
        for state in State:
            if not state.terminal:
                self.metrics.incidents_active.labels(state.value).set(0)
        for gauge in (
            self.metrics.nodes_under_remediation,
            self.metrics.approvals_waiting,
            self.metrics.oldest_active,
            self.metrics.paused,
            self.metrics.breaker_open,
        ):
            gauge.set(0)
        self.metrics.incidents.keep_only([])
        for pool in self.deps.steps.capacity.pools:  # the new leader's pool reads say it now
            self.metrics.capacity_idle.labels(pool.name).set(0)
            self.metrics.capacity_idle_gpus.labels(pool.name).set(0)
            self.metrics.capacity_lent.labels(pool.name).set(0)

    def wake(self) -> None:
        """Scan every active incident at the supervisor's next beat."""
        self._scan_due = True
        self._wake.set()

    def opened(self) -> None:
        """Incidents were opened (by a delivery, a watch): at the supervisor's next beat, a look
        at those opened since the last look, whichever process opened them, starts their workers,
        reading nothing else. Where a scan of every active incident ran at each delivery that
        opened one (500 rows decoded in a storm, and the rollbacks, switches and approvals read),
        the scan is now due every ``poll_interval`` and when a command wakes the engine; it finds
        what a look cannot (an incident whose worker ended), and sets the gauges of incidents by
        state, which so follow an opening within a ``poll_interval``. ``seq`` is taken under the
        write lock (``MAX(seq) + 1``, any replica's write waiting for it), so an incident that
        commits after a look has a greater one: the next look finds it."""
        self._wake.set()

    def signal(self, incident_id: str) -> None:
        """Something changed for this incident (approval, resolution): stop waiting. Its live
        worker looks again; a scan is needed only when it has none (not started yet, or ended and
        to be restarted). A storm of new occurrences on open incidents would otherwise make every
        delivery a scan of all active incidents."""
        self.signals.signal(incident_id)
        task = self._tasks.get(incident_id)
        if task is None or task.done():
            self.wake()

    def look_again(self, outcome: IngestOutcome) -> None:
        """What a stored delivery changed for incidents under way, told to their flows: a new fault
        may replan one and a resolved alert may close a watcher (each signalled); a fault back may
        climb one, which only a flow watching for its return waits for (``Signals.fault_again``)."""
        for incident_id in {*outcome.changed, *outcome.resolved_in}:
            self.signal(incident_id)
        for incident_id in outcome.recurred:
            self.signals.fault_again(incident_id)

    def signal_all(self) -> None:
        """A switch changed (resume): every waiting incident looks again."""
        self.signals.signal_all()
        self.wake()

    @property
    def leading(self) -> bool:
        return self._leading()

    @property
    def running(self) -> bool:
        return self._main is not None and not self._main.done()

    async def idle(self) -> None:
        """Wait until every incident task has finished (used by tests and demos)."""
        while pending := [t for t in self._tasks.values() if not t.done()]:
            await asyncio.wait(pending)

    # ---------------------------------------------------------------- supervisor
    async def _supervise(self) -> None:
        interval = self.deps.settings.poll_interval
        scanned: datetime | None = None
        while True:
            self._wake.clear()
            now = self.clock()
            due = (
                scanned is None
                or self._seen is None  # where a look would start is not read yet
                or self._scan_due
                or not scanned <= now < scanned + interval
            )
            try:
                if due:
                    self._scan_due = False
                    scanned = now
                    await self._scan()
                else:
                    await self._look()
            except Deposed:
                log.warning("engine stops: this process no longer leads")
                return
            except Exception:  # the supervisor must outlive a bad scan
                log.exception("engine scan failed")
            assert scanned is not None
            left = (scanned + interval - self.clock()).total_seconds()
            await self.deps.timer.wait(self._wake, min(max(left, 0.0), interval.total_seconds()))
            # A burst of deliveries wakes us many times: one look per short beat is enough.
            await self.deps.timer.sleep(_SCAN_BEAT)

    async def _look(self) -> None:
        """Start the workers of the incidents opened since the last look or scan (``opened``)."""
        assert self._seen is not None, "a scan first"
        for seq, incident_id, state in await self.store.opened_after(self._seen):
            self._seen = max(self._seen, seq)
            if not state.terminal and incident_id not in self._rolling_back:
                self._start_worker(incident_id)

    async def _scan(self) -> None:
        if self.slurm_watch is not None:
            try:
                await self.slurm_watch.poll()  # before reading the store: what it opens runs now
            except Deposed:
                raise
            except Exception:  # a bad look at Slurm must not stop the incidents already open
                log.exception("slurm watch failed; the next poll tries again")
        if self.hung_jobs is not None:
            try:
                await self.hung_jobs.poll()
            except Deposed:
                raise
            except Exception:  # nor a bad look at the jobs
                log.exception("hung-job watch failed; the next poll tries again")
        try:
            await self.old_nodes.poll()
        except Deposed:
            raise
        except Exception:  # nor a bad look at a replaced node
            log.exception("watch of replaced nodes failed; the next poll tries again")
        seen = await self.store.last_opened()  # first: what opens after it, a look finds
        active = await self.store.active()
        self._seen = seen
        await self._adopt_rollbacks()
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
        paused = await self.store.switch(PAUSE) is not None
        # The switches as the store holds them, shown by the process that leads and no other: set
        # where a command was taken or the breaker tripped, a standby's said "paused" for good
        # after a resume given to the leader, and a new leader said the breaker closed while open.
        self.metrics.paused.set(1 if paused else 0)
        self.metrics.breaker_open.set(1 if (await breaker_state(self.store)).open else 0)
        if self._paused and not paused:  # resumed, perhaps through another process
            self.signals.signal_all()
        self._paused = paused
        await self._wake_decided(
            [incident_id for incident_id, state, _ in active if state is State.AWAITING_APPROVAL]
        )
        live = {incident_id for incident_id, _, _ in active}
        for incident_id in [i for i, t in self._tasks.items() if t.done()]:
            self._tasks.pop(incident_id)
        self.signals.forget(live | set(self._tasks))
        self.locks.forget(live | set(self._tasks))
        if self.pool_watch is not None:
            self.pool_watch.poll()  # read only, at most once per capacity.read_every, not awaited

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

    async def _wake_decided(self, waiting: list[str]) -> None:
        """Incidents waiting for an approval that was decided (here or in another process)."""
        for incident_id in waiting:
            approval = await self.store.approval(incident_id)
            if approval is not None and approval.status != "pending":
                self.signals.signal(incident_id)

    async def _adopt_rollbacks(self) -> None:
        """Carry out rollbacks requested in the store and not under way here: recorded by a
        command another process took, or by this one before it led."""
        for incident_id in await self.store.rollbacks_requested():
            if incident_id in self._rolling_back:
                continue
            self._rolling_back.add(incident_id)
            task = self._tasks.get(incident_id)
            self._tasks[incident_id] = asyncio.create_task(
                self._carry_out_rollback(incident_id, task), name=f"{incident_id}/rollback"
            )

    async def _carry_out_rollback(self, incident_id: str, worker: asyncio.Task[None] | None) -> None:
        """Stop the incident's worker, then undo under its work lock, as ``request_rollback`` does."""
        try:
            if worker is not None and not worker.done():
                await cancel_and_wait(worker)
            async with self.locks.work(incident_id):
                incident = await self.store.incident(incident_id)
                record = (await self.store.steps_of(incident_id)).get(ROLLBACK)
                if incident is not None and record is not None:
                    await self.flow.carry_on_rollback(incident, record)
        except asyncio.CancelledError:
            raise
        except Deposed:
            log.warning("rollback stops: this process no longer leads", extra={"incident": incident_id})
        except Exception:
            log.exception("rollback failed; the next scan tries again", extra={"incident": incident_id})
            await self.deps.timer.sleep(self.deps.settings.poll_interval.total_seconds())
        finally:
            self._rolling_back.discard(incident_id)

    async def _guarded_run(self, incident_id: str) -> None:
        try:
            await self.flow.run(incident_id)
        except asyncio.CancelledError:
            raise
        except Deposed:
            log.warning(
                "incident worker stops: this process no longer leads", extra={"incident": incident_id}
            )
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
        carrier = self._tasks.get(incident.id)
        if (
            incident.id in self._rolling_back
            and carrier is not None
            and carrier is not asyncio.current_task()
        ):
            # Requested through another process and already being carried out here: one undo.
            await wait_ended(carrier)
            done = (await self.store.steps_of(incident.id)).get(ROLLBACK)
            undone = codec.decode_record(RollbackRecord, done.result).report if done else ()
            return list(undone)
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
                await cancel_and_wait(task)
            async with self.locks.work(incident.id):
                fresh = await self.store.incident(incident.id)
                assert fresh is not None
                report = await self.flow.undo_and_close(fresh, actor)
        finally:
            self._rolling_back.discard(incident.id)
        if report is None:  # held by a pause: a worker finishes it after resume
            self._start_worker(incident.id)
        return report
