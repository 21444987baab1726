"""What ``check-config --live`` says of the store (``inspect``), on both stores: the store is never
opened by it, and nothing is created, migrated or written.

Cases: a new store (no tables yet: pitcrew creates them at start) stays untouched; an open store
is its schema, and on Postgres the server's version, its replication and who leads; a store of an
older schema is to be migrated; one this pitcrew may not run on fails, naming what is missing. On
Postgres, a role that may not create pitcrew's tables, or may not use them once they are there, is
named with the privilege it lacks; such a role stops the start with one line, and one that may use
the tables a DBA made but not create any opens the store. (A standby, and asynchronous and synchronous replication, are
in ``test_store_failover.py``; the line ``check-config --live`` prints, in
``test_check_config_live.py``.)
"""

from __future__ import annotations

import asyncio
import re
import secrets
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path

import pytest

from bot.cli import main
from bot.store.base import StoreRefused
from bot.store.postgres import PostgresStore
from bot.store.schema import SCHEMA_VERSION, TABLES
from bot.store.sqlite import SqliteStore
from tests.harness.postgres import PostgresDatabase
from tests.harness.stores import AnyStore, Stores
from tests.integration.test_store_contract import T0, _alert, _delivery


def _tables(stores: Stores, store: AnyStore) -> list[str]:
    """The tables in the store's database, from a session of the test's own."""
    if isinstance(store, SqliteStore):
        if not store.path.exists():  # looking must not make it
            return []
        rows = stores.sql("SELECT name FROM sqlite_master WHERE type = 'table'")
    else:
        rows = stores.sql("SELECT tablename FROM pg_tables WHERE schemaname = 'public'")
    return [str(r[0]) for r in rows]


def _set_version(stores: Stores, store: AnyStore, version: int) -> None:
    if isinstance(store, SqliteStore):
        stores.sql(f"PRAGMA user_version = {version}")
    else:
        stores.sql(f"UPDATE pitcrew_schema SET version = {version}")  # noqa: S608 - an int


async def test_a_new_store_is_to_be_created_and_inspecting_it_creates_nothing(stores: Stores) -> None:
    store = stores.make()
    seen = await store.inspect()
    assert seen.ok, seen
    assert f"no tables yet: pitcrew creates them at start (schema {SCHEMA_VERSION})" in seen.detail
    assert _tables(stores, store) == []
    if isinstance(store, SqliteStore):
        assert not store.path.exists()


async def test_an_open_store_is_inspected_as_it_is(stores: Stores) -> None:
    store = await stores.open()
    if isinstance(store, PostgresStore):
        await store.acquire_lease("replica-a", timedelta(seconds=60))
    seen = await stores.make().inspect()
    assert seen.ok, seen
    assert re.search(rf"\bschema {SCHEMA_VERSION}(;|$)", seen.detail), seen
    if isinstance(store, PostgresStore):
        assert seen.system == "postgresql"
        assert re.search(r": PostgreSQL \d+\.\d+", seen.detail), seen
        assert "no standby streams from it" in seen.detail
        assert "led by replica-a (epoch 1)" in seen.detail
        lease = await store.lease()
        assert lease is not None
        await store.release_lease("replica-a", lease.epoch)
        assert (await stores.make().inspect()).detail.endswith("nobody leads")
    else:
        assert seen.system == "sqlite"


async def test_a_store_of_an_older_schema_is_to_be_migrated(stores: Stores) -> None:
    store = await stores.open()
    await store.close()
    _set_version(stores, store, SCHEMA_VERSION - 1)
    seen = await stores.make().inspect()
    assert seen.ok, seen
    assert f"schema {SCHEMA_VERSION - 1}: pitcrew migrates it to {SCHEMA_VERSION} at start" in seen.detail


async def test_a_store_this_pitcrew_may_not_run_on_is_named(stores: Stores) -> None:
    store = await stores.open()
    await store.close()
    _set_version(stores, store, SCHEMA_VERSION + 1)
    stores.sql(f"UPDATE pitcrew_schema SET compatible_from = {SCHEMA_VERSION + 1}")  # noqa: S608 - an int
    seen = await stores.make().inspect()
    assert not seen.ok
    assert f"schema {SCHEMA_VERSION + 1}, newer than this pitcrew ({SCHEMA_VERSION})" in seen.detail
    assert seen.missing == ("a pitcrew that runs on this store's schema",)


@pytest.fixture
def limited_role(postgres_db: PostgresDatabase, tmp_path: Path) -> Iterator[tuple[str, Path]]:
    """A login role of its own, allowed nothing on the database's schema (PostgreSQL 15 grants
    PUBLIC no CREATE on ``public``): its URL and password file. Dropped afterwards."""
    name = f"limited_{postgres_db.name}"
    password = secrets.token_urlsafe(12)
    password_file = tmp_path / "limited-password"
    password_file.write_text(password + "\n")
    with postgres_db.login_role(name, password) as url:
        with postgres_db.connect() as db:
            db.execute(f"REVOKE CREATE ON SCHEMA public FROM PUBLIC, {name}")
        yield url, password_file


@pytest.mark.parametrize("stores", ["postgres"], indirect=True)
async def test_a_role_that_may_not_create_or_use_the_tables_is_named(
    stores: Stores, limited_role: tuple[str, Path]
) -> None:
    url, password_file = limited_role
    seen = await PostgresStore(url, password_file=password_file).inspect()
    assert not seen.ok
    assert seen.missing == ("CREATE on schema public, to create and migrate pitcrew's tables",), seen

    await stores.open()  # the database's owner creates them
    seen = await PostgresStore(url, password_file=password_file).inspect()
    assert not seen.ok
    assert "DELETE, INSERT, SELECT, UPDATE on incidents" in seen.missing, seen
    assert "DELETE, INSERT, SELECT on events" in seen.missing, seen  # the timeline: never updated
    assert len(seen.missing) == len(TABLES) + 1, seen.missing  # and pitcrew_schema
    assert "schema not readable by this role" in seen.detail, seen

    assert stores.database is not None
    name = url.split("//", 1)[1].split("@", 1)[0]
    with stores.database.connect() as db:
        db.execute(f"GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA public TO {name}")
        db.execute(f"REVOKE UPDATE, DELETE ON events FROM {name}")
    # Retention deletes what alerts said of pruned incidents (the database keeps the audit log):
    # a role that may not delete from the timeline would have every prune fail on it.
    seen = await PostgresStore(url, password_file=password_file).inspect()
    assert not seen.ok and seen.missing == ("DELETE on events",), seen
    with stores.database.connect() as db:
        db.execute(f"GRANT DELETE ON events TO {name}")
        db.execute("REVOKE EXECUTE ON FUNCTION pitcrew_check FROM PUBLIC")
    # A fenced write's lease check and a batch's expectation call it: every one would fail.
    seen = await PostgresStore(url, password_file=password_file).inspect()
    assert not seen.ok and seen.missing == ("EXECUTE on pitcrew_check",), seen
    with stores.database.connect() as db:
        db.execute(f"GRANT EXECUTE ON FUNCTION pitcrew_check TO {name}")
    seen = await PostgresStore(url, password_file=password_file).inspect()
    assert seen.ok, seen


@pytest.mark.parametrize("stores", ["postgres"], indirect=True)
async def test_a_role_that_may_not_create_or_use_the_tables_stops_the_start_with_one_line(
    stores: Stores,
    limited_role: tuple[str, Path],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The set-up most likely to go wrong: a role given the database but not its schema, where
    PostgreSQL 15 lets only the database's owner create. The start stopped with psycopg's
    traceback, at every restart of the pod; now with one line saying what to grant. Trying again
    would not help, so the start does not wait for it (``StoreRefused``)."""
    url, password_file = limited_role
    with pytest.raises(StoreRefused) as refused:
        await PostgresStore(url, password_file=password_file).open()
    said = str(refused.value)
    assert "permission denied for schema public" in said and "CREATE" in said, said
    assert "check-config --live" in said, said

    monkeypatch.setenv("PITCREW_STORE__URL", url)
    monkeypatch.setenv("PITCREW_STORE__PASSWORD_FILE", str(password_file))
    assert await asyncio.to_thread(main, ["incidents"]) == 1  # the CLI runs a loop of its own
    err = capsys.readouterr().err
    assert err.startswith("pitcrew: ") and "permission denied for schema public" in err, err
    assert "Traceback" not in err and err.count("\n") == 1, err

    await stores.open()  # the database's owner creates the tables; the role may not use them
    with pytest.raises(StoreRefused, match="permission denied for table pitcrew_schema"):
        await PostgresStore(url, password_file=password_file).open()


@pytest.mark.parametrize("stores", ["postgres"], indirect=True)
async def test_a_role_that_may_use_the_tables_but_not_create_opens_a_current_store(
    stores: Stores, limited_role: tuple[str, Path]
) -> None:
    """A site's DBA made the tables (or took CREATE away once they were there): check-config
    --live said the role may run pitcrew, and the start failed all the same, at every restart:
    ``CREATE TABLE IF NOT EXISTS`` asks for CREATE on the schema even when the table is there.
    Nothing is created on a store whose tables are there."""
    url, password_file = limited_role
    await stores.open()
    assert stores.database is not None
    name = url.split("//", 1)[1].split("@", 1)[0]
    with stores.database.connect() as db:
        db.execute(f"GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA public TO {name}")
        db.execute(f"REVOKE UPDATE ON events FROM {name}")
    assert (await PostgresStore(url, password_file=password_file).inspect()).ok
    store = PostgresStore(url, password_file=password_file)
    await store.open()
    try:
        assert (await store.ingest(_delivery(_alert("fp-dba", "gpu-009")), T0)).opened
    finally:
        await store.close()


@pytest.mark.parametrize("stores", ["postgres"], indirect=True)
async def test_a_password_file_that_cannot_be_read_is_named(stores: Stores, tmp_path: Path) -> None:
    assert stores.database is not None
    gone = tmp_path / "no-such-secret"
    seen = await PostgresStore(stores.database.url, password_file=gone).inspect()
    assert not seen.ok
    assert seen.missing == (f"the password file {gone}",), seen


@pytest.mark.parametrize("stores", ["sqlite"], indirect=True)
async def test_a_sqlite_store_this_user_may_not_write_is_named(
    stores: Stores, immutable: Callable[..., None], tmp_path: Path
) -> None:
    """Read-only even for root (``chattr +i``): the file, or the folder it would be made in (its
    WAL beside it, or the folders down to it)."""
    store = await stores.open()
    await store.close()
    assert isinstance(store, SqliteStore)
    immutable(store.path)
    seen = await stores.make().inspect()
    assert not seen.ok and seen.missing == (f"write access to {store.path}",), seen
    immutable(store.path, on=False)
    immutable(store.path.parent)
    seen = await stores.make().inspect()
    assert not seen.ok and seen.missing == (f"write access to {store.path.parent}",), seen
    deeper = store.path.parent / "state" / "pitcrew" / "pitcrew.db"  # folders made at start
    seen = await SqliteStore(deeper).inspect()
    assert not seen.ok and seen.missing == (f"write access to {store.path.parent}",), seen
    immutable(store.path.parent, on=False)
    seen = await SqliteStore(deeper).inspect()
    assert seen.ok and "no tables yet" in seen.detail, seen
