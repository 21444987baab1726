"""A delivery that stores a new occurrence of a fault already under way wakes nothing: neither a
scan of every active incident nor the incident's own worker, unless that worker watches for the
fault to come back after the node's return.

In steady state Alertmanager sends new occurrences of faults already under way (a new startsAt
on a node whose incident is open): on a fleet they are most of the deliveries that store anything.
The supervisor's scan reads every active incident, the rollbacks asked for and the switches; a
worker woken reads its incident, its steps and its firing alerts, and finds nothing to do. On
PostgreSQL those reads ran on the webhook's event loop: the woken workers were 39 % of what it ran
in ``bench/ingest.py``'s saturated stream. Cases: new occurrences on three watched incidents, virtual
time moving between them, make no store read at all (the scan's and the workers' counted); a
resolution still ends its incident at once; a delivery that opens an incident still starts a
worker through a scan. The flow that watches for a return is woken at once by its fault's new
occurrence (``tests/engine/test_ladder.py``).
"""

from __future__ import annotations

from collections import Counter
from datetime import timedelta
from pathlib import Path
from typing import Any

from bot.store.base import Store
from tests.engine.harness import EngineHarness, FakeTime
from tests.harness.scenarios import delivery

NODES = ("gpu-node-01", "gpu-node-02", "gpu-node-03")


class Counting:
    """The engine's store, counting the calls it gets by method."""

    def __init__(self) -> None:
        self.calls: Counter[str] = Counter()

    def wrap(self, store: Store, time: FakeTime) -> Store:
        self._store = store
        return self  # a Store in all but name (its __getattr__)

    def __getattr__(self, name: str) -> Any:
        if not name.startswith("_"):
            self.calls[name] += 1
        return getattr(self._store, name)


async def test_new_occurrences_wake_neither_a_scan_nor_their_incidents(tmp_path: Path) -> None:
    counting = Counting()
    async with EngineHarness(tmp_path, mode="observe", store=counting.wrap) as h:
        ids = [await h.alert(node=node) for node in NODES]
        for incident_id in ids:
            await h.until_event(incident_id, "watching")
        before = counting.calls.copy()
        for _ in range(10):
            for node, incident_id in zip(NODES, ids, strict=True):
                outcome = await h.deliver(delivery(node=node, starts=h.time.now()))
                assert set(outcome.recurred) == {incident_id} and not outcome.changed, outcome
            await h.time.advance(1.0)  # the scan's beat has passed: a wake would have scanned
        # Not one read of the engine's meanwhile: no scan, no worker (the intake has a store of its own).
        assert counting.calls == before, counting.calls - before
        began = h.time.elapsed
        await h.resolve(ids[0])
        ended = await h.until_ended(ids[0])
        # Observe mode ran nothing: the incident ends "suppressed", as soon as its alerts resolve.
        assert ended.state.value == "suppressed" and h.time.elapsed - began < 1.0
        opened = await h.alert(node="gpu-node-04")
        await h.until_event(opened, "watching", within=timedelta(seconds=5).total_seconds())
