"""The outbox sender: in order per incident, backoff without blocking other incidents, refusals audited.

A real SQLite store; the destination is a small recording one (the sender's contract is the
``Destination`` port: Slack's own behaviour is tested against the stand-in in ``tests/slack``).
Cases: a notice failing transiently holds back only its incident's later notices, which then arrive
in order; the failures' attempts are persisted before each try; ``retry_after`` is honoured; a
permanent refusal is audited in the incident's timeline (``notice_failed``), counted, and the next
notice goes on; deferrals follow the one backoff policy (``bot.engine.backoff``): jittered below the
doubling delay, so notices that failed together are not all due together, and a ``retry_after``
waited for at least, beyond the policy's maximum; without destinations a notice is a timeline
event and nothing waits in the outbox.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from bot.domain.faults import Fault
from bot.engine.backoff import Backoff
from bot.engine.errors import PermanentError, Reason, TransientError
from bot.engine.metrics import Metrics
from bot.engine.outbox import OutboxNotifier, OutboxSender
from bot.engine.ports import Notice
from bot.integrations.journal import LogNotifier
from bot.store.base import Delivery, Fence, IncomingAlert, OutboxItem
from bot.store.sqlite import SqliteStore


def now() -> datetime:
    return datetime.now(UTC)


class Recording:
    """A destination that fails as told (by notice title) and records what it delivered."""

    name = "recording"

    def __init__(self, failures: dict[str, list[Exception]]) -> None:
        self.failures = failures
        self.delivered: list[str] = []
        self.attempts: dict[str, list[int]] = {}

    async def deliver(self, item: OutboxItem, *, more: bool = False) -> str | None:
        title = str(item.payload["title"])
        self.attempts.setdefault(title, []).append(item.attempts)
        if self.failures.get(title):
            raise self.failures[title].pop(0)
        self.delivered.append(title)
        return f"ref-{title}"


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[SqliteStore]:
    db = SqliteStore(tmp_path / "p.db", synchronous="off")
    await db.open()
    yield db
    await db.close()


async def _incidents(store: SqliteStore, *nodes: str) -> list[str]:
    alerts = tuple(
        IncomingAlert(
            f"fp-{n}", now(), None, "firing", "GpuXid", n, {"node": n}, {},
            Fault("xid", n, "0", 79, "RESTART_BM", "fatal", "replace-node", True, "off the bus", True),
        )
        for n in nodes
    )  # fmt: skip
    return list((await store.ingest(Delivery("r", "{}", "firing", 0, alerts), now())).opened)


async def _drain(sender: OutboxSender, destination: Recording, store: SqliteStore) -> None:
    deadline = time.monotonic() + 10
    while await store.outbox_pending(destination.name):
        assert time.monotonic() < deadline, "outbox never drained"
        await sender.drain(destination)
        await asyncio.sleep(0.01)


async def test_order_backoff_and_refusals(store: SqliteStore) -> None:
    a, b = await _incidents(store, "gpu-a", "gpu-b")
    flaky = TransientError("down", reason=Reason.UNAVAILABLE, retry_after=0.05)
    destination = Recording(
        {
            "a1": [flaky, flaky],
            "b1": [PermanentError("refused: invalid_blocks", reason=Reason.INVALID_REQUEST)],
        }
    )
    metrics = Metrics()
    notifier = OutboxNotifier(store, now, LogNotifier(), [destination.name])
    for incident, title in ((a, "a1"), (a, "a2"), (b, "b1"), (a, "a3"), (b, "b2")):
        await notifier.post(Notice(incident, "step", title))
    sender = OutboxSender(store, [destination], metrics, now, backoff=Backoff(0.01))

    await sender.drain(destination)
    assert destination.delivered == ["b2"]  # a is held behind a1; b1 was refused for good, b2 went on
    await _drain(sender, destination, store)
    assert destination.delivered == ["b2", "a1", "a2", "a3"]
    assert destination.attempts["a1"] == [1, 2, 3]  # each try counted before it was made
    failed = [e for e in await store.events_of(b) if e.kind == "notice_failed"]
    assert len(failed) == 1 and "refused" in failed[0].detail
    sample = metrics.registry.get_sample_value
    assert sample("pitcrew_notices_total", {"destination": "recording", "outcome": "failed"}) == 1
    assert sample("pitcrew_notices_total", {"destination": "recording", "outcome": "retried"}) == 2
    assert sample("pitcrew_notices_total", {"destination": "recording", "outcome": "delivered"}) == 4


async def test_deferrals_follow_the_one_backoff_policy(store: SqliteStore) -> None:
    nodes = [f"gpu-{n:02d}" for n in range(20)]
    incidents = await _incidents(store, *nodes, "gpu-told")
    failures: dict[str, list[Exception]] = {
        node: [TransientError(f"{node}: down", reason=Reason.UNAVAILABLE)] for node in nodes
    }
    failures["gpu-told"] = [TransientError("slow down", reason=Reason.RATE_LIMITED, retry_after=90.0)]
    destination = Recording(failures)
    notifier = OutboxNotifier(store, now, LogNotifier(), [destination.name])
    for incident, node in zip(incidents, [*nodes, "gpu-told"], strict=True):
        await notifier.post(Notice(incident, "step", node))
    sender = OutboxSender(store, [destination], Metrics(), now, backoff=Backoff(10.0, 60.0))

    before = now()
    await sender.drain(destination)
    took = (now() - before).total_seconds()
    due = {i.payload["title"]: i.not_before for i in await store.outbox_pending(destination.name)}
    assert not destination.delivered and None not in due.values()
    waits = [(due[node] - before).total_seconds() for node in nodes]  # type: ignore[operator]
    assert all(5.0 <= w <= 10.0 + took for w in waits), waits  # the first failure: 10 s, jittered down
    # Twenty notices that failed together are not due together: their spread is the jitter's
    # (uniform over 5 s here), not the few milliseconds the drain took to reach each.
    assert max(waits) - min(waits) > 1.0 + took, waits
    told = (due["gpu-told"] - before).total_seconds()  # type: ignore[operator]
    assert 90.0 <= told <= 90.0 + 5.0 + took  # the far side's word, beyond the policy's maximum


async def test_without_destinations_a_notice_is_a_timeline_event(store: SqliteStore) -> None:
    (incident,) = await _incidents(store, "gpu-c")
    ref = await OutboxNotifier(store, now, LogNotifier(), []).post(Notice(incident, "incident", "told"))
    events = [e for e in await store.events_of(incident) if e.kind == "notice"]
    assert [(e.detail, e.outcome) for e in events] == [("told", "incident")]
    assert ref == f"notice-{events[0].seq}"
    assert await store.outbox_pending("slack") == []


async def test_a_sender_that_stops_or_is_deposed_shows_no_pending_count(tmp_path: Path) -> None:
    """``pitcrew_outbox_pending`` is the leader's last look at what waits. A process that lost the
    lease, or stopped its sender, went on showing its last look beside the new leader's; once the
    new leader had delivered everything and nothing more went out for ten minutes,
    ``PitcrewNoticesStuck`` (the max over replicas) fired on that stale count, for good."""
    moment = [now()]
    store = SqliteStore(tmp_path / "p.db", synchronous="off", clock=lambda: moment[0])
    await store.open()
    try:
        incidents = await _incidents(store, "gpu-a", "gpu-b")
        notifier = OutboxNotifier(store, now, LogNotifier(), ["recording"])
        for incident in incidents:
            await notifier.post(Notice(incident, "step", "held"))
        down = TransientError("down", reason=Reason.UNAVAILABLE)
        fence = Fence("a", monotonic=lambda: 0.0)
        fence.grant((await store.acquire_lease("a", timedelta(seconds=15))).epoch, valid_until=100.0)

        def pending(metrics: Metrics) -> float | None:
            return metrics.registry.get_sample_value("pitcrew_outbox_pending", {"destination": "recording"})

        async def showing(count: int) -> tuple[OutboxSender, Metrics]:
            """A sender of a's, started, once it shows ``count`` pending (its deliveries all fail)."""
            metrics = Metrics()
            destination = Recording({"held": [down] * 50})
            sender = OutboxSender(
                store.fenced(fence), [destination], metrics, now, backoff=Backoff(0.01), idle=0.01
            )
            await sender.start()
            deadline = time.monotonic() + 10
            while pending(metrics) != count:
                assert time.monotonic() < deadline, "the pending count was never shown"
                await asyncio.sleep(0.01)
            return sender, metrics

        sender, stopped = await showing(2)
        await sender.stop()
        assert pending(stopped) == 0

        sender, deposed = await showing(2)
        moment[0] += timedelta(seconds=16)  # a's lease lapsed; b takes over
        assert (await store.acquire_lease("b", timedelta(seconds=15))).epoch == 2
        deadline = time.monotonic() + 10
        while pending(deposed) != 0:
            assert time.monotonic() < deadline, f"the deposed sender still shows {pending(deposed)}"
            await asyncio.sleep(0.01)
        await sender.stop()
    finally:
        await store.close()
