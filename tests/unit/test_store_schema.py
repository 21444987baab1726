"""Which pitcrew runs on which store schema (``bot.store.schema``): the rule, and the migrations
held to it.

A pitcrew runs on a store a newer one migrated unless a migration since its own schema is listed
``BREAKING``; so every migration not listed must only add: a table, an index, a column that may be
null or has a default. ``changes`` reads a migration's statements and names each that does more
(drops, renames, retypes, rewrites rows, constrains a table an earlier migration made), and every
migration of ``MIGRATIONS`` not in ``BREAKING`` must have none; the cases below show it names
each kind.
"""

from __future__ import annotations

import re

import pytest

from bot.store.schema import BREAKING, MIGRATIONS, SCHEMA_VERSION, NewerSchema, compatible_from, standing


@pytest.mark.parametrize(
    ("version", "breaking", "expected"),
    [
        (6, set(), 0),
        (2, {3}, 0),
        (3, {3}, 3),
        (5, {3}, 3),
        (6, {3, 5}, 5),
        (4, {3, 5}, 3),
    ],
)
def test_the_earliest_schema_a_pitcrew_may_be_written_for(
    version: int, breaking: set[int], expected: int
) -> None:
    assert compatible_from(version, breaking) == expected


@pytest.mark.parametrize(
    ("found", "compatible", "expected"),
    [
        (0, None, "older"),  # a new store
        (5, None, "older"),
        (5, 0, "older"),
        (6, None, "current"),  # a store of a pitcrew before the record
        (6, 0, "current"),
        (7, 0, "newer"),
        (7, 6, "newer"),
        (9, 4, "newer"),
    ],
)
def test_where_a_store_stands(found: int, compatible: int | None, expected: str) -> None:
    assert standing(found, compatible, "store", ours=6) == expected


@pytest.mark.parametrize(
    ("found", "compatible", "why"),
    [
        (
            7,
            7,
            "migration 7 changed what this pitcrew would read or write: run a pitcrew written for schema 7",
        ),
        (9, 8, "migration 8 changed"),
        (7, None, "no record of which pitcrew may run on it"),
    ],
)
def test_a_newer_store_this_pitcrew_must_not_run_on(found: int, compatible: int | None, why: str) -> None:
    with pytest.raises(
        NewerSchema, match=f"store has schema {found}, newer than this pitcrew \\(6\\)"
    ) as refused:
        standing(found, compatible, "store", ours=6)
    assert why in str(refused.value)


_TABLE = re.compile(r"^CREATE TABLE (?:IF NOT EXISTS )?(\w+)", re.IGNORECASE)
_INDEX = re.compile(r"^CREATE (UNIQUE )?INDEX (?:IF NOT EXISTS )?\w+ ON (\w+)", re.IGNORECASE)
_ADD_COLUMN = re.compile(
    r"^ALTER TABLE (\w+) ADD (?:COLUMN )?(?:IF NOT EXISTS )?\w+ (.*)$", re.IGNORECASE | re.DOTALL
)
#: A dialect's words that stand for statements (``bot.store.sql.Dialect.script``), and the table
#: each constrains: the audit log's append-only triggers.
_CONSTRAINING_WORDS = {"{append_only_events}": "events"}
#: Words that replace a table's guard with one that refuses less, and only what no earlier pitcrew
#: does: ``events`` refuses deletes but of what retention lets go, and no earlier pitcrew deletes
#: an event.
_RELAXING_WORDS = {"{events_prunable}": "events"}
#: Words that only add what no earlier pitcrew uses: the function a Postgres check calls.
_ADDING_WORDS = {"{check_function}"}


def changes(migration: str, tables: set[str]) -> list[str]:
    """The statements of ``migration`` that do more than add, given the ``tables`` the migrations
    before it made (and adding the ones it makes)."""
    made: set[str] = set()
    found = []
    text = "\n".join(line.split("--", 1)[0] for line in migration.splitlines())
    for statement in (" ".join(s.split()) for s in text.split(";")):
        if not statement:
            continue
        if table := _TABLE.match(statement):
            made.add(table.group(1))
            continue
        if index := _INDEX.match(statement):
            if index.group(1) and index.group(2) not in made:
                found.append(statement)  # rows an earlier pitcrew writes may be refused
            continue
        if column := _ADD_COLUMN.match(statement):
            spec = column.group(2).upper()
            if "NOT NULL" in spec and "DEFAULT" not in spec:
                found.append(statement)  # an earlier pitcrew's inserts leave it empty, and fail
            continue
        if statement in _CONSTRAINING_WORDS and _CONSTRAINING_WORDS[statement] in made:
            continue
        if statement in _RELAXING_WORDS and _RELAXING_WORDS[statement] in tables | made:
            continue
        if statement in _ADDING_WORDS:
            continue
        found.append(statement)  # drops, renames, retypes, rewrites rows, triggers on old tables
    tables |= made
    return found


@pytest.mark.parametrize(
    "statement",
    [
        "DROP TABLE switches",
        "DROP INDEX incidents_state",
        "ALTER TABLE incidents DROP COLUMN group_key",
        "ALTER TABLE incidents RENAME COLUMN outcome TO result",
        "ALTER TABLE incidents RENAME TO cases",
        "ALTER TABLE incidents ALTER COLUMN seq TYPE TEXT",
        "ALTER TABLE incidents ADD COLUMN owner TEXT NOT NULL",
        "CREATE UNIQUE INDEX incidents_one_per_group ON incidents(group_key)",
        "UPDATE incidents SET state = 'held' WHERE state = 'guarded'",
        "DELETE FROM outbox",
        "{append_only_events}",
        "CREATE TRIGGER incidents_frozen BEFORE UPDATE ON incidents BEGIN SELECT 1; END",
    ],
)
def test_what_does_more_than_add_is_named(statement: str) -> None:
    tables = {"incidents", "switches", "outbox", "events"}
    found = changes(f"-- a later migration\n{statement};\n", tables)
    assert found and statement.startswith(found[0]), found


def test_what_only_adds_is_not_named() -> None:
    tables = {"incidents"}
    migration = """
        CREATE TABLE spares (node TEXT PRIMARY KEY, held_by TEXT);  -- a table
        CREATE UNIQUE INDEX spares_held ON spares(held_by);
        CREATE INDEX incidents_group ON incidents(group_key);
        ALTER TABLE incidents ADD COLUMN spare TEXT;
        ALTER TABLE incidents ADD COLUMN tries INTEGER NOT NULL DEFAULT 0;
    """
    assert changes(migration, tables) == []
    assert tables == {"incidents", "spares"}


def test_every_migration_not_listed_as_breaking_only_adds() -> None:
    assert all(1 <= number <= SCHEMA_VERSION for number in BREAKING)
    tables: set[str] = set()
    for number, migration in enumerate(MIGRATIONS, start=1):
        found = changes(migration, tables)
        if number not in BREAKING:
            assert found == [], f"migration {number} does more than add; list it in BREAKING: {found}"
    assert {"incidents", "alerts", "events", "outbox", "leadership", "watch_memory"} <= tables
