"""Retention, run by the leader: every ``store.prune_every``, prune what is older than ``store.retention``.

Only the process that leads prunes (this is one of the leader-only workers ``Leadership`` starts
and stops), and every prune transaction is fenced like any engine write: a deposed leader's prune
fails with nothing removed. What goes and what stays is the store's rule (``bot.store.retention``);
each transaction is small, so a prune never holds webhooks back for long. Rows removed are
counted in ``pitcrew_store_pruned_rows_total`` by table.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Protocol

from bot import logger
from bot.engine.metrics import Metrics
from bot.engine.signals import RealTimer, Timer
from bot.engine.tasks import cancel_and_wait
from bot.store.retention import Pruned

log = logger(__name__)


class Prunable(Protocol):
    async def prune(self, before: datetime) -> Pruned: ...


class Retention:
    """Leader-only worker (``start``/``stop``) that prunes ``store`` on a period."""

    def __init__(
        self,
        store: Prunable,
        metrics: Metrics,
        clock: Callable[[], datetime],
        *,
        keep: timedelta,
        every: timedelta,
        timer: Timer | None = None,
    ) -> None:
        self._store = store
        self._metrics = metrics
        self._clock = clock
        self.keep = keep
        self._every = every.total_seconds()
        self._timer = timer or RealTimer()
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="pitcrew-retention")

    async def stop(self) -> None:
        await cancel_and_wait(self._task)
        self._task = None

    async def prune(self) -> Pruned:
        """One whole prune: everything closed before now - ``keep``, in the store's small batches."""
        before = self._clock() - self.keep
        pruned = await self._store.prune(before)
        for table, count in pruned.counts.items():
            if count:
                self._metrics.store_pruned.labels(table).inc(count)
        if pruned.total:
            log.info(
                "store pruned", extra={"before": before.isoformat(timespec="seconds"), "rows": pruned.counts}
            )
        return pruned

    async def _run(self) -> None:
        while True:
            try:
                await self.prune()
            except asyncio.CancelledError:
                raise
            except Exception:  # a store hiccup or a lost lease: the next period tries again
                log.warning("could not prune the store; will retry", exc_info=True)
            await self._timer.sleep(self._every)
