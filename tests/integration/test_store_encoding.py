"""The Postgres store and text encodings, on a real PostgreSQL.

Everything pitcrew stores may be any Unicode text: alert labels and annotations, the reasons and
errors the far sides answer with (Slurm, Kubernetes, Slack), people's names. A database is created
in the encoding of its template or of the locale ``initdb`` ran in: ``SQL_ASCII`` in a C or POSIX
locale (a container without ``LANG``), ``LATIN1`` on an old install. There the store broke only
later, at work: on ``SQL_ASCII`` psycopg passes text as bytes and the first read of the incidents
failed ("operator does not exist: text = bytea"); on ``LATIN1`` the first event carrying a
character outside Latin-1 failed to be written, mid-incident. Such a database is now refused
before anything is created in it, with one line saying what to do, and ``check-config --live``
names it. And whatever client encoding a site gives its roles (``ALTER ROLE ... SET
client_encoding``, ``PGCLIENTENCODING``), the store's sessions speak UTF-8.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from bot.cli import main
from bot.store.base import NewEvent, StoreRefused
from bot.store.postgres import PostgresStore
from proving_ground.postgres import PostgresServer
from tests.harness.postgres import PostgresDatabase
from tests.integration.test_store_contract import T0, _alert, _delivery

UNICODE = "Slurm: ジョブ 4242 ✗ requeued by José"


@pytest.fixture(params=["SQL_ASCII", "LATIN1"])
def other_encoding(
    request: pytest.FixtureRequest, postgres_server: PostgresServer, tmp_path: Path
) -> Iterator[PostgresDatabase]:
    """A fresh database in an encoding other than UTF8, as ``initdb`` in a C locale or an old
    install makes them."""
    name = postgres_server.create_database(encoding=request.param)
    try:
        yield PostgresDatabase(
            postgres_server.url(name),
            postgres_server.password_file(tmp_path / "postgres-password"),
            name,
            postgres_server,
        )
    finally:
        postgres_server.drop_database(name)


def _tables(database: PostgresDatabase) -> list[str]:
    with database.connect() as conn:
        return [r[0] for r in conn.execute("SELECT tablename FROM pg_tables WHERE schemaname = 'public'")]


async def test_a_database_not_in_utf8_is_refused_and_nothing_is_created(
    other_encoding: PostgresDatabase,
) -> None:
    store = PostgresStore(other_encoding.url, password_file=other_encoding.password_file)
    with pytest.raises(StoreRefused) as refused:
        await store.open()
    said = str(refused.value)
    assert f"/{other_encoding.name}" in said and "encoding" in said and "UTF8" in said, said
    assert "password" not in said
    assert _tables(other_encoding) == []
    await store.close()  # nothing left open


async def test_check_config_names_a_database_not_in_utf8(other_encoding: PostgresDatabase) -> None:
    seen = await PostgresStore(other_encoding.url, password_file=other_encoding.password_file).inspect()
    assert not seen.ok
    assert any("UTF8" in missing for missing in seen.missing), seen
    assert "encoding" in seen.detail, seen
    assert _tables(other_encoding) == []


def test_pitcrew_stops_with_one_line_on_a_database_not_in_utf8(
    other_encoding: PostgresDatabase, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("PITCREW_STORE__URL", other_encoding.url)
    monkeypatch.setenv("PITCREW_STORE__PASSWORD_FILE", str(other_encoding.password_file))
    assert main(["incidents"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("pitcrew: ") and "UTF8" in err, err
    assert "Traceback" not in err


async def test_a_role_given_another_client_encoding_still_stores_any_text(
    postgres_db: PostgresDatabase,
) -> None:
    with postgres_db.store_role("pitcrew_latin", "latin-secret") as (url, password):
        with postgres_db.connect() as conn:
            conn.execute("ALTER ROLE pitcrew_latin SET client_encoding = 'LATIN1'")
        store = PostgresStore(url, password_file=password)
        await store.open()
        try:
            alert = replace(_alert("fp1", "gpu-001"), labels={"node": "gpu-001", "team": "機械学習"})
            opened = await store.ingest(_delivery(alert), T0)
            incident = opened.opened[0]
            await store.record(incident, NewEvent("note", detail=UNICODE, actor="cli:田中"), T0)
            events = await store.events_of(incident)
            assert [(e.detail, e.actor) for e in events if e.kind == "note"] == [(UNICODE, "cli:田中")]
            (stored,) = await store.alerts_of(incident)
            assert stored.labels["team"] == "機械学習"
        finally:
            await store.close()
