"""The hung-job watch: every poll, RUNNING Slurm jobs whose progress stood still for
``engine.hung_job_after`` become alerts in the store; they resolve when progress moves or the job ends.

Runs inside the engine's scan (the leading process only) and writes through the engine's fenced
store, like the Slurm watch. What it files is an alert like any other (``bot.domain.hung``), whose
catalog fault is notify-only by default: one incident, one notice, no node touched. A job on a node
that already has an incident of another alert is left alone (that incident speaks for the node).
Each job's progress, and since when it stood still, is kept in the store (``bot.engine.memory``): a
restart or a change of leader keeps the clock, and the stall keeps its alert.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime

from bot import logger
from bot.domain.catalog import Catalog
from bot.domain.hung import (
    ALERTNAME,
    HUNG_FAULT,
    SIGNAL_LIMIT,
    SIGNAL_WINDOW,
    HungJob,
    Progress,
    Signal,
    hung_job,
    is_hung,
    observe,
)
from bot.domain.jobs import JobSnapshot
from bot.domain.labels import node_name
from bot.engine.deps import EngineDeps
from bot.engine.errors import PitcrewError
from bot.engine.memory import Memory
from bot.engine.sourced import AlertSource
from bot.engine.steps.training import job_progress
from bot.store.base import IngestOutcome

log = logger(__name__)
RECEIVER = "pitcrew-hung-jobs"


class HungJobs(AlertSource):
    def __init__(
        self,
        deps: EngineDeps,
        catalog: Catalog,
        *,
        look_again: Callable[[IngestOutcome], None],
        opened: Callable[[], None],
    ) -> None:
        super().__init__(
            deps,
            catalog,
            alertname=ALERTNAME,
            fault=HUNG_FAULT,
            receiver=RECEIVER,
            look_again=look_again,
            opened=opened,
        )
        self._last: datetime | None = None
        self._memory = Memory(deps.store, RECEIVER, Progress)
        self._progress: dict[str, Progress] | None = None

    @property
    def enabled(self) -> bool:
        return bool(
            self._deps.settings.hung_job_after
            and self._deps.steps.resumption.progress_query
            and self._deps.ports.query is not None
        )

    async def poll(self) -> None:
        """One look at the running jobs, at most once per ``poll_interval`` or a sixth of
        ``hung_job_after``, whichever is longer: a look costs a job list per busy node and a query
        per job, and a stall of hours needs no look every two seconds."""
        now = self._deps.clock()
        after = self._deps.settings.hung_job_after
        if after is None or not self.enabled:
            return
        every = max(self._deps.settings.poll_interval, after / 6)
        if self._last is not None and now - self._last < every:
            return
        self._last = now
        try:
            jobs = await self._running()
        except PitcrewError as exc:
            log.warning("hung-job watch: cannot list jobs", extra={"error": str(exc), "reason": exc.reason})
            return
        if self._progress is None:
            self._progress = await self._memory.load()
        remembered = self._progress
        busy = await self._nodes_with_other_incidents()
        steps = self._deps.step_deps()
        hung: list[HungJob] = []
        for job in jobs.values():
            try:
                value = await job_progress(steps, job.job_id)
            except PitcrewError as exc:
                log.warning("hung-job watch: no progress", extra={"job": job.job_id, "error": str(exc)})
                continue
            progress = observe(remembered.get(job.job_id), value, now)
            if progress is None:
                remembered.pop(job.job_id, None)
                continue
            remembered[job.job_id] = progress
            if is_hung(progress, now, after) and not busy & set(job.nodes):
                hung.append(hung_job(job, progress, now, await self._signals(job, now)))
        for gone in set(remembered) - set(jobs):
            del remembered[gone]
        await self._memory.save(remembered, now)
        await self.file(hung, now)

    async def _running(self) -> dict[str, JobSnapshot]:
        """Every RUNNING job on a busy node whose name is a node name (identity mapping), by id."""
        scheduler = self._deps.ports.scheduler
        found: dict[str, JobSnapshot] = {}
        for node in await scheduler.nodes():
            if not node.busy:
                continue
            for job in await scheduler.jobs_on_node(node.name):
                if job.state == "RUNNING" and job.nodes and _named(job.nodes[0]):
                    found[job.job_id] = job
        return found

    async def _signals(self, job: JobSnapshot, now: datetime) -> list[Signal]:
        """The other alerts pitcrew has on the job's nodes (DCGM's, the network's ...), from the store:
        one bounded read, one more than the notice names so it can say there are more."""
        found = await self._deps.store.alerts_on(
            job.nodes, now - SIGNAL_WINDOW, limit=SIGNAL_LIMIT + 1, other_than=ALERTNAME
        )
        return [
            Signal(a.alertname, a.node or "", a.fault_key or "", a.status == "firing", a.starts_at)
            for a in found
        ]

    async def _nodes_with_other_incidents(self) -> set[str]:
        store = self._deps.store
        nodes = set()
        for incident_id, _, _ in await store.active():
            alerts = await store.alerts_of(incident_id)
            if any(a.alertname != ALERTNAME for a in alerts):
                incident = await store.incident(incident_id)
                if incident is not None:
                    nodes.add(incident.node)
        return nodes


def _named(name: str) -> bool:
    try:
        node_name(name)
    except ValueError:
        return False
    return True
