"""One SQL for both stores: statements are written once, and the dialect is applied here only.

Every query of the store (``schema``, ``reads``, ``writes``, ``ingest``, ``outbox``,
``retention``) is written once, in a neutral form:

* ``?`` for each parameter (Postgres gets ``%s``);
* ``IN (?*)`` for a list parameter (SQLite gets one ``?`` per element, Postgres ``= ANY(%s)``);
* ``{word}`` for the few things the two databases spell differently: ``Dialect.words`` lists
  them all (identity columns, ``GREATEST``/``MAX``, the append-only trigger, the lease's clock
  and its interval arithmetic, the row lock a fenced write takes, the index SQLite must be told
  to use, the seq of the event just inserted). An unknown word fails.

An operation of several statements is a generator (``Op``): it yields each ``Stmt`` and is sent
the answer (a row count, a row, the rows), so what to read and write is decided once, and each
store drives the same operation over its own connection — SQLite in its writer or reader thread
(``run_sync`` below), Postgres on its asyncio connection (``bot.store.postgres``). No ORM: the
SQL stays what both databases run, readable as it is.
"""

from __future__ import annotations

import re
import sqlite3
from collections.abc import Callable, Generator, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any, Generic, Literal, TypeVar, cast

T = TypeVar("T")
U = TypeVar("U")

Kind = Literal["run", "many", "one", "all", "check"]


@dataclass(frozen=True, slots=True)
class Stmt:
    """One statement in the neutral form, its parameters, and what the operation wants back:
    ``run`` the row count, ``many`` (parameters are rows) nothing, ``one`` a row or ``None``,
    ``all`` the rows, ``check`` nothing (``check``). ``wakes``: an outbox row routed from a timeline event (``Store.route_events``);
    the store wakes the outbox sender once the transaction holding it has committed."""

    sql: str
    params: Sequence[Any] = ()
    kind: Kind = "run"
    wakes: bool = False
    #: ``many`` only: the same change as one statement over the rows, one JSON array of them its
    #: parameter (``?``), which Postgres runs instead of a statement a row (``bot.store.postgres``).
    bulk: str | None = None
    #: ``check`` only: the exception raised, and the transaction rolled back, if it finds no row.
    refuse: Callable[[], Exception] | None = None
    #: The operation's last statement, whose answer it returns as its result and decides nothing
    #: in the transaction (``single``): Postgres sends ``COMMIT`` with it. A statement after it fails.
    last: bool = False
    #: An earlier operation's ``last`` statement in a group (``together``): answered at once with a
    #: ``Later``, which holds its answer once the message carrying it has been answered, so the
    #: statements after it go in that message (Postgres), not after a round trip of its own.
    later: bool = False


class Later:
    """The answer of a ``later`` statement, once read (``ready``): SQLite's at once, Postgres's
    when the message carrying it is answered (``bot.store.postgres._Message.send``)."""

    __slots__ = ("ready", "value")

    def __init__(self) -> None:
        self.ready = False
        self.value: Any = None

    def hold(self, value: Any) -> Later:
        self.ready, self.value = True, value
        return self


#: An operation: yields statements, is sent each one's answer, returns its result.
Op = Generator[Stmt, Any, T]


def run(sql: str, params: Sequence[Any] = ()) -> Stmt:
    return Stmt(sql, params, "run")


def many(sql: str, rows: Sequence[Sequence[Any]], *, wakes: bool = False, bulk: str | None = None) -> Stmt:
    return Stmt(sql, rows, "many", wakes, bulk)


def put(sql: str, params: Sequence[Any] = ()) -> Stmt:
    """One statement whose answer the operation does not read: a ``many`` of one row, which the
    operation goes on from at once (Postgres sends it with the next statement that is read, or
    with ``COMMIT``)."""
    return Stmt(sql, (params,), "many")


def check(sql: str, params: Sequence[Any], refuse: Callable[[], Exception]) -> Stmt:
    """A condition of the transaction: the operation goes on at once, as after ``many``, and the
    transaction never commits unless ``sql`` finds a row; if it finds none, ``refuse()`` is
    raised, from this statement or a later one, and nothing of the transaction is kept (Postgres
    runs it as a statement that fails in the server, sent with the next ones and ``COMMIT``:
    ``bot.store.postgres._Message.check``)."""
    return Stmt(sql, params, "check", refuse=refuse)


@dataclass(frozen=True, slots=True)
class When:
    """A condition of a write: a query (its text in the neutral form and its parameters) that finds
    a row where the write is to be made (``provided``)."""

    sql: str
    params: Sequence[Any] = ()


def provided(stmt: Stmt, when: When) -> Stmt:
    """``stmt``, an ``INSERT ... VALUES (...)`` of one row a parameter set (``many``, ``put``), made
    only if ``when`` finds a row as it runs. Decided in the database, so the operation reads no
    answer before it: on Postgres it goes with the statements after it, where reading the answer
    that decides it was a round trip of its own, with the write lock held."""
    head, _, values = stmt.sql.partition(" VALUES ")
    assert stmt.kind == "many" and stmt.bulk is None, "rows, each its own parameters"
    assert values.startswith("(") and values.endswith(")"), stmt.sql
    sql = f"{head} SELECT {values[1:-1]} WHERE EXISTS ({when.sql})"
    return replace(stmt, sql=sql, params=[(*row, *when.params) for row in stmt.params])


def holds(when: When) -> Stmt:
    """Whether ``when`` finds a row: a row if it does, else none (``one``)."""
    return one(f"SELECT 1 AS found WHERE EXISTS ({when.sql})", when.params)


def refused(stmt: Stmt, found: bool) -> None:
    """Raise what a ``check`` raises if it ``found`` no row."""
    if not found:
        assert stmt.refuse is not None
        raise stmt.refuse()


def one(sql: str, params: Sequence[Any] = ()) -> Stmt:
    return Stmt(sql, params, "one")


def rows(sql: str, params: Sequence[Any] = ()) -> Stmt:
    return Stmt(sql, params, "all")


def single(stmt: Stmt) -> Op[Any]:
    """The operation of one statement; its answer (``last``: its caller reads it once committed)."""
    return (yield replace(stmt, last=True))


#: What a group ends with when an earlier operation's answer is still in the message not sent yet
#: (``together``): a statement read, so that message is sent, ``COMMIT`` with it, and answered.
SYNC = "SELECT 1 AS answered"


def together(ops: Sequence[Op[Any]]) -> Op[list[tuple[Any, bool]]]:
    """Several operations in one transaction, one after the other (a group commit of the engine's
    writes, ``bot.store.postgres._Writes.write``): each one's result and whether it routed a
    timeline event to an outbox (``Stmt.wakes``), in order. Only the last operation's ``last``
    statement stays one (Postgres sends ``COMMIT`` with it). An earlier one's decides nothing in
    the transaction either, so, if it has an answer (rows have none), it goes as ``later``: the
    next operation's statements follow it in the same message, and the earlier operation gets its
    answer, and returns its result, once that message has been answered (at the latest with
    ``COMMIT``: ``SYNC``). Read at once instead, it was a round trip with the write lock held (an
    engine's notice reads back its event's ``seq``).
    Measured under ``bench/ingest.py``'s stream on one replica, with transitions that read nothing
    back (``bot.store.queries.transition``): the burst of closes at its start sent 46 messages
    under the write lock against 71; the stream's p99 no different beyond the noise (8.5 against
    8.3 ms, the medians of four pairs; on two replicas 11.5 against 12.0 over seven)."""
    done: list[tuple[Any, bool]] = []
    waiting: list[tuple[int, Op[Any], Later]] = []
    committed = False
    for index, op in enumerate(ops):
        final = index == len(ops) - 1
        wakes, answer = False, None
        while True:
            try:
                stmt = op.send(answer)
            except StopIteration as end:
                done.append((end.value, wakes))
                break
            wakes = wakes or stmt.wakes
            if stmt.last and not final:
                if stmt.kind != "many":  # an answer: read later
                    done.append((None, wakes))
                    waiting.append((len(done) - 1, op, (yield replace(stmt, last=False, later=True))))
                    break
                stmt = replace(stmt, last=False)  # rows: no answer to wait for
            committed = committed or stmt.last
            answer = yield stmt
    if not committed and any(not later.ready for _, _, later in waiting):
        yield Stmt(SYNC, (), "one", last=True)
    for slot, op, later in waiting:
        assert later.ready, "answered with its message"
        done[slot] = (finished(op, later.value), done[slot][1])
    return done


def reads(ops: Sequence[Op[Any]]) -> Op[list[Any]]:
    """Reads, each but the last of one statement: on Postgres in one message (theirs go as
    ``later``, answered with the last's first statement), where each read was a round trip of its
    own (an incident and its steps, read at every move of its flow); their results, in order."""
    *firsts, last = ops
    held: list[tuple[Op[Any], Later]] = []
    for op in firsts:
        stmt = next(op)
        assert not stmt.last and stmt.kind in ("one", "all"), "a read of one statement"
        held.append((op, (yield replace(stmt, later=True))))
    answer = yield from last
    assert all(later.ready for _, later in held), "answered with the message after them"
    return [*(finished(op, later.value) for op, later in held), answer]


def both(first: Op[T], second: Op[U]) -> Op[tuple[T, U]]:
    """Two reads in one message on Postgres (``reads``), ``first`` of one statement."""
    found = yield from reads([first, second])
    return cast(T, found[0]), cast(U, found[1])


def finished(op: Op[T], answer: Any) -> T:
    """``op``'s result, sent ``answer``, its ``last`` statement's: a statement after that one fails
    (on Postgres, ``COMMIT`` went with it, and the statement would run outside the transaction)."""
    try:
        stmt = op.send(answer)
    except StopIteration as end:
        return cast(T, end.value)
    op.close()
    raise RuntimeError(f"a statement after the operation's last one: {stmt.sql}")


_WORD = re.compile(r"\{([a-z_]+)\}")
_LIST = " IN (?*)"
#: Terminal incident states (``State.terminal``), as SQL: the same words in both dialects.
TERMINAL_STATES = "('resolved','failed','rolled_back','suppressed')"


@dataclass(frozen=True, slots=True)
class Dialect:
    """How one database spells the neutral form."""

    name: Literal["sqlite", "postgres"]
    #: The driver's placeholder.
    param: str
    words: Mapping[str, str]
    #: A datetime as a lease time parameter, and a stored lease time as a datetime.
    instant: Callable[[datetime], Any]
    moment: Callable[[Any], datetime]
    _cache: dict[str, str] = field(default_factory=dict, compare=False, repr=False)

    def render(self, sql: str) -> str:
        """The neutral statement in this dialect (lists of parameters aside: ``bind``)."""
        done = self._cache.get(sql)
        if done is None:
            text = _WORD.sub(lambda m: self.words[m.group(1)], sql)
            if self.param != "?":
                text = text.replace("%", "%%").replace(_LIST, " = ANY(?)").replace("?", self.param)
            done = self._cache[sql] = text
        return done

    def bind(self, sql: str, params: Sequence[Any]) -> tuple[str, Sequence[Any]]:
        """The statement and parameters to execute: SQLite expands each list parameter in place."""
        if self.name != "sqlite" or _LIST not in sql:
            return self.render(sql), params
        *heads, tail = sql.split(_LIST)
        expanded: list[str] = []
        flat: list[Any] = []
        taken = 0
        for head in heads:
            before = head.count("?")
            values = list(params[taken + before])
            flat.extend([*params[taken : taken + before], *values])
            taken += before + 1
            expanded.append(f"{head} IN ({','.join('?' * len(values))})")
        return self.render("".join([*expanded, tail])), [*flat, *params[taken:]]

    def script(self, sql: str) -> str:
        """A migration: words only (no parameters, nothing to escape)."""
        return _WORD.sub(lambda m: self.words[m.group(1)], sql)


#: The SQLSTATE a Postgres ``check`` that found no row fails with (``pitcrew_check``, migration 8):
#: a class of pitcrew's own, which PostgreSQL's codes never use.
REFUSED = "PCR01"

_COMMON = {"terminal": TERMINAL_STATES}

SQLITE = Dialect(
    "sqlite",
    "?",
    {
        **_COMMON,
        "serial": "INTEGER PRIMARY KEY AUTOINCREMENT",
        "bigint": "INTEGER",
        "without_rowid": "WITHOUT ROWID",
        "instant": "REAL",
        "greatest": "MAX",
        "least": "MIN",
        # The machine's clock read by SQLite, as Unix seconds: the same for every process on it.
        "now": "((julianday('now') - 2440587.5) * 86400.0)",
        "clock": "?",
        "seconds": "?",
        "for_share": "",  # BEGIN IMMEDIATE already holds the database's write lock
        # The seq of the event the transaction inserted last: the largest, since the transaction
        # holds the database's write lock (BEGIN IMMEDIATE) and seq only grows (AUTOINCREMENT).
        "event_seq": "(SELECT MAX(seq) FROM events)",
        "moment_from": "",  # lease times are Unix seconds, read as they are
        "moment_to": "",
        # Retention finds closed incidents oldest first. Without statistics SQLite's planner takes
        # the state index instead (every closed incident read, then sorted: 25 ms a prune
        # transaction at 10,000 incidents); naming the index makes that plan an error, not a scan.
        "by_closed_at": "INDEXED BY incidents_closed",
        "append_only_events": (
            "CREATE TRIGGER events_no_update BEFORE UPDATE ON events"
            " BEGIN SELECT RAISE(ABORT, 'the audit log is append-only'); END;"
            " CREATE TRIGGER events_no_delete BEFORE DELETE ON events"
            " BEGIN SELECT RAISE(ABORT, 'the audit log is append-only'); END;"
        ),
        # Migration 7: an event may be deleted only if it is no audit row and its incident is
        # closed or gone (``bot.store.retention``); an update never.
        "events_prunable": (
            "DROP TRIGGER events_no_delete;"
            " CREATE TRIGGER events_no_delete BEFORE DELETE ON events"
            " WHEN OLD.audit <> 0 OR EXISTS (SELECT 1 FROM incidents i"
            " WHERE i.id = OLD.incident_id AND i.closed_at IS NULL)"
            " BEGIN SELECT RAISE(ABORT, 'the audit log is append-only'); END;"
        ),
        "check_function": "",  # a check is read by pitcrew in the transaction (``run_sync``)
    },
    instant=lambda at: at.timestamp(),
    moment=lambda seconds: datetime.fromtimestamp(seconds, UTC),
)

POSTGRES = Dialect(
    "postgres",
    "%s",
    {
        **_COMMON,
        "serial": "BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY",
        "bigint": "BIGINT",
        "without_rowid": "",
        "instant": "TIMESTAMPTZ",
        "greatest": "GREATEST",
        "least": "LEAST",
        # The transaction's start on the database's clock, whatever the replicas' clocks say.
        "now": "now()",
        "clock": "?::timestamptz",
        "seconds": "make_interval(secs => ?)",
        # The seq of the event this session inserted last: its identity's sequence's current value.
        "event_seq": "currval(pg_get_serial_sequence('events', 'seq'))",
        # A takeover's UPDATE of the leadership row waits until the fenced write commits.
        "for_share": "FOR SHARE",
        # A lease time as it is read: UTC text in one fixed form (``moment``). A timestamptz comes
        # back in the session's DateStyle, which the database or the role may set (``SQL, DMY``,
        # ``German``...), and psycopg parses ISO only: the lease could not be read, and nobody led.
        "moment_from": "to_char(",
        "moment_to": " AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.US')",
        "by_closed_at": "",  # the planner's statistics choose incidents_closed
        "append_only_events": (
            "CREATE FUNCTION pitcrew_append_only() RETURNS trigger LANGUAGE plpgsql AS $$"
            " BEGIN RAISE EXCEPTION 'the audit log is append-only'; END $$;"
            " CREATE TRIGGER events_no_update BEFORE UPDATE OR DELETE ON events"
            " FOR EACH ROW EXECUTE FUNCTION pitcrew_append_only();"
            " CREATE TRIGGER events_no_truncate BEFORE TRUNCATE ON events"
            " FOR EACH STATEMENT EXECUTE FUNCTION pitcrew_append_only();"
        ),
        "events_prunable": (
            "CREATE FUNCTION pitcrew_events_prunable() RETURNS trigger LANGUAGE plpgsql AS $$"
            " BEGIN IF TG_OP = 'DELETE' AND OLD.audit = 0 AND NOT EXISTS (SELECT 1 FROM incidents i"
            " WHERE i.id = OLD.incident_id AND i.closed_at IS NULL) THEN RETURN OLD; END IF;"
            " RAISE EXCEPTION 'the audit log is append-only'; END $$;"
            " DROP TRIGGER events_no_update ON events;"
            " CREATE TRIGGER events_no_update BEFORE UPDATE OR DELETE ON events"
            " FOR EACH ROW EXECUTE FUNCTION pitcrew_events_prunable();"
        ),
        # Migration 8: what a ``check`` calls in the server (``bot.store.postgres._Message.check``).
        "check_function": (
            "CREATE FUNCTION pitcrew_check(ok boolean, number integer) RETURNS void"
            " LANGUAGE plpgsql AS $$ BEGIN IF NOT ok THEN RAISE EXCEPTION USING"
            f" ERRCODE = '{REFUSED}', MESSAGE = 'pitcrew check ' || number; END IF; END $$;"
        ),
    },
    instant=lambda at: at,
    moment=lambda text: datetime.fromisoformat(text).replace(tzinfo=UTC),
)


class Driving(Generic[T]):
    """One operation being driven: iterate for its statements, bound for ``dialect`` (``sql``,
    ``params``, ``stmt``), set ``answer`` after running each; ``result`` once it returned.
    ``wakes`` says whether it routed a timeline event to an outbox. A ``later`` statement's answer
    is a ``Later``: the driver's, or, from a driver that read it at once, held in one here."""

    def __init__(self, op: Op[T], dialect: Dialect) -> None:
        self._op, self._dialect = op, dialect
        self.answer: Any = None
        self.wakes = False

    def __iter__(self) -> Iterator[tuple[str, Sequence[Any], Stmt]]:
        last = later = False
        while True:
            answer, self.answer = self.answer, None
            if later and not isinstance(answer, Later):  # read at once (SQLite, ``_drive``)
                answer = Later().hold(answer)
            if last:
                self.result: T = finished(self._op, answer)
                return
            try:
                stmt = self._op.send(answer)
            except StopIteration as done:
                self.result = done.value
                return
            last, later = stmt.last, stmt.later
            self.wakes = self.wakes or stmt.wakes
            sql, params = self._dialect.bind(stmt.sql, stmt.params)
            yield sql, params, stmt


def run_sync(db: sqlite3.Connection, op: Op[T]) -> Driving[T]:
    """Drive ``op`` over a SQLite connection (in the writer's transaction, or the reader's)."""
    driving = Driving(op, SQLITE)
    for sql, params, stmt in driving:
        if stmt.kind == "many":
            db.executemany(sql, stmt.params)
            continue
        cursor = db.execute(sql, params)
        cursor.row_factory = sqlite3.Row
        if stmt.kind == "check":
            refused(stmt, cursor.fetchone() is not None)
        elif stmt.kind == "run":
            driving.answer = cursor.rowcount
        else:
            found = cursor.fetchall()  # all of it: a RETURNING statement ends when read to the end
            driving.answer = found if stmt.kind == "all" else (found[0] if found else None)
    return driving
