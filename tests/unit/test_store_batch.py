"""A batch of writes in one transaction, each alone when it fails (``bot.store.batch``), the rule of
SQLite's writer and Postgres's group commit, run here against real SQLite transactions.

Cases: a batch where one item fails → the others commit, the failing one gets its own error (and
only the rolled-back batch's work is undone); one item failing alone is not run again; a failure of
the database itself fails the whole batch, and met by one item alone it fails the items not yet
run without running them, while those already committed keep their results.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence

import pytest

from bot.store.base import StoreUnavailable
from bot.store.batch import commit_batch


class Table:
    """Rows of one SQLite table, each item one row, a batch one transaction; every run recorded."""

    def __init__(self, *, down_at: str | None = None) -> None:
        self.db = sqlite3.connect(":memory:", isolation_level=None)
        self.db.execute("CREATE TABLE t (name TEXT PRIMARY KEY CHECK (name NOT LIKE 'bad%'))")
        self.runs: list[list[str]] = []
        self.down_at = down_at  # the database fails once a transaction reaches this item

    async def run(self, items: Sequence[str]) -> list[str]:
        self.runs.append(list(items))
        self.db.execute("BEGIN IMMEDIATE")
        try:
            for item in items:
                if item == self.down_at:
                    raise StoreUnavailable("disk I/O error")
                self.db.execute("INSERT INTO t VALUES (?)", (item,))
            self.db.execute("COMMIT")
        except BaseException:
            self.db.execute("ROLLBACK")
            raise
        return [f"stored {item}" for item in items]

    def rows(self) -> list[str]:
        return [name for (name,) in self.db.execute("SELECT name FROM t ORDER BY name")]


async def test_one_bad_item_fails_only_itself() -> None:
    table = Table()
    outcomes = await commit_batch(["a", "bad", "c"], table.run)
    assert outcomes[0] == "stored a" and outcomes[2] == "stored c"
    assert isinstance(outcomes[1], sqlite3.IntegrityError) and "CHECK" in str(outcomes[1])
    assert table.rows() == ["a", "c"]
    assert table.runs == [["a", "bad", "c"], ["a"], ["bad"], ["c"]]


async def test_a_batch_that_commits_is_run_once() -> None:
    table = Table()
    assert await commit_batch(["a", "b"], table.run) == ["stored a", "stored b"]
    assert table.runs == [["a", "b"]]


async def test_a_single_item_that_fails_is_not_run_again() -> None:
    table = Table()
    [outcome] = await commit_batch(["bad"], table.run)
    assert isinstance(outcome, sqlite3.IntegrityError)
    assert table.runs == [["bad"]] and table.rows() == []


async def test_the_database_failing_fails_the_whole_batch_without_running_each_alone() -> None:
    table = Table(down_at="a")
    outcomes = await commit_batch(["a", "b", "c"], table.run)
    assert [type(o) for o in outcomes] == [StoreUnavailable] * 3
    assert table.runs == [["a", "b", "c"]] and table.rows() == []


@pytest.mark.parametrize("order", [["a", "bad", "c", "d"], ["bad", "a", "c", "d"]])
async def test_the_database_failing_while_each_runs_alone_fails_the_rest(order: list[str]) -> None:
    table = Table(down_at="c")
    outcomes = await commit_batch(order, table.run)
    before = order.index("c")
    assert [type(o) for o in outcomes[before:]] == [StoreUnavailable, StoreUnavailable]
    assert outcomes[order.index("a")] == "stored a"
    assert isinstance(outcomes[order.index("bad")], sqlite3.IntegrityError)
    assert table.runs == [order, *[[item] for item in order[: before + 1]]]  # "d" never ran
    assert table.rows() == ["a"]
