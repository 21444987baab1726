"""The store's leadership lease and the fence on its writes, on both stores: a real SQLite file
and a real PostgreSQL database (``tests.harness.stores``).

Two store objects on one database stand for two processes (SQLite: each its own writer and reader
connections on the file; Postgres: each its own connection pool); the lease's clock is a fake one
passed to both (``clock=``), as the store's clock is shared by every process using it. Cases, as a table: acquire on a fresh store, over a live lease
(refused), over an expired one (taken, epoch + 1), over one's own (re-taken, epoch + 1); renew by
the holder (extended, also once expired while nobody took it), by the holder of an old epoch and
by someone else (refused); release (free at once, only by the holder of the epoch). Then the fence:
a fenced write commits while the row carries its holder and epoch, raises ``Deposed`` and commits
nothing once another store took over (the deposed side is told once) — on Postgres also when the write reached the row while the
takeover was not committed yet — and is refused without
touching the store while not granted or once its local validity has passed. Unfenced writes
(webhook ingest, commands) go on whoever leads. The lease's SQL on the database's own clock.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

import psycopg
import pytest

from bot.store import sql
from bot.store.base import Deposed, Fence, NewEvent
from bot.store.postgres import PostgresStore
from bot.store.sql import single
from tests.harness.postgres import PostgresDatabase
from tests.harness.stores import AnyStore, Stores

T0 = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)
TTL = timedelta(seconds=15)


class Clock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> datetime:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += timedelta(seconds=seconds)


@dataclass
class Pair:
    clock: Clock
    a: AnyStore
    b: AnyStore


@pytest.fixture
async def pair(stores: Stores) -> Pair:
    clock = Clock()
    return Pair(clock, await stores.open(clock), await stores.open(clock))


@dataclass(frozen=True)
class Case:
    name: str
    #: Steps before the one under test: (who, op, seconds to advance first).
    before: tuple[tuple[str, str, float], ...]
    who: str
    op: str
    after: float  # seconds passed before the op under test
    #: (holder, epoch) of the row afterwards; for renew, None when refused.
    want: tuple[str, int] | None
    got: bool = True  # renew: extended
    notes: list[str] = field(default_factory=list)


CASES = [
    Case("acquire a fresh store", (), "a", "acquire", 0, ("a", 1)),
    Case("acquire over a live lease is refused", (("a", "acquire", 0),), "b", "acquire", 14.9, ("a", 1)),
    Case("acquire over an expired lease takes it", (("a", "acquire", 0),), "b", "acquire", 15, ("b", 2)),
    Case("acquire one's own lease raises the epoch", (("a", "acquire", 0),), "a", "acquire", 1, ("a", 2)),
    Case("renew by the holder extends it", (("a", "acquire", 0),), "a", "renew", 10, ("a", 1)),
    Case("renew after expiry, nobody took it", (("a", "acquire", 0),), "a", "renew", 60, ("a", 1)),
    Case(
        "renew of an old epoch is refused",
        (("a", "acquire", 0), ("b", "acquire", 20)),
        "a",
        "renew",
        1,
        ("b", 2),
        got=False,
    ),
    Case("renew by someone else is refused", (("a", "acquire", 0),), "b", "renew", 1, ("a", 1), got=False),
    Case(
        "release frees it at once",
        (("a", "acquire", 0), ("a", "release", 1)),
        "b",
        "acquire",
        0.001,
        ("b", 2),
    ),
    Case(
        "release by someone else does nothing",
        (("a", "acquire", 0), ("b", "release", 1)),
        "b",
        "acquire",
        1,
        ("a", 1),
    ),
]


async def _do(pair: Pair, who: str, op: str) -> bool:
    store = pair.a if who == "a" else pair.b
    holder = who
    current = await store.lease()
    epoch = current.epoch if current is not None else 0
    if op == "acquire":
        return (await store.acquire_lease(holder, TTL)).holder == holder
    if op == "renew":
        mine = current is not None and current.holder == holder
        return await store.renew_lease(holder, epoch if mine else 1, TTL) is not None
    await store.release_lease(holder, epoch)
    return True


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
async def test_lease_transitions(pair: Pair, case: Case) -> None:
    for who, op, advance in case.before:
        pair.clock.advance(advance)
        await _do(pair, who, op)
    pair.clock.advance(case.after)
    got = await _do(pair, case.who, case.op)
    lease = await pair.a.lease()
    assert lease is not None
    assert (lease.holder, lease.epoch) == case.want
    if case.op == "renew":
        assert got is case.got
        if got:
            assert lease.expires_at == pair.clock.now + TTL and lease.renewed_at == pair.clock.now
    if case.op == "acquire" and case.want is not None and case.want[0] == case.who:
        assert lease.acquired_at == pair.clock.now and not lease.expired


async def test_the_lease_is_one_row_whoever_reads_it(pair: Pair) -> None:
    assert await pair.a.lease() is None
    taken = await pair.a.acquire_lease("a", TTL)
    seen = await pair.b.lease()
    assert seen is not None and (seen.holder, seen.epoch, seen.expires_at) == ("a", 1, T0 + TTL)
    assert taken.now == T0 and not seen.expired
    pair.clock.advance(15)
    seen = await pair.b.lease()
    assert seen is not None and seen.expired


def _fence(holder: str, monotonic: Callable[[], float] = lambda: 0.0) -> tuple[Fence, list[str]]:
    told: list[str] = []
    fence = Fence(holder, monotonic=monotonic)
    fence.on_deposed(told.append)
    return fence, told


async def test_a_fenced_write_commits_only_for_the_holder_of_the_epoch(pair: Pair) -> None:
    fence, told = _fence("a")
    fenced = pair.a.fenced(fence)
    lease = await pair.a.acquire_lease("a", TTL)
    fence.grant(lease.epoch, valid_until=100.0)
    await fenced.record(None, NewEvent("note", detail="while leading"), pair.clock.now)

    pair.clock.advance(16)  # a paused past its lease; b takes over
    assert (await pair.b.acquire_lease("b", TTL)).epoch == 2
    with pytest.raises(Deposed, match="another process took over"):
        await fenced.record(None, NewEvent("note", detail="after the takeover"), pair.clock.now)
    with pytest.raises(Deposed):
        await fenced.set_outbox_ref("slack", "k", "v", pair.clock.now)
    with pytest.raises(Deposed):  # what a watch remembers is the leader's alone
        await fenced.remember("pitcrew-slurm-watch", {"gpu-001": {"jobs": []}}, pair.clock.now)
    assert len(told) == 1  # told once: the leadership steps down
    details = [e.detail for e in await pair.b.events_since(0)]
    assert details == ["while leading"]  # nothing of the deposed side committed
    assert await pair.a.outbox_ref("slack", "k") is None
    assert await pair.b.memory("pitcrew-slurm-watch") == {}

    # Unfenced writes (webhooks, commands) go on in every process.
    await pair.a.record(None, NewEvent("note", detail="a command on the old leader"), pair.clock.now)
    assert [e.detail for e in await pair.b.events_since(0)][-1] == "a command on the old leader"


async def test_a_fence_not_granted_or_past_its_validity_refuses_without_the_store(pair: Pair) -> None:
    now = [0.0]
    fence, told = _fence("a", monotonic=lambda: now[0])
    fenced = pair.a.fenced(fence)
    with pytest.raises(Deposed, match="standing by"):
        await fenced.record(None, NewEvent("note"), pair.clock.now)
    lease = await pair.a.acquire_lease("a", TTL)
    fence.grant(lease.epoch, valid_until=10.0)
    assert fence.leading
    await fenced.record(None, NewEvent("note", detail="ok"), pair.clock.now)
    now[0] = 10.0  # renewals failed for as long as it may lead on: the lease may have lapsed
    assert not fence.leading
    with pytest.raises(Deposed, match="may have lapsed"):
        await fenced.record(None, NewEvent("note", detail="late"), pair.clock.now)
    assert told and "may have lapsed" in told[0]
    assert [e.detail for e in await pair.a.events_since(0)] == ["ok"]


async def test_the_database_clock_without_a_fake_one(stores: Stores) -> None:
    store = await stores.open()
    before = datetime.now(UTC)
    lease = await store.acquire_lease("a", TTL)
    after = datetime.now(UTC)
    assert before - timedelta(seconds=1) <= lease.acquired_at <= after + timedelta(seconds=1)
    assert abs((lease.expires_at - lease.acquired_at) - TTL) < timedelta(milliseconds=1)
    assert (await store.acquire_lease("b", TTL)).holder == "a"
    await store.release_lease("a", 1)
    assert (await store.acquire_lease("b", TTL)).holder == "b"


async def test_postgres_a_fenced_write_waiting_on_a_takeover_in_flight_is_refused(
    postgres_db: PostgresDatabase,
) -> None:
    """The check holds until the commit: a fenced write that reached the leadership row while
    another process's takeover of it was uncommitted waits for that transaction, then reads the
    new epoch and writes nothing (READ COMMITTED re-reads a row it waited for)."""
    store = PostgresStore(postgres_db.url, password_file=postgres_db.password_file)
    await store.open()
    takeover = await psycopg.AsyncConnection.connect(
        postgres_db.url, password=postgres_db.password_file.read_text().strip()
    )
    try:
        fence, told = _fence("a", monotonic=lambda: 0.0)
        lease = await store.acquire_lease("a", TTL)
        fence.grant(lease.epoch, valid_until=100.0)
        fenced = store.fenced(fence)
        # Another process takes the row over, and has not committed yet.
        await takeover.execute("UPDATE leadership SET holder = 'b', epoch = epoch + 1 WHERE id = 1")
        write = asyncio.create_task(fenced.record(None, NewEvent("note", detail="a's intent"), T0))

        async def waiting_on_the_row() -> bool:
            rows = await store._read(
                single(
                    sql.rows(
                        "SELECT 1 FROM pg_stat_activity WHERE datname = current_database()"
                        " AND wait_event_type = 'Lock' AND query LIKE '%FROM leadership%FOR SHARE%'"
                    )
                )
            )
            return bool(rows) or write.done()

        deadline = time.monotonic() + 30
        while not await waiting_on_the_row():
            assert time.monotonic() < deadline, "the fenced write never reached the leadership row"
            await asyncio.sleep(0.01)
        assert not write.done(), "the fenced write went past a takeover in flight"
        await takeover.commit()
        with pytest.raises(Deposed, match="another process took over"):
            await write
        assert told and [e.detail for e in await store.events_since(0)] == []
    finally:
        await takeover.close()
        await store.close()


@pytest.mark.parametrize("stores", ["postgres", "pgbouncer"], indirect=True)
@pytest.mark.parametrize("style", ["SQL, DMY", "German", "Postgres, MDY"])
async def test_the_lease_whatever_the_database_s_date_style(stores: Stores, style: str) -> None:
    """A database (or role) whose ``DateStyle`` is not ISO, as some sites keep from an old install:
    psycopg parses a ``timestamptz`` in ISO only, so the lease's times could not be read, every
    acquisition failed ("can't parse timestamptz with DateStyle 'SQL, DMY'"), and no replica ever
    led, while check-config --live said all was well. The lease's times now come back in a form
    no session setting changes. On the database's own clock, in a time zone not UTC."""
    assert stores.database is not None
    with stores.database.connect() as admin:
        admin.execute(f"ALTER DATABASE \"{stores.database.name}\" SET DateStyle = '{style}'")
        admin.execute(f"ALTER DATABASE \"{stores.database.name}\" SET TimeZone = 'America/New_York'")
    a, b = await stores.open(), await stores.open()
    before = datetime.now(UTC)
    taken = await a.acquire_lease("a", TTL)
    after = datetime.now(UTC)
    assert (taken.holder, taken.epoch) == ("a", 1) and not taken.expired
    assert before - timedelta(seconds=1) <= taken.acquired_at <= after + timedelta(seconds=1)
    assert taken.expires_at == taken.acquired_at + TTL and taken.acquired_at.tzinfo is not None
    renewed = await a.renew_lease("a", 1, TTL)
    assert renewed is not None and renewed.expires_at >= taken.expires_at
    seen = await b.lease()
    assert seen is not None and (seen.holder, seen.epoch, seen.expires_at) == ("a", 1, renewed.expires_at)
    await a.release_lease("a", 1)
    assert (await b.acquire_lease("b", TTL)).epoch == 2
