"""A batch of writes in one transaction, each alone when it fails (``bot.store.batch``), the rule of
SQLite's writer and Postgres's group commit, run here against real SQLite transactions.

Cases: a batch where one item fails → the others commit, the failing one gets its own error (and
only the rolled-back batch's work is undone); one item failing alone is not run again; a failure of
the database itself fails the whole batch, and met by one item alone it fails the items not yet
run without running them, while those already committed keep their results. With the callers'
futures, a batch that commits whole is answered from its run (the committing thread, in the stores)
at the loop's next turn, before ``commit_batch`` returns; items run alone are never answered from
their runs: ``commit_batch``'s caller answers them from the outcomes.
"""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import Sequence
from typing import Any

import pytest

from bot.store.base import StoreUnavailable
from bot.store.batch import Answer, commit_batch


class Table:
    """Rows of one SQLite table, each item one row, a batch one transaction; every run recorded."""

    def __init__(self, *, down_at: str | None = None) -> None:
        self.db = sqlite3.connect(":memory:", isolation_level=None)
        self.db.execute("CREATE TABLE t (name TEXT PRIMARY KEY CHECK (name NOT LIKE 'bad%'))")
        self.runs: list[list[str]] = []
        self.answered: list[list[str]] = []  # the runs given an ``Answer``
        self.down_at = down_at  # the database fails once a transaction reaches this item

    async def run(self, items: Sequence[str], answer: Answer | None = None) -> list[str]:
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
        results = [f"stored {item}" for item in items]
        if answer is not None:
            self.answered.append(list(items))
            answer(results)
        return results

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


def _futures(n: int) -> list[asyncio.Future[Any]]:
    loop = asyncio.get_running_loop()
    return [loop.create_future() for _ in range(n)]


async def test_a_batch_that_commits_whole_is_answered_from_its_run() -> None:
    table, futures = Table(), _futures(2)
    assert await commit_batch(["a", "b"], table.run, futures) == ["stored a", "stored b"]
    assert table.answered == [["a", "b"]]
    await asyncio.sleep(0)  # the loop's next turn
    assert [f.result() for f in futures] == ["stored a", "stored b"]


async def test_items_run_alone_are_left_to_the_caller_to_answer() -> None:
    table, futures = Table(), _futures(3)
    outcomes = await commit_batch(["a", "bad", "c"], table.run, futures)
    assert table.runs == [["a", "bad", "c"], ["a"], ["bad"], ["c"]] and table.answered == []
    await asyncio.sleep(0)
    assert not any(f.done() for f in futures)
    assert outcomes[0] == "stored a" and isinstance(outcomes[1], sqlite3.IntegrityError)


async def test_a_caller_gone_before_the_answer_is_skipped() -> None:
    table, futures = Table(), _futures(2)
    futures[0].cancel()  # a client hung up
    await commit_batch(["a", "b"], table.run, futures)
    await asyncio.sleep(0)
    assert futures[0].cancelled() and futures[1].result() == "stored b"
