"""The one SQL of both stores, rendered per dialect (``bot.store.sql``).

Cases, table-driven: placeholders, list parameters, one or several (expanded on SQLite, ``= ANY`` on Postgres),
the dialect words and the ``%`` psycopg would read as a placeholder; an unknown word fails
instead of reaching a database; every migration renders to SQL SQLite itself accepts; an
operation is driven to its result with each answer sent back in order.
"""

from __future__ import annotations

import sqlite3
from typing import Any

import pytest

from bot.domain.incident import TERMINAL
from bot.store.schema import MIGRATIONS, SCHEMA_VERSION, migrations
from bot.store.sql import (
    POSTGRES,
    SQLITE,
    TERMINAL_STATES,
    Op,
    Stmt,
    many,
    one,
    put,
    rows,
    run,
    run_sync,
    single,
    together,
)


@pytest.mark.parametrize(
    ("neutral", "params", "sqlite", "sqlite_params", "postgres", "postgres_params"),
    [
        ("SELECT * FROM t WHERE a = ? AND b = ?", (1, 2), "SELECT * FROM t WHERE a = ? AND b = ?", (1, 2),
         "SELECT * FROM t WHERE a = %s AND b = %s", (1, 2)),
        ("SELECT * FROM t WHERE a = ? AND b IN (?*) AND c = ?", (1, ["x", "y", "z"], 3),
         "SELECT * FROM t WHERE a = ? AND b IN (?,?,?) AND c = ?", [1, "x", "y", "z", 3],
         "SELECT * FROM t WHERE a = %s AND b = ANY(%s) AND c = %s", (1, ["x", "y", "z"], 3)),
        ("SELECT a FROM t WHERE a IN (?*) AND b = ? UNION ALL SELECT c FROM u WHERE c IN (?*)",
         (["x", "y"], 2, ["z"]),
         "SELECT a FROM t WHERE a IN (?,?) AND b = ? UNION ALL SELECT c FROM u WHERE c IN (?)",
         ["x", "y", 2, "z"],
         "SELECT a FROM t WHERE a = ANY(%s) AND b = %s UNION ALL SELECT c FROM u WHERE c = ANY(%s)",
         (["x", "y"], 2, ["z"])),
        ("UPDATE t SET x = {greatest}(x, ?)", ("v",), "UPDATE t SET x = MAX(x, ?)", ("v",),
         "UPDATE t SET x = GREATEST(x, %s)", ("v",)),
        ("SELECT 1 FROM t WHERE k LIKE '%:a' {for_share}", (), "SELECT 1 FROM t WHERE k LIKE '%:a' ", (),
         "SELECT 1 FROM t WHERE k LIKE '%%:a' FOR SHARE", ()),
        ("SELECT state NOT IN {terminal}, '{}' FROM t", (),
         "SELECT state NOT IN ('resolved','failed','rolled_back','suppressed'), '{}' FROM t", (),
         "SELECT state NOT IN ('resolved','failed','rolled_back','suppressed'), '{}' FROM t", ()),
    ],
)  # fmt: skip
def test_one_statement_in_both_dialects(
    neutral: str,
    params: tuple[object, ...],
    sqlite: str,
    sqlite_params: object,
    postgres: str,
    postgres_params: object,
) -> None:
    assert SQLITE.bind(neutral, params) == (sqlite, sqlite_params)
    assert POSTGRES.bind(neutral, params) == (postgres, postgres_params)


def test_an_unknown_word_fails_before_any_database_sees_it() -> None:
    with pytest.raises(KeyError, match="gretest"):
        SQLITE.render("SELECT {gretest}(a, b) FROM t")
    with pytest.raises(KeyError, match="gretest"):
        POSTGRES.script("SELECT {gretest}(a, b) FROM t")


def test_every_migration_renders_and_sqlite_runs_them_in_order() -> None:
    assert len(MIGRATIONS) == SCHEMA_VERSION
    assert all("{" not in m.replace("'{}'", "") for m in migrations(POSTGRES))
    db = sqlite3.connect(":memory:")
    for script in migrations(SQLITE):
        db.executescript(script)
    names = {r[0] for r in db.execute("SELECT name FROM sqlite_master")}
    assert {"incidents", "alerts", "events", "outbox", "leadership", "incidents_closed"} <= names


def test_an_operation_is_driven_to_its_result() -> None:
    db = sqlite3.connect(":memory:")
    db.execute("CREATE TABLE t (k TEXT PRIMARY KEY, n INTEGER)")

    def op() -> Op[tuple[int, list[str], int | None]]:
        changed = yield run("INSERT INTO t (k, n) VALUES (?, ?), (?, ?)", ("a", 1, "b", 2))
        found = yield rows("SELECT k FROM t WHERE k IN (?*) ORDER BY k", [["a", "b", "c"]])
        missing = yield one("SELECT n FROM t WHERE k = ?", ("z",))
        return changed, [r["k"] for r in found], missing

    assert run_sync(db, op()).result == (2, ["a", "b"], None)


def test_an_operation_s_last_statement_ends_it() -> None:
    """``single``'s statement is the operation's last (Postgres commits with it): its answer is the
    operation's result, and an operation that goes on after a last statement fails before the
    statement after it runs. ``put``: a statement whose answer is not read."""
    db = sqlite3.connect(":memory:")
    db.execute("CREATE TABLE t (k TEXT PRIMARY KEY, n INTEGER)")

    def op() -> Op[int]:
        yield put("INSERT INTO t (k, n) VALUES (?, ?)", ("a", 1))
        return int((yield from single(run("UPDATE t SET n = n + 1 WHERE k IN (?*)", [["a", "b"]]))))

    assert run_sync(db, op()).result == 1

    def beyond() -> Op[None]:
        yield from single(run("UPDATE t SET n = n + 1"))
        yield run("UPDATE t SET n = 100")

    with pytest.raises(RuntimeError, match="after the operation's last one: UPDATE t SET n = 100"):
        run_sync(db, beyond())
    assert db.execute("SELECT n FROM t").fetchall() == [(3,)]


def test_operations_together_each_get_their_answers_in_one_transaction() -> None:
    """``together`` (the engine's writes grouped on Postgres): each operation runs after the one
    before it, sees its writes and gets its own answers and result, with whether it routed an
    event; an earlier operation's last statement is one no more (more follows it) but goes
    ``later`` (answered with a ``Later``, which holds its answer: SQLite's at once), the last
    operation's stays so (Postgres commits with it)."""
    db = sqlite3.connect(":memory:")
    db.execute("CREATE TABLE t (k TEXT PRIMARY KEY, n INTEGER)")
    seen: list[Stmt] = []

    def insert(key: str, n: int) -> Op[int]:
        return int((yield from single(run("INSERT INTO t (k, n) VALUES (?, ?)", (key, n)))))

    def total() -> Op[int]:
        yield many("INSERT INTO t (k, n) VALUES (?, ?)", [("c", 3)], wakes=True)
        found = yield one("SELECT sum(n) AS s FROM t")
        return int(found["s"])

    def watched(op: Op[Any]) -> Op[Any]:
        answer = None
        while True:
            try:
                stmt = op.send(answer)
            except StopIteration as done:
                return done.value
            seen.append(stmt)
            answer = yield stmt

    grouped = together([insert("a", 1), total(), insert("b", 2)])
    assert run_sync(db, watched(grouped)).result == [(1, False), (4, True), (1, False)]
    assert [stmt.last for stmt in seen] == [False, False, False, True]
    assert [stmt.later for stmt in seen] == [True, False, False, False]
    assert db.execute("SELECT k, n FROM t ORDER BY k").fetchall() == [("a", 1), ("b", 2), ("c", 3)]


def test_an_earlier_operation_that_yields_after_its_last_statement_fails() -> None:
    """An operation's last statement ends it (``Driving`` refuses a statement after it): in a group
    too, where an earlier operation's last statement is answered later (``together``)."""
    db = sqlite3.connect(":memory:")
    db.execute("CREATE TABLE t (k TEXT PRIMARY KEY, n INTEGER)")

    def beyond() -> Op[None]:
        yield from single(run("INSERT INTO t (k, n) VALUES ('a', 1)"))
        yield run("INSERT INTO t (k, n) VALUES ('b', 2)")

    def insert() -> Op[None]:
        yield many("INSERT INTO t (k, n) VALUES (?, ?)", [("c", 3)])

    with pytest.raises(RuntimeError, match="after the operation's last one"):
        run_sync(db, together([beyond(), insert()]))


def test_the_stores_terminal_states_are_the_incidents() -> None:
    """The schema's words for the terminal states (``{terminal}``: the one active incident per node
    is a partial index over them, written in a migration, so the words are fixed there) are the
    domain's ``TERMINAL``: a state made terminal in one and not the other fails here, and needs a
    migration of that index."""
    words = {word.strip("'") for word in TERMINAL_STATES.strip("()").split(",")}
    assert words == {state.value for state in TERMINAL}
