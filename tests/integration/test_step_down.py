"""Stepping down names a leader-only worker that does not stop, and still waits for it.

A real SQLite store and real time: the process leads, its fence is told the term is over, and one
of its workers takes long to stop. The log says which worker and where each of pitcrew's tasks
waits (here: the worker's own task, inside its ``stop``); the fence is revoked at once, so nothing
of the old term is written meanwhile; "stepped down" comes only once the worker has stopped, never
with it still running beside a next term.
"""

from __future__ import annotations

import asyncio
import logging
from datetime import timedelta
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from bot.engine.leadership import Leadership
from bot.engine.metrics import Metrics
from bot.store.base import Fence
from bot.store.sqlite import SqliteStore


class SlowToStop:
    def __init__(self) -> None:
        self.release = asyncio.Event()
        self.started = asyncio.Event()
        self.stopped = False

    async def start(self) -> None:
        self.started.set()

    async def stop(self) -> None:
        await self._drain_the_last_round()
        self.stopped = True

    async def _drain_the_last_round(self) -> None:
        await self.release.wait()


async def test_a_worker_slow_to_stop_is_named_and_waited_for(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    store = SqliteStore(tmp_path / "pitcrew.db", synchronous="off")
    await store.open()
    fence = Fence("pitcrew-a")
    worker = SlowToStop()
    leadership = Leadership(
        store,
        fence,
        [worker],
        Metrics(CollectorRegistry()),
        ttl=timedelta(seconds=4),
        renew_every=timedelta(seconds=1),
        stop_noticed=0.2,
    )
    caplog.set_level(logging.INFO, logger="pitcrew")
    try:
        await leadership.start()
        await asyncio.wait_for(worker.started.wait(), 5)
        assert fence.leading
        fence.deposed("the store refused a write")
        for _ in range(100):
            if "has not stopped yet" in caplog.text:
                break
            await asyncio.sleep(0.05)
        [slow] = [r for r in caplog.records if "has not stopped yet" in r.getMessage()]
        assert slow.__dict__["worker"] == "SlowToStop"
        where = slow.__dict__["tasks"]["pitcrew-stop-SlowToStop"]
        assert "test_step_down.py" in where and "_drain_the_last_round" in where, where
        assert not fence.leading  # revoked before any worker was asked to stop
        assert "stepped down" not in caplog.text and not worker.stopped
        worker.release.set()
        for _ in range(100):
            if "stepped down" in caplog.text:
                break
            await asyncio.sleep(0.05)
        assert worker.stopped and "stepped down: standing by" in caplog.text
    finally:
        worker.release.set()
        await leadership.stop()
        await store.close()
