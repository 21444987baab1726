"""Repeat deliveries answered from memory (``bot.store.repeats``), on both stores.

- Counted in memory by one process, the deliveries reach the database within about a second,
  without a close: another process's view of the same database reads them.
- Postgres: memory answers only while the database commits this replica's writes. Right after a
  commit a repeat is answered even with the alert tables locked by another session; after
  ``FRESH`` seconds without one it waits for the database (a replica cut off from Postgres
  answers 503, not 200), and once answered there it is remembered. A replica taking only repeats
  stays fresh by the commits of its counts alone (every ``FLUSH_EVERY``, well within ``FRESH``).
- A repeat of a key another process stored is counted where the database is read once, then
  answered from memory; a resolution of an alert remembered as firing is never a repeat.
"""

from __future__ import annotations

import asyncio
import time
from datetime import UTC, datetime, timedelta

import psycopg
import pytest

from bot.domain.faults import Fault
from bot.store import postgres
from bot.store.base import Delivery, IncomingAlert
from tests.harness.stores import Stores

T0 = datetime(2026, 12, 2, 9, 0, tzinfo=UTC)


def _delivery(fingerprint: str, node: str, status: str = "firing") -> Delivery:
    alert = IncomingAlert(
        fingerprint,
        T0,
        T0 + timedelta(minutes=5) if status == "resolved" else None,
        status,  # type: ignore[arg-type]
        "GpuXid",
        node,
        {"node": node},
        {"summary": "XID"},
        Fault("xid", node, "3", 79, "RESTART_BM", "fatal", "replace-node", True, "fell off the bus", True),
    )
    return Delivery("pitcrew", "{}:{node=x}", alert.status, 0, (alert,))


async def test_repeats_counted_in_memory_reach_the_database_within_a_second(stores: Stores) -> None:
    counting, other = await stores.open(), await stores.open()
    outcome = await counting.ingest(_delivery("fp-a", "gpu-001"), T0)
    [incident] = outcome.opened
    later = T0 + timedelta(seconds=30)
    assert [await counting.count_repeats([("fp-a", T0, "firing")], later) for _ in range(3)] == [1, 1, 1]

    began = time.monotonic()
    while True:
        [alert] = await other.alerts_of(incident)
        if alert.deliveries == 4:
            break
        assert time.monotonic() - began < 5, f"the counts never reached the database: {alert.deliveries}"
        await asyncio.sleep(0.05)
    assert alert.last_seen == later
    [mine] = await counting.alerts_of(incident)
    assert mine.deliveries == 4  # committed, and no longer added from memory


async def test_a_key_another_process_stored_is_looked_up_once_then_remembered(stores: Stores) -> None:
    storing, counting = await stores.open(), await stores.open()
    await storing.ingest(_delivery("fp-b", "gpu-002"), T0)
    # Its first delivery here is counted where the database is read (Postgres, which has not
    # committed for this process yet, looks it up; SQLite ingests it in full, as the webhook does).
    first = await counting.count_repeats([("fp-b", T0, "firing")], T0)
    if first is None:
        first = (await counting.ingest(_delivery("fp-b", "gpu-002"), T0)).repeated_alerts
    assert first == 1
    # Then it is remembered.
    assert await counting.count_repeats([("fp-b", T0, "firing")], T0) == 1
    # Remembered as firing: its resolution is no repeat, and the database stores it.
    assert await counting.count_repeats([("fp-b", T0, "resolved")], T0) is None
    resolved = await counting.ingest(_delivery("fp-b", "gpu-002", "resolved"), T0)
    assert resolved.resolved == 1
    # A stale firing after the resolution is a repeat, from memory or not.
    assert await storing.count_repeats([("fp-b", T0, "firing")], T0) == 1


@pytest.mark.parametrize("stores", ["postgres"], indirect=True)
async def test_postgres_answers_repeats_from_memory_only_while_it_commits(stores: Stores) -> None:
    assert stores.database is not None
    store = await stores.open()
    await store.ingest(_delivery("fp-c", "gpu-003"), T0)
    database = stores.database
    with psycopg.connect(database.server.url(database.name), password=database.server.password) as lock:
        lock.execute("LOCK TABLE alerts, alert_deliveries IN ACCESS EXCLUSIVE MODE")
        # Just committed: memory answers, though the database could not.
        counted = await asyncio.wait_for(store.count_repeats([("fp-c", T0, "firing")], T0), timeout=0.5)
        assert counted == 1
        await asyncio.sleep(postgres.FRESH + 0.3)  # nothing committed since (the counts wait too)
        asking = asyncio.ensure_future(store.count_repeats([("fp-c", T0, "firing")], T0))
        done, _ = await asyncio.wait([asking], timeout=0.5)
        assert not done, "answered from memory though the database had committed nothing for a while"
        lock.commit()  # the database answers again
    assert await asyncio.wait_for(asking, timeout=5) == 1
    counted = await asyncio.wait_for(store.count_repeats([("fp-c", T0, "firing")], T0), timeout=0.5)
    assert counted == 1


@pytest.mark.parametrize("stores", ["postgres"], indirect=True)
async def test_a_postgres_replica_taking_only_repeats_stays_fresh_by_its_own_counts(stores: Stores) -> None:
    """No write but the counts' own commits, for longer than ``FRESH``: memory answers every repeat
    (the alerts table, which a lookup would read, is locked all along), and every count is kept."""
    assert stores.database is not None
    store, other = await stores.open(), await stores.open()
    outcome = await store.ingest(_delivery("fp-d", "gpu-004"), T0)
    database = stores.database
    counted = 0
    with psycopg.connect(database.server.url(database.name), password=database.server.password) as lock:
        lock.execute("LOCK TABLE alerts IN ACCESS EXCLUSIVE MODE")
        until = time.monotonic() + 3 * postgres.FRESH
        while time.monotonic() < until:
            asking = store.count_repeats([("fp-d", T0, "firing")], T0)
            counted += await asyncio.wait_for(asking, timeout=0.5) or 0
            await asyncio.sleep(0)
    [incident] = outcome.opened
    await store.close()
    [alert] = await other.alerts_of(incident)
    assert alert.deliveries == 1 + counted
