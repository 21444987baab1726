"""The store's schema across pitcrew releases, on both stores (``tests.harness.stores``).

Cases: two processes opening one new store at once both open it, migrated once; a store a newer
pitcrew migrated with migrations that only add is run on as it is (a rolling update's replica still
on the last release, a rollback of the image), its schema and its record left as they were; one
whose newer migrations this pitcrew must not run after, or with no record of which pitcrew may,
is refused with a message that says why, and nothing is written; a store of a pitcrew before the
record gets it at the next start; a migration beside an older replica's writes (a rolling
update) waits for them, never ends in a deadlock with them. The rule itself is ``bot.store.schema.standing``
(``tests/unit/test_store_schema.py``).
"""

from __future__ import annotations

import asyncio
import logging
from datetime import UTC, datetime

import pytest

from bot.domain.faults import Fault
from bot.store import postgres
from bot.store.base import Delivery, IncomingAlert, StoreUnavailable
from bot.store.schema import SCHEMA_VERSION, NewerSchema, compatible_from
from bot.store.sqlite import SqliteStore
from proving_ground.proc import eventually
from tests.harness.postgres import PostgresDatabase
from tests.harness.stores import (
    Stores,
    before_audit_column,
    before_check_function,
    before_guarded_indexes,
    newer_schema,
)

T0 = datetime(2026, 12, 4, 9, 0, tzinfo=UTC)
NEXT = SCHEMA_VERSION + 1
#: What the next release's migration might add: a table, and a column an earlier pitcrew leaves null.
ADDITIVE = (
    "CREATE TABLE future_things (id TEXT PRIMARY KEY, note TEXT)",
    "ALTER TABLE incidents ADD COLUMN future_note TEXT",
)


def _delivery(fp: str, node: str) -> Delivery:
    fault = Fault("xid", node, "3", 79, "RESTART_BM", "fatal", "replace-node", True, "fell off the bus", True)
    alert = IncomingAlert(fp, T0, None, "firing", "GpuXid", node, {"node": node}, {}, fault)
    return Delivery("pitcrew", "{}:{node=x}", "firing", 0, (alert,))


def _record(stores: Stores) -> tuple[int, int | None]:
    """The store's schema version and its record of the earliest pitcrew schema that runs on it."""
    if stores.database is None:
        [(version,)] = stores.sql("PRAGMA user_version")
        found = stores.sql("SELECT compatible_from FROM pitcrew_schema")
    else:
        [(version, compatible)] = stores.sql("SELECT version, compatible_from FROM pitcrew_schema")
        found = [(compatible,)]
    [(compatible,)] = found or [(None,)]
    return int(str(version)), None if compatible is None else int(str(compatible))


def _migrated_by_a_newer_pitcrew(stores: Stores, compatible: int | None) -> None:
    """As the next release leaves the store: its migration applied, its version, its record."""
    stores.sql(*ADDITIVE, *newer_schema(stores.database is None, NEXT, compatible))


async def test_two_processes_opening_a_new_store_at_once_both_open_it(stores: Stores) -> None:
    """Each reads the version it migrates from under the database's write lock: before, two
    pitcrews started together on a new SQLite file both ran the first migration, and one failed
    ("table incidents already exists"), every time."""
    first, second = stores.make(), stores.make()
    try:
        await asyncio.gather(first.open(), second.open())
        opened = (await first.ingest(_delivery("fp-a", "gpu-001"), T0)).opened
        assert opened
        assert (await second.ingest(_delivery("fp-a", "gpu-001"), T0)).repeated_alerts == 1
        assert _record(stores) == (SCHEMA_VERSION, compatible_from(SCHEMA_VERSION))
    finally:
        await first.close()
        await second.close()


@pytest.mark.parametrize("stores", ["postgres", "pgbouncer", "postgres-17"], indirect=True)
async def test_a_site_s_statement_and_lock_limits_do_not_cut_a_migration_short(stores: Stores) -> None:
    """The database bounds every statement and lock wait of its sessions (``statement_timeout``,
    ``lock_timeout``, a common guard on an application's role; from PostgreSQL 17 the whole
    transaction's, ``transaction_timeout``), and another pitcrew holds the migration for longer
    than that: this one waits for it and opens the store. Before, the limits bounded the migration
    too, and the start failed; as would every replica's next start, for as long as a migration took
    longer than the limit (a crash loop after an upgrade)."""
    assert stores.database is not None
    database = stores.database
    limits = database.limit(200)
    with database.connect() as other, other.transaction():  # another pitcrew, migrating
        for setting in limits:
            other.execute(f"SET LOCAL {setting} = 0")
        other.execute("SELECT pg_advisory_xact_lock(%s)", (postgres._MIGRATE_LOCK,))
        opening = asyncio.create_task(stores.open())
        await asyncio.sleep(1.0)  # five times either limit
        assert not opening.done(), opening
    store = await asyncio.wait_for(opening, timeout=10)
    assert _record(stores) == (SCHEMA_VERSION, compatible_from(SCHEMA_VERSION))
    assert (await store.ingest(_delivery("fp-t", "gpu-002"), T0)).opened


async def test_a_store_a_newer_pitcrew_migrated_by_adding_is_run_on(
    stores: Stores, caplog: pytest.LogCaptureFixture
) -> None:
    store = await stores.open()
    await store.close()
    _migrated_by_a_newer_pitcrew(stores, compatible=SCHEMA_VERSION)
    with caplog.at_level(logging.WARNING, logger="pitcrew.store.schema"):
        store = await stores.open()
    assert any(
        "newer than this pitcrew" in r.getMessage() and getattr(r, "schema_version", None) == NEXT
        for r in caplog.records
    ), caplog.text
    opened = (await store.ingest(_delivery("fp-n", "gpu-002"), T0)).opened
    assert [i[0] for i in await store.active()] == opened
    incident = await store.incident(opened[0])  # read whole, the new column beside
    assert incident is not None and incident.node == "gpu-002"
    await store.close()
    assert _record(stores) == (NEXT, SCHEMA_VERSION)  # neither migrated back nor re-recorded
    # What the newer pitcrew added is there, untouched: the incident's new column left null.
    assert stores.sql("SELECT future_note FROM incidents") == [(None,)]


@pytest.mark.parametrize(
    ("compatible", "why"),
    [
        (NEXT, f"migration {NEXT} changed what this pitcrew would read or write"),
        (None, "no record of which pitcrew may run on it"),
    ],
    ids=["breaking", "unrecorded"],
)
async def test_a_store_a_newer_pitcrew_migrated_past_this_one_is_refused(
    stores: Stores, compatible: int | None, why: str
) -> None:
    store = await stores.open()
    await store.close()
    _migrated_by_a_newer_pitcrew(stores, compatible=compatible)
    with pytest.raises(
        NewerSchema, match=f"has schema {NEXT}, newer than this pitcrew \\({SCHEMA_VERSION}\\)"
    ) as refused:
        await stores.make().open()
    assert why in str(refused.value)
    assert _record(stores) == (NEXT, compatible)


async def test_a_store_from_before_the_record_gets_it_at_the_next_start(stores: Stores) -> None:
    store = await stores.open()
    opened = (await store.ingest(_delivery("fp-b", "gpu-003"), T0)).opened
    await store.close()
    if isinstance(store, SqliteStore):
        stores.sql("DROP TABLE pitcrew_schema")
    else:
        stores.sql("ALTER TABLE pitcrew_schema DROP COLUMN compatible_from")
    store = await stores.open()
    assert [i[0] for i in await store.active()] == opened
    assert _record(stores) == (SCHEMA_VERSION, compatible_from(SCHEMA_VERSION))


def _left_at_release_4(stores: Stores) -> None:
    """The store as a pitcrew of schema 4 left it (Postgres): migrations 5 (indexes on incidents,
    then on the outbox), 6 (a table), 7 (a column of the audit log, its guard), 8 (the checks'
    function) and 9 (indexes on incidents and events) not applied yet."""
    stores.sql(
        *before_guarded_indexes(),
        *before_check_function(sqlite=False),
        "DROP INDEX incidents_closed",
        "DROP INDEX outbox_incident",
        "DROP TABLE watch_memory",
        *before_audit_column(sqlite=False),
        f"UPDATE pitcrew_schema SET version = 4, compatible_from = {compatible_from(4)}",  # noqa: S608 - an int
    )


async def _waiting_for_a_lock(database: PostgresDatabase, within: float = 10.0) -> None:
    """Until a session of the store waits for a lock (polled every 20 ms; a fixed 0.5 s could end,
    on a loaded machine, before the migration had got that far)."""
    with database.connect() as watch:

        async def waiting() -> bool:
            return bool(
                watch.execute(
                    "SELECT 1 FROM pg_stat_activity WHERE datname = current_database()"
                    " AND application_name = 'pitcrew' AND wait_event_type = 'Lock'"
                ).fetchall()
            )

        await eventually(
            waiting, timeout=within, what="a session of the store waiting for a lock", interval=0.02
        )


@pytest.mark.parametrize("stores", ["postgres"], indirect=True)
@pytest.mark.parametrize("older", ["writing", "pruning"])
async def test_a_migration_beside_an_older_replica_at_work_never_fails_the_start(
    stores: Stores, older: str
) -> None:
    """A rolling update: the new pod migrates while the replica of the last release goes on
    writing, an outbox row then its incident, in one transaction. The migration's first index
    locked the incidents against writes and waited for the outbox; the replica then waited for the
    incidents: a deadlock, which Postgres ends after a second by failing one of the two, the
    migration (the start tried again after its backoff, an error in the server's log) or the
    replica's write (a webhook answered 503, a step retried). Now the migration first takes the
    write lock every write of every replica takes (``writing``): it waits for the replica's
    transaction, or that one for it, and neither fails. A transaction that takes no write lock
    (retention's prunes, ``pruning``) may still meet it in a deadlock: the migration, rolled back
    whole, is then the store unavailable, and the start tries again."""
    assert stores.database is not None
    store = await stores.open()
    await store.close()
    _left_at_release_4(stores)
    with stores.database.connect() as other:
        other.execute("BEGIN; SET LOCAL deadlock_timeout = '5s'")  # the migration is the one to check
        if older == "writing":
            other.execute("SELECT pg_advisory_xact_lock(%s)", (postgres._WRITE_LOCK,))
        other.execute("UPDATE outbox SET attempts = attempts WHERE id = -1")
        opening = asyncio.create_task(stores.open())
        await _waiting_for_a_lock(stores.database)  # the migration: for the write lock, or for the outbox
        assert not opening.done(), opening
        await asyncio.to_thread(other.execute, "UPDATE incidents SET state = state WHERE id = 'none'")
        other.execute("COMMIT")
        if older == "writing":
            store = await asyncio.wait_for(opening, timeout=10)
        else:
            with pytest.raises(StoreUnavailable, match="deadlock"):
                await asyncio.wait_for(opening, timeout=10)
            store = await stores.open()  # as the start tries again
    assert _record(stores) == (SCHEMA_VERSION, compatible_from(SCHEMA_VERSION))
    assert (await store.ingest(_delivery("fp-m", "gpu-004"), T0)).opened
