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
worker. The flow that watches for a return is woken at once by its fault's new occurrence
(``tests/engine/test_ladder.py``).

A delivery that opens an incident asks for a look at the incidents opened since the last look,
not a scan of every active incident (which read 500 rows, the rollbacks, the switches and the
approvals at each opening of ``bench/ingest.py``'s storm): cases count the scans, and check that
the look finds an incident another process opened, and that the scan still runs every
``poll_interval`` and when a command wakes the engine.
"""

from __future__ import annotations

from collections import Counter
from datetime import timedelta
from pathlib import Path
from typing import Any

from bot.domain.labels import LabelRules
from bot.engine.intake import Intake
from bot.engine.metrics import Metrics
from bot.store.base import Store
from bot.store.sqlite import SqliteStore
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


async def test_an_incident_opened_starts_its_worker_without_a_scan(tmp_path: Path) -> None:
    counting = Counting()
    async with EngineHarness(tmp_path, mode="observe", store=counting.wrap) as h:  # poll: a minute
        await h.time.advance(1.0)  # the scan at start is done
        scans = counting.calls["active"]
        assert scans >= 1
        ids = [await h.alert(node=node) for node in NODES]
        for incident_id in ids:
            await h.until_event(incident_id, "watching", within=5.0)
        assert counting.calls["active"] == scans, "a scan of every active incident ran"
        assert counting.calls["opened_after"] >= 1, "no look started them"
        await h.time.advance(60.0)  # the poll interval has passed since the last scan
        assert counting.calls["active"] == scans + 1
        h.engine.wake()  # a command's wake still scans at the next beat
        await h.time.advance(1.0)
        assert counting.calls["active"] == scans + 2


async def test_a_look_finds_the_incidents_another_process_opened(tmp_path: Path) -> None:
    async with EngineHarness(tmp_path, mode="observe") as h:  # poll: a minute
        await h.time.advance(1.0)
        other = SqliteStore(tmp_path / "pitcrew.db", synchronous="off", clock=h.time.now)
        await other.open()
        try:  # a standby's webhook: it stores the incident, and its engine does not run
            standby = Intake(other, h.catalog, LabelRules(), Metrics())
            body = delivery(node="gpu-node-01", starts=h.time.now())
            [theirs] = (await standby.accept(body, h.time.now())).opened
        finally:
            await other.close()
        await h.time.advance(5.0)
        assert not await h.events(theirs, "watching"), "started before anything woke the engine"
        ours = await h.alert(node="gpu-node-02")  # this process's opening: a look finds both
        await h.until_event(ours, "watching", within=5.0)
        await h.until_event(theirs, "watching", within=5.0)
