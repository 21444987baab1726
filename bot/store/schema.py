"""The store's schema and its versioned migrations: one definition for SQLite and Postgres.

Migration *n* is the same tables, columns, keys and indexes on both databases; the few words they
spell differently (identity columns, ``WITHOUT ROWID``, the lease's time type, the append-only
triggers) are ``{word}``s that ``bot.store.sql.Dialect.script`` fills in. Timestamps are ISO-8601
text in UTC on both, so one codec (``bot.store.codec``) reads both and text order is time order;
only the lease's times are the database's own clock type.

Each migration is applied once, in order, in a transaction of its own that reads the version
it starts from under the database's write lock (SQLite: ``BEGIN IMMEDIATE``; Postgres: an
advisory lock), so two processes opening one store at once migrate it once; it is recorded
(SQLite: ``PRAGMA user_version``; Postgres: the ``pitcrew_schema`` row). The audit log is
append-only in the database itself: triggers refuse UPDATE and TRUNCATE (Postgres) on ``events``,
and DELETE of any audit row, or of any event of an incident not closed (migration 7: what an
alert said goes with its pruned incident).

**A pitcrew runs on a store a newer one migrated** (``standing``) unless a migration since its own
schema is ``BREAKING``: every other migration only adds (a table, an index, a column that may be
null or has a default), and the earlier pitcrew neither misreads nor refuses what it finds. During
a rolling update the replica still on the last release goes on leading while the new one migrates,
and a rollback of the image, or that replica restarting, starts on the migrated store. Each
pitcrew that migrates a store records the earliest schema a pitcrew must be written for to run on
it (``compatible_from``: SQLite, the ``pitcrew_schema`` row; Postgres, its ``compatible_from``).
``tests/unit/test_store_schema.py`` holds every migration not listed as breaking to statements
that only add.
"""

from __future__ import annotations

import re
from collections.abc import Collection
from typing import Literal

from bot import logger
from bot.store.base import StoreRefused
from bot.store.sql import TERMINAL_STATES, Dialect

__all__ = [
    "BREAKING",
    "MIGRATIONS",
    "SCHEMA_VERSION",
    "TABLES",
    "TERMINAL_STATES",
    "NewerSchema",
    "compatible_from",
    "foresee",
    "migrations",
    "opening",
    "standing",
]

log = logger(__name__)

MIGRATIONS: tuple[str, ...] = (
    # 1: the first schema
    """
    CREATE TABLE incidents (
        id TEXT PRIMARY KEY,
        seq {bigint} NOT NULL UNIQUE,
        node TEXT NOT NULL,
        state TEXT NOT NULL,
        playbook TEXT,
        mode TEXT,
        plan_json TEXT,
        step_index INTEGER NOT NULL DEFAULT 0,
        acted INTEGER NOT NULL DEFAULT 0,
        faults_changed INTEGER NOT NULL DEFAULT 0,
        opened_at TEXT NOT NULL,
        updated_at TEXT NOT NULL,
        first_alert_at TEXT,
        guarded_at TEXT,
        closed_at TEXT,
        outcome TEXT NOT NULL DEFAULT '',
        group_key TEXT NOT NULL DEFAULT ''
    );
    CREATE UNIQUE INDEX incidents_one_active_per_node ON incidents(node) WHERE state NOT IN {terminal};
    CREATE INDEX incidents_node_opened ON incidents(node, opened_at);
    CREATE INDEX incidents_state ON incidents(state);

    CREATE TABLE alerts (
        fingerprint TEXT NOT NULL,
        starts_at TEXT NOT NULL,
        ends_at TEXT,
        status TEXT NOT NULL,
        alertname TEXT NOT NULL,
        node TEXT,
        incident_id TEXT REFERENCES incidents(id),
        fault_key TEXT,
        fault_json TEXT,
        labels_json TEXT NOT NULL,
        annotations_json TEXT NOT NULL,
        group_key TEXT NOT NULL DEFAULT '',
        first_seen TEXT NOT NULL,
        PRIMARY KEY (fingerprint, starts_at)
    ) {without_rowid};
    CREATE INDEX alerts_incident ON alerts(incident_id);

    -- Delivery counters apart from the alert itself: Alertmanager redelivers every group
    -- constantly, and bumping a narrow row rewrites far fewer pages than the alert's row.
    CREATE TABLE alert_deliveries (
        fingerprint TEXT NOT NULL,
        starts_at TEXT NOT NULL,
        deliveries INTEGER NOT NULL DEFAULT 1,
        last_seen TEXT NOT NULL,
        PRIMARY KEY (fingerprint, starts_at)
    ) {without_rowid};

    CREATE TABLE steps (
        incident_id TEXT NOT NULL REFERENCES incidents(id),
        step TEXT NOT NULL,
        status TEXT NOT NULL,
        attempts INTEGER NOT NULL DEFAULT 0,
        started_at TEXT,
        ended_at TEXT,
        result_json TEXT NOT NULL DEFAULT '{}',
        PRIMARY KEY (incident_id, step)
    ) {without_rowid};

    CREATE TABLE approvals (
        incident_id TEXT NOT NULL REFERENCES incidents(id),
        step TEXT NOT NULL,
        requested_at TEXT NOT NULL,
        deadline TEXT NOT NULL,
        approvers_json TEXT NOT NULL,
        status TEXT NOT NULL,
        decided_by TEXT,
        decided_at TEXT,
        PRIMARY KEY (incident_id, step)
    );

    CREATE TABLE switches (
        name TEXT PRIMARY KEY,
        value_json TEXT,
        set_by TEXT NOT NULL,
        set_at TEXT NOT NULL
    );

    CREATE TABLE events (
        seq {serial},
        incident_id TEXT,
        at TEXT NOT NULL,
        kind TEXT NOT NULL,
        step TEXT,
        outcome TEXT,
        attempt INTEGER,
        actor TEXT,
        detail TEXT NOT NULL DEFAULT '',
        data_json TEXT NOT NULL DEFAULT '{}'
    );
    CREATE INDEX events_incident ON events(incident_id, seq);
    {append_only_events}
    """,
    # 2: the durable outbox of notices (bot.store.outbox): one row per notice and destination,
    # written in the transaction of the timeline event it reports; the references a destination
    # keeps (a Slack thread's ts) beside it.
    """
    CREATE TABLE outbox (
        id {serial},
        destination TEXT NOT NULL,
        incident_id TEXT,
        event_seq {bigint},
        kind TEXT NOT NULL,
        payload_json TEXT NOT NULL,
        created_at TEXT NOT NULL,
        attempts INTEGER NOT NULL DEFAULT 0,
        not_before TEXT,
        delivered_at TEXT,
        ref TEXT,
        last_error TEXT NOT NULL DEFAULT ''
    );
    CREATE INDEX outbox_pending ON outbox(destination, id) WHERE delivered_at IS NULL;

    CREATE TABLE outbox_refs (
        destination TEXT NOT NULL,
        key TEXT NOT NULL,
        ref TEXT NOT NULL,
        updated_at TEXT NOT NULL,
        PRIMARY KEY (destination, key)
    ) {without_rowid};
    """,
    # 3: where people see an incident (``link:<incident>``, a Slack thread's permalink), read by
    # key across destinations (the read API, ``pitcrew incidents show``).
    """
    CREATE INDEX outbox_refs_key ON outbox_refs(key);
    """,
    # 4: one actor per store (bot.store.lease): at most one row, who leads and until when; the
    # epoch is the fencing token every engine write is checked against. Times are the store's own
    # clock (SQLite: Unix seconds; Postgres: timestamptz of its now()).
    """
    CREATE TABLE leadership (
        id INTEGER PRIMARY KEY CHECK (id = 1),
        holder TEXT NOT NULL,
        epoch {bigint} NOT NULL,
        acquired_at {instant} NOT NULL,
        renewed_at {instant} NOT NULL,
        expires_at {instant} NOT NULL
    );
    -- The leader looks for rollbacks another process recorded at every scan.
    CREATE INDEX steps_rollback_requested ON steps(incident_id) WHERE step = 'rollback' AND status = 'running';
    """,
    # 5: retention (bot.store.retention) finds closed incidents by age, and an incident's outbox rows,
    # without reading either table whole.
    """
    CREATE INDEX incidents_closed ON incidents(closed_at) WHERE closed_at IS NOT NULL;
    CREATE INDEX outbox_incident ON outbox(incident_id);
    """,
    # 6: what pitcrew's own alert sources remember between looks (bot.engine.memory): the Slurm
    # watch's jobs per busy node, the hung-job watch's progress per job; and the capacity pools'
    # index of ended incidents still holding a node (bot.engine.steps.capacity.HELD). Kept across a
    # restart or a change of leader, written by the leader only (fenced), each entry dropped by its
    # writer.
    """
    CREATE TABLE watch_memory (
        watch TEXT NOT NULL,
        key TEXT NOT NULL,
        value_json TEXT NOT NULL,
        updated_at TEXT NOT NULL,
        PRIMARY KEY (watch, key)
    ) {without_rowid};
    """,
    # 7: the timeline keeps for good what pitcrew and people did (``audit``: every event but what
    # an alert said, ``bot.store.ingest.ALERT_EVENTS``); retention lets the rest go once its
    # incident is closed and pruned (``bot.store.retention``), and the database refuses any other
    # delete, and every update. Events stored before are kept as audit rows, as are an earlier
    # pitcrew's, which does not fill the column.
    """
    ALTER TABLE events ADD COLUMN audit INTEGER NOT NULL DEFAULT 1;
    {events_prunable}
    """,
    # 8: Postgres: the function a write's check calls in the server, failing its transaction when
    # the check finds no row (``bot.store.postgres._Message.check``); nothing on SQLite.
    """
    {check_function}
    """,
    # 9: the breaker's count of nodes under remediation (``queries.nodes_in_remediation``) finds the
    # incidents admitted in its window by that time, and which ended ones changed something by
    # their action events alone, not by reading every incident and event ever kept: on PostgreSQL,
    # that plan's estimate crossed ``jit_above_cost``, and each count spent 200 ms compiling itself
    # (JIT) to find no row.
    """
    CREATE INDEX incidents_guarded ON incidents(guarded_at) WHERE guarded_at IS NOT NULL;
    CREATE INDEX events_action ON events(incident_id) WHERE kind = 'action';
    """,
)

SCHEMA_VERSION = len(MIGRATIONS)
#: Every table the migrations make, in order (``inspect``: what this role must be allowed to use).
TABLES: tuple[str, ...] = tuple(
    name for migration in MIGRATIONS for name in re.findall(r"CREATE TABLE (\w+)", migration)
)

#: The migrations (numbered from 1, as ``SCHEMA_VERSION`` counts them) a pitcrew written for an
#: earlier schema must not run after: one that changes what a column or a state means, renames or
#: drops, or refuses rows an earlier pitcrew writes (a constraint on a table it already had, a
#: column it does not fill that may not be null). Applied with every older replica stopped (the
#: Deployment's ``Recreate``): a replica running when it is applied does not look again.
BREAKING: frozenset[int] = frozenset()


def compatible_from(version: int, breaking: Collection[int] = BREAKING) -> int:
    """The earliest schema a pitcrew may be written for and run on a store at ``version``: the last
    breaking migration up to it (0: any pitcrew that knows this rule)."""
    return max((number for number in breaking if number <= version), default=0)


class NewerSchema(StoreRefused):
    """The store was migrated past this pitcrew's schema by a migration it must not run after."""


def standing(
    found: int, compatible: int | None, where: str, ours: int = SCHEMA_VERSION
) -> Literal["older", "current", "newer"]:
    """Where a store at schema ``found`` stands to this pitcrew (schema ``ours``): ``older`` (to be
    migrated), ``current``, or ``newer`` and run on as it is, since the pitcrew that migrated it
    recorded that one written for ``compatible`` or later runs on it. ``NewerSchema`` when it is
    newer and this pitcrew is too old for it, or nothing was recorded (``None``)."""
    if found < ours:
        return "older"
    if found == ours:
        return "current"
    if compatible is None:
        raise NewerSchema(
            f"{where} has schema {found}, newer than this pitcrew ({ours}), and no record of which"
            " pitcrew may run on it: run the pitcrew that migrated it"
        )
    if compatible > ours:
        raise NewerSchema(
            f"{where} has schema {found}, newer than this pitcrew ({ours}), and migration"
            f" {compatible} changed what this pitcrew would read or write: run a pitcrew written for"
            f" schema {compatible} or later (the one that migrated it), or restore the store from"
            " before that migration"
        )
    return "newer"


def opening(found: int, compatible: int | None, where: str) -> Literal["older", "current", "newer"]:
    """``standing``, as a store opening says it: running on a newer schema is logged (the operator
    sees which replica runs behind its store)."""
    stands = standing(found, compatible, where)
    if stands == "newer":
        log.warning(
            "the store's schema is newer than this pitcrew's; running on it: the migrations since only add",
            extra={"store": where, "schema_version": found, "pitcrew_schema_version": SCHEMA_VERSION},
        )
    return stands


def foresee(found: int | None, compatible: int | None, where: str) -> tuple[str, bool]:
    """What opening a store at schema ``found`` (``None``: no tables yet) will do, for people, and
    whether it creates or migrates tables (the database must let it). ``NewerSchema`` as
    ``standing``; nothing logged (``check-config --live``)."""
    if not found:
        return f"no tables yet: pitcrew creates them at start (schema {SCHEMA_VERSION})", True
    stands = standing(found, compatible, where)
    if stands == "older":
        return f"schema {found}: pitcrew migrates it to {SCHEMA_VERSION} at start", True
    if stands == "newer":
        return f"schema {found}, newer than this pitcrew ({SCHEMA_VERSION}): it runs on it as it is", False
    return f"schema {found}", False


def migrations(dialect: Dialect) -> tuple[str, ...]:
    """Every migration, in order, as ``dialect`` runs it."""
    return tuple(dialect.script(m) for m in MIGRATIONS)
