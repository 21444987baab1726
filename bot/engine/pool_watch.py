"""The capacity pools' idle members between incidents: the cost side of keeping spares.

A take reads the pools when a stalled job needs a node; sizing the pools needs what they hold
the rest of the time. The engine's supervisor asks ``PoolWatch.poll`` every scan; it reads the
pools at most once per ``capacity.read_every`` (a Kubernetes list by selector and one Slurm read
per reservation member are not worth repeating every poll), in a task of its own so a slow far
side never holds up the scan, through the ``capacity`` step's own read (``pool_views``),
changing nothing. Each read sets the idle gauges and adds the spare GPU-hours held idle since the
last read: the GPUs the last read found idle, times the time between the two reads; and it shows
the lent gauge again from the store (``capacity.show_lent``, which also forgets an ended incident
indexed as holding a node once it holds none). A read that fails counts nothing for its
interval (what the pool held is not known) and is not retried before the next one is due.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from datetime import datetime, timedelta

from bot import logger
from bot.config import PoolSettings
from bot.engine.context import Ports
from bot.engine.errors import PitcrewError
from bot.engine.metrics import Metrics
from bot.engine.steps.capacity import pool_views, show_lent, taken_from
from bot.engine.tasks import cancel_and_wait
from bot.store.base import Store

log = logger(__name__)


class PoolWatch:
    def __init__(
        self,
        ports: Ports,
        store: Store,
        pools: Sequence[PoolSettings],
        metrics: Metrics,
        clock: Callable[[], datetime],
        every: timedelta,
        lent_lock: asyncio.Lock,
    ) -> None:
        self._ports = ports
        self._store = store
        self._pools = tuple(pools)
        self._metrics = metrics
        self._clock = clock
        self._every = every
        self._lent_lock = lent_lock
        self._due: datetime | None = None
        self._task: asyncio.Task[None] | None = None
        #: When the last good read began, and the idle GPUs per pool it found (``None``: no good
        #: read yet, or the last one failed: the interval after it is not counted).
        self._read_at: datetime | None = None
        self._idle_gpus: dict[str, int] | None = None
        #: Reads begun (the tests count them).
        self.reads = 0

    def poll(self) -> None:
        """Begin a read when one is due and none is under way, without waiting for it: a slow far
        side must not hold up the engine's scan. The first is due one interval after the first poll
        (a starting process has incidents to look at first)."""
        now = self._clock()
        if self._due is None:
            self._due = now + self._every
            return
        if now < self._due or (self._task is not None and not self._task.done()):
            return
        self._due = now + self._every
        self.reads += 1
        self._task = asyncio.create_task(self._read(now), name="pitcrew-pool-watch")

    @property
    def reading(self) -> bool:
        """A read under way (the tests wait for one to end)."""
        return self._task is not None and not self._task.done()

    async def stop(self) -> None:
        await cancel_and_wait(self._task)
        self._task = None

    async def _read(self, now: datetime) -> None:
        since, held = self._read_at, self._idle_gpus
        self._read_at, self._idle_gpus = None, None
        try:
            opened = await show_lent(self._store, self._pools, self._metrics, self._lent_lock, self._clock)
            _, busy = taken_from(opened, None)  # read once, for both
            views = await pool_views(self._ports, self._pools, busy)
        except PitcrewError as exc:
            log.warning("capacity pools not read: %s; idle GPU-hours not counted until the next read", exc)
            return
        except Exception:  # a bad read must not end the watch: the next one is due all the same
            log.exception("capacity pools not read; idle GPU-hours not counted until the next read")
            return
        gpus = {}
        for view in views:
            idle = [m for m in view.members if m.idle]
            gpus[view.pool.name] = sum(m.gpus or 0 for m in idle)
            self._metrics.capacity_idle.labels(view.pool.name).set(len(idle))
            self._metrics.capacity_idle_gpus.labels(view.pool.name).set(gpus[view.pool.name])
        if since is not None and held is not None:
            hours = (now - since).total_seconds() / 3600
            for pool, count in held.items():
                self._metrics.capacity_idle_gpu_hours.labels(pool).inc(count * hours)
        self._read_at, self._idle_gpus = now, gpus
