"""The Postgres store through a real failover: a primary, its streaming standby, the standby promoted.

Sites run Postgres as a failover pair (CloudNativePG's instances, Patroni's): a primary streaming
its WAL to a hot standby, and a manager that promotes the standby when the primary's node dies.
pitcrew reaches whichever is primary through a Service that follows it (CloudNativePG's ``-rw``)
or through libpq's list of hosts with ``target_session_attrs=read-write``, which is what these
tests use: no Service here. The pair is real (``tests.harness.postgres.running_standby``:
``pg_basebackup -R`` and a second server), replicating synchronously where a test says so.

* A URL that names the standby first reaches the primary, and the store opens, migrates and writes
  there; without ``target_session_attrs`` the store does not open on the standby, and says why.
* The primary dies (``pg_ctl stop -m immediate``: no shutdown, as with its node) and the standby
  is promoted: the store is unavailable meanwhile (a webhook's ``503``: Alertmanager redelivers),
  the next write reaches the new primary without a restart, every delivery acknowledged before
  the failover is there (synchronous replication), and the lease its leader held is still its own.
* Asynchronous (PostgreSQL's default, and CloudNativePG's), a standby that falls behind loses
  what the store acknowledged meanwhile when it is promoted: the reason for the next case.
* The replication the store's commits get is in ``/readyz``'s detail and ``pitcrew_store_replication``
  (alert ``PitcrewStoreReplicationAsynchronous``), and a failover pair that acknowledges commits
  before a standby has them is logged as a warning.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

import psycopg
import pytest

from bot.domain.faults import Fault
from bot.engine.metrics import Metrics
from bot.store.base import Delivery, IncomingAlert, StoreUnavailable
from bot.store.postgres import PostgresStore
from bot.store.schema import SCHEMA_VERSION
from proving_ground.postgres import USER, PostgresServer
from tests.harness.figures import show_figure
from tests.harness.postgres import Standby, running_postgres, running_standby

T0 = datetime(2026, 12, 1, tzinfo=UTC)
#: How long the test gives the store to write again once the standby is promoted.
BOUND = 30.0


def _delivery(n: int) -> Delivery:
    node = f"gpu-{n:03d}"
    fault = Fault("xid", node, "3", 79, "RESTART_BM", "fatal", "replace-node", True, "fell off the bus", True)
    alert = IncomingAlert(f"fp-{node}", T0, None, "firing", "GpuXid", node, {"node": node}, {}, fault)
    return Delivery("pitcrew", f"{{node={node}}}", "firing", 0, (alert,))


@dataclass(frozen=True)
class Pair:
    primary: PostgresServer
    standby: Standby
    database: str
    password_file: Path

    def url(self, *ports: int, read_write: bool = True) -> str:
        return self.standby.url(self.database, *ports, read_write=read_write)


@pytest.fixture
def pair(tmp_path: Path) -> Iterator[Pair]:
    # PostgreSQL's own durability: the proving ground's fast cluster runs with
    # ``synchronous_commit=off``, and its commits wait for no flush, a standby's included.
    with running_postgres(durable=True) as primary:
        database = primary.create_database()
        with running_standby(primary) as standby:
            yield Pair(primary, standby, database, primary.password_file(tmp_path / "postgres-password"))


def _alerts(server_port: int, pair: Pair) -> int:
    """The alerts the server on ``server_port`` holds."""
    url = f"postgresql://{USER}@127.0.0.1:{server_port}/{pair.database}"
    with psycopg.connect(url, password=pair.primary.password, autocommit=True) as conn:
        row = conn.execute("SELECT count(*) FROM alerts").fetchone()
    assert row is not None
    return int(str(row[0]))


async def test_a_url_naming_the_standby_first_opens_the_store_on_the_primary(pair: Pair) -> None:
    store = PostgresStore(pair.url(pair.standby.port, pair.primary.port), password_file=pair.password_file)
    await store.open()
    try:
        await store.ingest(_delivery(1), T0)
        assert await store.ping()
    finally:
        await store.close()
    assert _alerts(pair.primary.port, pair) == 1

    on_the_standby = PostgresStore(
        pair.url(pair.standby.port, read_write=False), password_file=pair.password_file
    )
    seen = await on_the_standby.inspect()  # check-config --live says so before any start
    assert not seen.ok and "a standby, read-only" in seen.detail, seen
    assert seen.missing and seen.missing[0].startswith("a primary that takes writes"), seen
    with pytest.raises(StoreUnavailable, match="read-only"):
        await on_the_standby.open()
    seen = await PostgresStore(
        pair.url(pair.standby.port, pair.primary.port), password_file=pair.password_file
    ).inspect()
    assert seen.ok and f"schema {SCHEMA_VERSION}" in seen.detail, seen


async def test_a_failover_to_a_synchronous_standby_loses_no_acknowledged_delivery(
    pair: Pair, capsys: pytest.CaptureFixture[str]
) -> None:
    pair.standby.synchronous()
    store = PostgresStore(pair.url(pair.primary.port, pair.standby.port), password_file=pair.password_file)
    await store.open()
    try:
        lease = await store.acquire_lease("replica-a", timedelta(seconds=60))
        for n in range(20):
            await store.ingest(_delivery(n), T0)  # each one acknowledged: committed, and at the standby
        pair.primary.stop("immediate")
        with pytest.raises(StoreUnavailable):
            await store.ingest(_delivery(20), T0)
        pair.standby.promote()
        promoted = time.monotonic()
        attempts = 0
        while True:
            attempts += 1
            try:
                await store.ingest(_delivery(20), T0)
                break
            except StoreUnavailable:
                if time.monotonic() - promoted > BOUND:
                    raise
                await asyncio.sleep(0.2)
        took = time.monotonic() - promoted
        renewed = await store.renew_lease("replica-a", lease.epoch, timedelta(seconds=60))
        assert renewed is not None and renewed.epoch == lease.epoch
        assert await store.ping()
    finally:
        await store.close()
    assert _alerts(pair.standby.port, pair) == 21
    show_figure(
        capsys,
        f"  failover: the store wrote to the promoted standby {took:.1f}s after the promotion "
        f"({attempts} attempt(s)); 20 of 20 acknowledged deliveries there, and the lease",
    )


async def test_a_failover_to_an_asynchronous_standby_loses_acknowledged_deliveries(
    pair: Pair, capsys: pytest.CaptureFixture[str]
) -> None:
    """Why an asynchronous pair is a warning: the standby falls behind (the primary's WAL sender
    paused, as a slow or saturated link holds it), the store acknowledges deliveries all the same,
    the primary dies and the standby is promoted: what it had not received is gone. Alertmanager,
    answered 200, does not send it again before its ``repeat_interval``. (The sender is paused,
    not the standby's receiver: what a sender has sent waits in the socket for the receiver.)"""
    store = PostgresStore(pair.url(pair.primary.port, pair.standby.port), password_file=pair.password_file)
    await store.open()
    try:
        await store.ingest(_delivery(0), T0)
        _wait_replayed(pair)
        sender = _sender(pair)
        os.kill(sender, signal.SIGSTOP)
        try:
            for n in range(1, 6):
                await store.ingest(_delivery(n), T0)  # acknowledged: committed on the primary alone
        except BaseException:
            os.kill(sender, signal.SIGCONT)
            raise
        # The primary dies: its server processes are ended, the paused sender by SIGKILL (after
        # PostgreSQL's 5 s), and what it held back never leaves.
        pair.primary.stop("immediate")
        pair.standby.promote()
        kept = _alerts(pair.standby.port, pair)
    finally:
        await store.close()
    assert kept < 6, f"the promoted standby has {kept} of 6 acknowledged deliveries"
    show_figure(capsys, f"  asynchronous failover: {6 - kept} of 6 acknowledged deliveries lost")


def _standby(pair: Pair) -> psycopg.Connection[tuple[object, ...]]:
    url = f"postgresql://{USER}@127.0.0.1:{pair.standby.port}/{pair.database}"
    return psycopg.connect(url, password=pair.primary.password, autocommit=True)


def _wait_replayed(pair: Pair) -> None:
    """Until the standby has replayed everything the primary has written so far."""
    with pair.primary.connect() as primary:
        row = primary.execute("SELECT pg_current_wal_lsn()::text").fetchone()
    assert row is not None
    with _standby(pair) as standby:
        for _ in range(200):
            done = standby.execute("SELECT pg_last_wal_replay_lsn() >= %s::pg_lsn", (row[0],)).fetchone()
            if done is not None and done[0]:
                return
            time.sleep(0.05)
    raise AssertionError("the standby never caught up")


def _sender(pair: Pair) -> int:
    """The primary's WAL sender process, streaming to the standby."""
    with pair.primary.connect() as primary:
        row = primary.execute("SELECT pid FROM pg_stat_replication").fetchone()
    assert row is not None, "nothing streams from the primary"
    return int(str(row[0]))


async def test_the_replication_commits_get_is_shown_and_an_asynchronous_pair_is_a_warning(
    pair: Pair, caplog: pytest.LogCaptureFixture
) -> None:
    store = PostgresStore(pair.url(pair.primary.port, pair.standby.port), password_file=pair.password_file)
    with caplog.at_level(logging.WARNING, logger="pitcrew.store.postgres"):
        await store.open()  # it looks once at the start, and at every readiness probe
    try:
        assert store.describe()["replication"] == "asynchronous"
        assert store.describe()["standbys"] == 1
        seen = await store.inspect()  # check-config --live: a warning, not a failure
        assert seen.ok and "1 standby(s), asynchronous: a failover may lose" in seen.detail, seen
        warned = [r.getMessage() for r in caplog.records if "without waiting for them" in r.getMessage()]
        assert len(warned) == 1, caplog.text
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="pitcrew.store.postgres"):
            assert await store.ping()
            assert await store.ping()
        assert not caplog.records  # the turn is logged, not every probe
        metrics = Metrics()
        metrics.watch_store(store.describe)

        def gauge(mode: str) -> float | None:
            return metrics.registry.get_sample_value("pitcrew_store_replication", {"mode": mode})

        assert (gauge("asynchronous"), gauge("synchronous"), gauge("none")) == (1.0, 0.0, 0.0)
        pair.standby.synchronous()
        assert await store.ping()
        assert store.describe()["replication"] == "synchronous"
        assert "commits wait for a synchronous one" in (await store.inspect()).detail
        assert (gauge("asynchronous"), gauge("synchronous"), gauge("none")) == (0.0, 1.0, 0.0)
    finally:
        await store.close()
