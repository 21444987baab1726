"""PostgreSQL schema: the migrations of ``bot.store.schema``, one for one, in Postgres's dialect.

Migration *n* here is migration *n* there, with the same tables, columns, keys and indexes (a
contract test compares the two databases' columns); only the dialect differs. Timestamps stay
ISO-8601 text in UTC, as on SQLite, so one codec (``bot.store.codec``) reads both stores and
text order is time order; only the lease's times are ``timestamptz``, judged by the database's
``now()``. Applied versions are recorded in ``pitcrew_schema``; migrations run one transaction
each, under an advisory lock, so two replicas starting at once migrate once.

The audit log is append-only in the database itself: triggers refuse UPDATE, DELETE and
TRUNCATE on ``events`` (retention may delete only through ``pitcrew_retention``, which is not
written yet: nothing removes events today).
"""

from __future__ import annotations

from bot.store.schema import SCHEMA_VERSION, TERMINAL_STATES

MIGRATIONS: tuple[str, ...] = (
    # 1: the first schema
    f"""
    CREATE TABLE incidents (
        id TEXT PRIMARY KEY,
        seq BIGINT NOT NULL UNIQUE,
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
    CREATE UNIQUE INDEX incidents_one_active_per_node ON incidents(node) WHERE state NOT IN {TERMINAL_STATES};
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
    );
    CREATE INDEX alerts_incident ON alerts(incident_id);

    CREATE TABLE alert_deliveries (
        fingerprint TEXT NOT NULL,
        starts_at TEXT NOT NULL,
        deliveries INTEGER NOT NULL DEFAULT 1,
        last_seen TEXT NOT NULL,
        PRIMARY KEY (fingerprint, starts_at)
    );

    CREATE TABLE steps (
        incident_id TEXT NOT NULL REFERENCES incidents(id),
        step TEXT NOT NULL,
        status TEXT NOT NULL,
        attempts INTEGER NOT NULL DEFAULT 0,
        started_at TEXT,
        ended_at TEXT,
        result_json TEXT NOT NULL DEFAULT '{{}}',
        PRIMARY KEY (incident_id, step)
    );

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
        seq BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
        incident_id TEXT,
        at TEXT NOT NULL,
        kind TEXT NOT NULL,
        step TEXT,
        outcome TEXT,
        attempt INTEGER,
        actor TEXT,
        detail TEXT NOT NULL DEFAULT '',
        data_json TEXT NOT NULL DEFAULT '{{}}'
    );
    CREATE INDEX events_incident ON events(incident_id, seq);
    CREATE FUNCTION pitcrew_append_only() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN RAISE EXCEPTION 'the audit log is append-only'; END $$;
    CREATE TRIGGER events_no_update BEFORE UPDATE OR DELETE ON events
        FOR EACH ROW EXECUTE FUNCTION pitcrew_append_only();
    CREATE TRIGGER events_no_truncate BEFORE TRUNCATE ON events
        FOR EACH STATEMENT EXECUTE FUNCTION pitcrew_append_only();
    """,
    # 2: the durable outbox of notices and the references destinations keep
    """
    CREATE TABLE outbox (
        id BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
        destination TEXT NOT NULL,
        incident_id TEXT,
        event_seq BIGINT,
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
    );
    """,
    # 3: where people see an incident, read by key across destinations
    """
    CREATE INDEX outbox_refs_key ON outbox_refs(key);
    """,
    # 4: one actor per store: the leadership row, its times on the database's clock
    """
    CREATE TABLE leadership (
        id INTEGER PRIMARY KEY CHECK (id = 1),
        holder TEXT NOT NULL,
        epoch BIGINT NOT NULL,
        acquired_at TIMESTAMPTZ NOT NULL,
        renewed_at TIMESTAMPTZ NOT NULL,
        expires_at TIMESTAMPTZ NOT NULL
    );
    CREATE INDEX steps_rollback_requested ON steps(incident_id) WHERE step = 'rollback' AND status = 'running';
    """,
)

if len(MIGRATIONS) != SCHEMA_VERSION:  # pragma: no cover - a migration added to one store only
    raise RuntimeError(
        f"bot.store.postgres_schema has {len(MIGRATIONS)} migrations, bot.store.schema {SCHEMA_VERSION}"
    )

#: Bookkeeping of applied migrations (SQLite's ``PRAGMA user_version``).
VERSION_TABLE = "CREATE TABLE IF NOT EXISTS pitcrew_schema (version INTEGER NOT NULL)"
