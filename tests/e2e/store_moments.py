"""Catching a pitcrew replica at one moment of its work, through the database it shares.

The test holds a table pitcrew is about to write or read (``LOCK TABLE``), only then sends the
alert that starts the work, and watches ``pg_stat_activity`` until the replica's statement waits
for the table at the right moment (a step's intent committed, the next step not begun); then it
acts on the replica (SIGSTOP, SIGKILL, cut its link to the store) and lets the statement go. The
connections are the test's own, over loopback, which a partition test never cuts.
"""

from __future__ import annotations

import contextlib
import functools
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, TypeVar

import psycopg

from tests.harness.postgres import PostgresDatabase
from tests.harness.proc import wait_until

T = TypeVar("T")


def connect(database: PostgresDatabase) -> psycopg.Connection[tuple[Any, ...]]:
    """A connection of the test's own, over loopback (never cut)."""
    return psycopg.connect(database.server.url(database.name), password=database.server.password)


def _waiting(watch: psycopg.Connection[tuple[Any, ...]], ours: tuple[int, ...]) -> list[str]:
    """The statements of other sessions than ``ours`` waiting for a lock."""
    rows = watch.execute(
        "SELECT query FROM pg_stat_activity WHERE pid != ALL(%s) AND wait_event_type = 'Lock'", (list(ours),)
    ).fetchall()
    return [str(row[0]) for row in rows]


def _queued(watch: psycopg.Connection[tuple[Any, ...]], pid: int) -> bool:
    row = watch.execute("SELECT wait_event_type FROM pg_stat_activity WHERE pid = %s", (pid,)).fetchone()
    return row is not None and row[0] == "Lock"


def steps_on(held: psycopg.Connection[tuple[Any, ...]], node: str) -> dict[str, str]:
    """Each step of the newest incident on ``node`` and its status (none before it opens)."""
    query = (
        "SELECT step, status FROM steps WHERE incident_id ="
        " (SELECT id FROM incidents WHERE node = %s ORDER BY seq DESC LIMIT 1)"
    )
    return {str(step): str(status) for step, status in held.execute(query, (node,)).fetchall()}


def intent(step: str, node: str) -> Callable[[psycopg.Connection[tuple[Any, ...]]], bool]:
    """The moment ``step``'s intent is committed (its ``steps`` row ``running``) in the incident
    on ``node``."""

    def committed(watch: psycopg.Connection[tuple[Any, ...]]) -> bool:
        return steps_on(watch, node).get(step) == "running"

    return committed


def _let_through(seen: list[tuple[bool, str]]) -> str:
    """For a failure: every statement ``catch_at`` waited for that came at the wrong moment, then
    the last five others."""
    shown = [(m, q) for m, q in seen if m] + [(m, q) for m, q in seen if not m][-5:]
    return "\n".join(f"  {'the wrong moment' if m else 'another statement'}: {q[:300]!r}" for m, q in shown)


def catch_at(
    database: PostgresDatabase,
    table: str,
    query: str,
    moment: Callable[[psycopg.Connection[tuple[Any, ...]]], bool],
    act: Callable[[], None],
    *,
    begin: Callable[[], T],
) -> T:
    """Hold ``table``, then ``begin()`` (post the alert) in a thread of its own; ``act()``
    (SIGSTOP the leader, SIGKILL it, cut its link) while its statement containing ``query`` waits
    for ``table`` and ``moment`` says it is the right one; then let the statement go: it completes
    in the server, and the leader does not see its answer yet. ``begin``'s answer.

    The table is held before the work begins: begun first, a quick leader could pass the moment
    before the test held anything (under load, opening the test's connections took longer than the
    leader's poll). A wait at another statement, or at the wrong moment, is let through without a
    gap: a second connection asks for the table before the first lets go, so it is next after that
    statement, ahead of whatever the leader sends after it. What asked for the table between the
    look and the second connection's turn in line would get it too, unseen (a step's intent
    write beside a read of the leader's pool): it is looked at again once the second connection
    is in line. ``moment`` reads on the connection holding the lock (another would wait for
    ``table`` too)."""
    lock = f"LOCK TABLE {table} IN ACCESS EXCLUSIVE MODE"
    with (
        connect(database) as watch,
        connect(database) as one,
        connect(database) as other,
        ThreadPoolExecutor(1) as asking,
        ThreadPoolExecutor(1) as beginning,
    ):
        watch.autocommit = True
        ours = (one.info.backend_pid, other.info.backend_pid)
        held, spare = one, other
        held.execute(lock)
        began = beginning.submit(begin)
        taking: Future[Any] | None = None
        deadline = time.monotonic() + 60
        seen: list[tuple[bool, str]] = []  # (``query``'s, each statement let through), for the failure

        def caught(waiting: list[str]) -> bool:
            return any(query in statement for statement in waiting) and moment(held)

        try:
            while True:
                if began.done() and began.exception() is not None:
                    began.result()  # the alert was refused: say why, not "never caught"
                assert time.monotonic() < deadline, (
                    f"never caught the leader at {query}; let through:\n{_let_through(seen)}"
                )
                wait_until(
                    lambda: bool(_waiting(watch, ours)), timeout=30, interval=0.002, what=f"{table} wanted"
                )
                if caught(_waiting(watch, ours)):
                    act()
                    break
                taking = asking.submit(spare.execute, lock)
                in_line = functools.partial(_queued, watch, spare.info.backend_pid)
                wait_until(in_line, timeout=30, interval=0.002, what="the spare in line for the table")
                # What asked for the table before the spare did gets it with the statement seen
                # above: look again (what asks from now on waits behind the spare).
                waiting = _waiting(watch, ours)
                if caught(waiting):
                    act()
                    break
                seen.extend((query in statement, statement) for statement in waiting)
                held.commit()
                taking.result(timeout=60)
                taking = None
                held, spare = spare, held
        finally:
            held.commit()
            if taking is not None:  # a hand-over cut short: stop asking
                watch.execute("SELECT pg_cancel_backend(%s)", (spare.info.backend_pid,))
                with contextlib.suppress(Exception):
                    taking.result(timeout=60)
                spare.rollback()
        return began.result(timeout=60)


def delivered(database: PostgresDatabase) -> Callable[[], bool]:
    """Whether the outbox has nothing left to deliver."""

    def done() -> bool:
        with connect(database) as conn:
            row = conn.execute("SELECT count(*) FROM outbox WHERE delivered_at IS NULL").fetchone()
        return row is not None and row[0] == 0

    return done
