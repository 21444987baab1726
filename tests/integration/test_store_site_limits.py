"""A site's limits on its sessions (``statement_timeout``, ``lock_timeout``: a common guard on an
application's role or database) and pitcrew's own write lock, on a real Postgres, directly and
through PgBouncer.

Every write of every replica waits for one advisory lock (``bot.store.postgres._WRITE_LOCK``), held
by another replica for as long as its transaction runs: a delivery of one storm's group of
thousands of alerts holds it for a second and more. That wait is pitcrew's own, bounded by
pitcrew (``WRITE_LOCK_WAIT_MS``), not by limits a DBA set against runaway queries: under them a
replica's every write failed while the other stored a storm (deliveries answered 503, engine steps
retried, the writes' connection dropped). What the transaction does once it holds the lock stays
under the site's limits.

PostgreSQL 17 adds ``transaction_timeout``, which ends the whole *session* (FATAL) once a
transaction has run that long, the wait for a lock included: a site's value under pitcrew's wait
made a replica's writes drop their connection whenever the other held the lock. The tests run on
17 as well (``postgres-17``; CloudNativePG's default is 18), the limit set there too.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Iterator

import pytest

from bot.store import postgres
from bot.store.base import StoreUnavailable
from bot.store.sql import Op, one
from tests.harness.stores import Stores
from tests.integration.test_store_contract import T0, _alert, _delivery

#: The site's limit, on every session of the database, and how long another replica holds the lock.
LIMIT_MS, HELD = 200, 1.0

pytestmark = pytest.mark.parametrize("stores", ["postgres", "pgbouncer", "postgres-17"], indirect=True)


def _limited(stores: Stores) -> tuple[str, ...]:
    """The site's limits on every new session of the store's database; their names."""
    assert stores.database is not None
    return stores.database.limit(LIMIT_MS)


@contextlib.contextmanager
def _another_replica_writing(stores: Stores, seconds: float) -> Iterator[threading.Event]:
    """Another replica's transaction holds the write lock for ``seconds`` from when the block
    begins (a storm's big delivery); the event is set once it has let go."""
    assert stores.database is not None
    held, released = threading.Event(), threading.Event()

    def hold() -> None:
        assert stores.database is not None
        with stores.database.connect() as other, other.transaction():
            for setting in stores.database.limits():  # the other replica's own wait is not this test's
                other.execute(f"SET LOCAL {setting} = 0")
            other.execute("SELECT pg_advisory_xact_lock(%s)", (postgres._WRITE_LOCK,))
            held.set()
            other.execute("SELECT pg_sleep(%s)", (seconds,))
        released.set()

    thread = threading.Thread(target=hold, daemon=True)
    thread.start()
    assert held.wait(5), "the other session never took the lock"
    try:
        yield released
    finally:
        thread.join(seconds + 10)


async def test_a_write_waits_for_another_replica_past_the_site_s_limits(stores: Stores) -> None:
    """Before, the site's 200 ms cut the wait for the lock short: the delivery failed (503) and the
    command's write too, while the other replica's transaction ran for a second."""
    _limited(stores)
    store = await stores.open()
    with _another_replica_writing(stores, HELD) as released:
        outcome, switched = await asyncio.wait_for(
            asyncio.gather(
                store.ingest(_delivery(_alert("fp-1", "gpu-001")), T0),
                store.set_switch("paused", {"by": "ops"}, "ops", T0),
                return_exceptions=True,
            ),
            timeout=15,
        )
        assert released.is_set(), f"the writes did not wait for the lock: {outcome!r}, {switched!r}"
    assert not isinstance(outcome, BaseException), f"the delivery failed: {outcome}"
    assert not isinstance(switched, BaseException), f"the command's write failed: {switched}"
    assert outcome.opened and outcome.new_alerts == 1
    assert (await store.switch("paused") or {}).get("by") == "ops"


async def test_once_it_holds_the_lock_a_write_runs_under_the_site_s_limits(stores: Stores) -> None:
    """Only the wait for pitcrew's own lock is pitcrew's: a runaway statement in the transaction
    is still cut short by what the site set."""
    limited = _limited(stores)
    store = await stores.open()

    def limits() -> Op[dict[str, str]]:
        found = yield one("SELECT " + ", ".join(f"current_setting('{name}') AS {name}" for name in limited))
        return dict(found)

    seen, _ = await store._transact(limits)
    assert seen == dict.fromkeys(limited, f"{LIMIT_MS}ms")


async def test_a_transaction_the_site_s_limits_end_leaves_the_store_unavailable_and_the_next_write_stored(
    stores: Stores,
) -> None:
    """A transaction that outruns the site's limits once it holds the lock is ended by them: the
    store unavailable for that write (a delivery answered 503 and redelivered, a step retried).
    On PostgreSQL 17 the transaction's own limit ends the whole session, an error of class 25
    (``TransactionTimeout``) that escaped as it was before; the next write is stored."""
    _limited(stores)
    store = await stores.open()

    def runaway() -> Op[None]:
        yield one("SELECT pg_sleep(1.0)")

    with pytest.raises(StoreUnavailable):
        await asyncio.wait_for(store._transact(runaway), timeout=15)
    outcome = await asyncio.wait_for(store.ingest(_delivery(_alert("fp-3", "gpu-003")), T0), timeout=15)
    assert outcome.opened, "the write after it is stored"


async def test_pitcrew_bounds_its_own_wait_for_the_lock(
    stores: Stores, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A wait past pitcrew's own bound fails as the store unavailable (a delivery answered 503 and
    redelivered, a step retried), whatever the site's limits, long before the other lets go."""
    monkeypatch.setattr(postgres, "WRITE_LOCK_WAIT_MS", 300)
    store = await stores.open()
    with _another_replica_writing(stores, 5.0) as released:
        with pytest.raises(StoreUnavailable, match="lock timeout"):
            await asyncio.wait_for(store.ingest(_delivery(_alert("fp-2", "gpu-002")), T0), timeout=15)
        assert not released.is_set()
    outcome = await asyncio.wait_for(store.ingest(_delivery(_alert("fp-2", "gpu-002")), T0), timeout=15)
    assert outcome.opened, "the write after the wait is stored"


async def test_a_database_without_limits_is_not_given_any(stores: Stores) -> None:
    """The bound is on the lock's wait alone: a database without limits keeps none in the
    transaction (``0``), as before."""
    store = await stores.open()
    assert stores.database is not None
    names = stores.database.limits()

    def limits() -> Op[dict[str, str]]:
        found = yield one("SELECT " + ", ".join(f"current_setting('{name}') AS {name}" for name in names))
        return dict(found)

    seen, _ = await store._transact(limits)
    assert seen == dict.fromkeys(names, "0")
