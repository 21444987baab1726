"""A delivery that only makes a running incident look again wakes that incident's worker, not a
scan of every active incident.

In steady state Alertmanager sends new occurrences of faults already under way (a new startsAt
on a node whose incident is open). Each one makes the intake signal the incident
(``IngestOutcome.to_look_again``). The worker of that incident is alive and waiting; the
supervisor's scan reads every active incident, the rollbacks asked for and the switches, which on
a fleet with hundreds of open incidents costs milliseconds of the webhook's event loop per
delivery. Cases: new occurrences on three watched incidents, virtual time moving between them,
wake each incident's worker (it reads its incident and its steps again, once each) and no scan; a resolution still ends
its incident at once; a delivery that opens an incident still starts a worker through a scan.
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


async def test_new_occurrences_wake_their_incidents_not_a_scan(tmp_path: Path) -> None:
    counting = Counting()
    async with EngineHarness(tmp_path, mode="observe", store=counting.wrap) as h:
        ids = [await h.alert(node=node) for node in NODES]
        for incident_id in ids:
            await h.until_event(incident_id, "watching")
        scans, looks, steps = (counting.calls[m] for m in ("active", "incident", "steps_of"))
        for _ in range(10):
            for node, incident_id in zip(NODES, ids, strict=True):
                outcome = await h.deliver(delivery(node=node, starts=h.time.now()))
                assert outcome.to_look_again == {incident_id}, outcome
            await h.time.advance(1.0)  # the scan's beat has passed: a wake would have scanned
        assert counting.calls["active"] == scans, "new occurrences woke the supervisor's scan"
        # Each incident's worker looked again at each of its new occurrences.
        assert counting.calls["incident"] - looks >= 10 * len(NODES)
        # ... and read its steps once a look: its job track had ended, and an ended step stays so.
        assert counting.calls["steps_of"] - steps == counting.calls["incident"] - looks
        began = h.time.elapsed
        await h.resolve(ids[0])
        ended = await h.until_ended(ids[0])
        # Observe mode ran nothing: the incident ends "suppressed", as soon as its alerts resolve.
        assert ended.state.value == "suppressed" and h.time.elapsed - began < 1.0
        opened = await h.alert(node="gpu-node-04")
        await h.until_event(opened, "watching", within=timedelta(seconds=5).total_seconds())
