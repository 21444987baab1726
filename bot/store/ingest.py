"""One Alertmanager delivery into the store, inside the writer's transaction.

Dedupe by ``(fingerprint, startsAt)`` with startsAt in UTC (``bot.domain.alerts.dedupe_key``):
a repeat only bumps its delivery counter; a resolved repeat marks the alert resolved (a stale
firing repeat never un-resolves it). A new firing alert attaches to the node's active incident
or opens one; a resolved alert never opens an incident. Alerts without a node are kept
(``unroutable``) and never acted on.

Written once for both stores as an operation (``bot.store.sql.Op``): SQLite's writer drives it
over a batch of deliveries with its cache of committed keys, Postgres over a batch of deliveries
(``bot.store.group_commit``), which may expect what its lookup would answer and confirm it in the
same message as its writes instead (``bot.store.expect``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any, TypeVar

from bot.domain.alerts import dedupe_key
from bot.domain.incident import State
from bot.store.base import Delivery, IncomingAlert, IngestOutcome, NewEvent
from bot.store.codec import dumps, fault_json, ts
from bot.store.expect import Expecting, Mispredicted, NodeView
from bot.store.expect import KeyState as KeyState
from bot.store.sql import Op, Stmt, When, check, many, one, provided, put, rows

_CHUNK = 400  # list parameters: well under SQLite's bound-variable limit
T = TypeVar("T")


def _chunks(items: Sequence[T], size: int = _CHUNK) -> Iterable[Sequence[T]]:
    for start in range(0, len(items), size):
        yield items[start : start + size]


#: A delivery counter's increment (``bump_seen``): last seen, deliveries, fingerprint, startsAt.
Seen = tuple[str | None, int, str, str]


def ingest(
    deliveries: Sequence[tuple[Delivery, datetime]],
    cache: Mapping[tuple[str, str], KeyState],
    counted: Sequence[Seen] = (),
    expecting: Expecting | None = None,
) -> Op[list[IngestOutcome]]:
    """Persist deliveries in arrival order with a fixed number of statements for the whole batch.

    ``cache`` holds committed keys; the database answers the rest in one query. Every read is
    done first, the batch is worked out in memory (later deliveries see earlier ones), then
    each table gets one ``executemany``: a burst of deliveries costs about as much as one.
    ``counted``: repeat deliveries the transaction counts besides (a batch's repeat checks), in
    the batch's one update of the counters (``Batch.write``). ``expecting`` (Postgres): if every
    node the lookup would ask about has an expected view, the lookup is not made; the batch is
    worked out from those views and the keys as the store remembers them (any other not stored),
    and ``_confirm`` makes the transaction commit only if the database holds exactly that. Its
    ``seen`` gets the nodes as the batch left them.
    """
    all_keys = [[dedupe_key(a.fingerprint, a.starts_at) for a in d.alerts] for d, _ in deliveries]
    known: dict[tuple[str, str], KeyState] = {}
    for keys in all_keys:
        for key in keys:
            state = cache.get(key)  # one lookup: the event loop may evict keys meanwhile
            if state is not None:
                known[key] = state
    missing = [k for keys in all_keys for k in keys if k not in known]
    # The nodes a new alert could open or join an incident on: those of the alerts not known yet
    # (some of them may turn out stored; their nodes' incidents are then read for nothing).
    nodes = {
        a.node
        for (delivery, _), keys in zip(deliveries, all_keys, strict=True)
        for a, k in zip(delivery.alerts, keys, strict=True)
        if k not in known and a.node is not None and a.fault is not None
    }
    active: dict[str, tuple[str, str]] = {}
    faults_of: dict[str, set[str]] = {}
    if missing:
        expected = _expected(missing, nodes, expecting)
        if expecting is not None:
            expecting.recent.append(frozenset(missing))
        if expected is None:
            found, active, faults_of = yield from _look_up(missing, nodes)
        else:
            found, active, faults_of = expected
            yield _confirm(missing, found, nodes, active, faults_of)
        known.update(found)
    batch = Batch(known, active, faults_of, counted)
    outcomes = [
        batch.add(delivery, keys, now) for (delivery, now), keys in zip(deliveries, all_keys, strict=True)
    ]
    yield from batch.write()
    if expecting is not None and missing:
        expecting.seen.update(batch.views(nodes))
    return outcomes


def _expected(
    keys: Sequence[tuple[str, str]], nodes: set[str], expecting: Expecting | None
) -> LookedUp | None:
    """What ``_look_up(keys, nodes)`` is expected to answer, in its shape: the keys as remembered
    (any other not stored) and the nodes' views as ``_active`` reads them; ``None`` unless every
    node has an expected view, no key is recent and every key remembered is remembered with its
    incident (a repeat counted before its incident was known is remembered without:
    ``bot.store.postgres.PostgresStore.count_repeats``). Marks ``expecting`` used."""
    views = None if expecting is None else expecting.nodes
    if expecting is None or views is None or not all(node in views for node in nodes):
        return None
    if any(key in batch for batch in expecting.recent for key in keys):
        return None
    found = {key: remembered for key in keys if (remembered := expecting.keys.get(key)) is not None}
    if any(seen_in is None for _, seen_in in found.values()):
        return None
    active: Active = ({}, {})
    for node in nodes:
        view = views[node]
        if view is not None:
            incident_id, state, faults = view
            active[0][node] = (incident_id, state)
            active[1][incident_id] = set(faults)
    expecting.used = True
    return found, *active


class Batch:
    """The rows one batch of deliveries adds, worked out in memory in arrival order."""

    def __init__(
        self,
        known: dict[tuple[str, str], KeyState],
        active: dict[str, tuple[str, str]],
        faults_of: dict[str, set[str]],
        counted: Sequence[Seen] = (),
    ) -> None:
        self.known, self.active, self.faults_of = known, active, faults_of
        self.incidents: list[tuple[Any, ...]] = []
        self.inserts: list[tuple[Any, ...]] = []
        self.seen: list[Seen] = list(counted)
        self.resolves: list[tuple[Any, ...]] = []
        self.changed: list[tuple[str | None, str]] = []
        self.events: list[tuple[str | None, NewEvent, datetime]] = []
        self.new_incidents = 0
        self.outcomes: list[IngestOutcome] = []
        #: New incidents' names, placeholder to id (``write``).
        self.names: dict[str, str] = {}

    def add(self, delivery: Delivery, keys: list[tuple[str, str]], now: datetime) -> IngestOutcome:
        out = IngestOutcome()
        self.outcomes.append(out)
        stamp = ts(now)
        for alert, key in zip(delivery.alerts, keys, strict=True):
            if key in self.known:
                out.repeated_alerts += 1
                status, seen_in = self.known[key]
                if status == "firing" and alert.status == "resolved":
                    self.resolves.append((ts(alert.ends_at), stamp, *key))
                    self.known[key] = out.cache[key] = ("resolved", seen_in)
                    out.resolved += 1
                    if seen_in is not None:
                        out.resolved_in.append(seen_in)
                    self._event(
                        seen_in, _alert_event("alert_resolved", alert.alertname, alert.fault, key), now
                    )
                else:
                    self.seen.append((stamp, 1, *key))
                    out.cache[key] = self.known[key]  # found committed: a store may remember it
                continue
            incident_id = self._route(delivery, alert, key, out, now)
            self.known[key] = out.cache[key] = (alert.status, incident_id)
            out.new_alerts += 1
            self.inserts.append(
                (
                    key[0],
                    key[1],
                    ts(alert.ends_at),
                    alert.status,
                    alert.alertname,
                    alert.node,
                    incident_id,
                    alert.fault.key if alert.fault else None,
                    fault_json(alert.fault) if alert.fault else None,
                    dumps(dict(alert.labels)),
                    dumps(dict(alert.annotations)),
                    delivery.group_key,
                    stamp,
                    stamp,
                )
            )
        self.changed.extend((stamp, i) for i in set(out.changed))
        return out

    def _route(
        self,
        delivery: Delivery,
        alert: IncomingAlert,
        key: tuple[str, str],
        out: IngestOutcome,
        now: datetime,
    ) -> str | None:
        """The incident a new alert belongs to: the node's active one, a new one, or none."""
        if alert.node is None or alert.fault is None:
            out.unroutable += 1
            self._event(None, NewEvent("alert_unroutable", detail=f"{alert.alertname}: no node label"), now)
            return None
        if alert.status == "resolved":
            out.resolved += 1
            incident_id = self.active.get(alert.node, (None, None))[0]
            self._event(
                incident_id, _alert_event("alert_resolved_unseen", alert.alertname, alert.fault, key), now
            )
            return incident_id
        incident_id, state = self.active.get(alert.node, (None, None))
        if incident_id is None:
            self.new_incidents += 1
            incident_id = f"new:{self.new_incidents}"  # numbered when written
            self.incidents.append((incident_id, alert.node, ts(now), ts(alert.starts_at), delivery.group_key))
            self.active[alert.node] = (incident_id, State.OPEN.value)
            out.opened.append(incident_id)
            self._event(incident_id, NewEvent("incident_opened", detail=f"node {alert.node}"), now)
        else:
            out.attached.append(incident_id)
            seen_faults = self.faults_of.setdefault(incident_id, set())
            if state != State.OPEN.value and alert.fault.key not in seen_faults:
                out.changed.append(incident_id)  # a new fault on an incident already under way
            elif state != State.OPEN.value:
                out.recurred.append(incident_id)  # its fault fired again (back after a return?)
            seen_faults.add(alert.fault.key)
        self._event(incident_id, _alert_event("alert_firing", alert.alertname, alert.fault, key), now)
        return incident_id

    def _event(self, incident_id: str | None, event: NewEvent, now: datetime) -> None:
        self.events.append((incident_id, event, now))

    def write(self) -> Op[None]:
        names = self.names
        if self.incidents:
            found = yield one("SELECT COALESCE(MAX(seq), 0) + 1 AS next FROM incidents")
            first = int(found["next"])
            new = []
            for offset, (placeholder, node, stamp, starts, group_key) in enumerate(self.incidents):
                seq = first + offset
                names[placeholder] = f"pc-{seq:05d}"
                new.append((names[placeholder], seq, node, State.OPEN.value, stamp, stamp, starts, group_key))
            yield many(
                "INSERT INTO incidents (id, seq, node, state, opened_at, updated_at, first_alert_at, group_key)"
                " VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                new,
            )
            self.rename(names)
        if self.inserts:
            yield many(
                "INSERT INTO alerts (fingerprint, starts_at, ends_at, status, alertname, node, incident_id, fault_key,"
                " fault_json, labels_json, annotations_json, group_key, first_seen)"
                " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                [(*row[:6], names.get(row[6], row[6]), *row[7:-1]) for row in self.inserts],
                bulk=_INSERT_ALERTS_BULK,
            )
            yield many(
                "INSERT INTO alert_deliveries (fingerprint, starts_at, deliveries, last_seen) VALUES (?, ?, 1, ?)",
                [(row[0], row[1], row[-1]) for row in self.inserts],
                bulk=_INSERT_DELIVERIES_BULK,
            )
        if self.resolves:
            yield many(
                "UPDATE alerts SET status = 'resolved', ends_at = ? WHERE fingerprint = ? AND starts_at = ?",
                [(ends, fingerprint, starts) for ends, _, fingerprint, starts in self.resolves],
            )
        resolved: list[Seen] = [
            (stamp, 1, fingerprint, starts) for _, stamp, fingerprint, starts in self.resolves
        ]
        if self.seen or resolved:
            # One statement for every counter of the transaction (see ``bump_seen``).
            yield bump_seen([*self.seen, *resolved])
        if self.changed:
            yield many("UPDATE incidents SET faults_changed = 1, updated_at = ? WHERE id = ?", self.changed)
        if self.events:
            yield insert_events([(names.get(i, i) if i else i, e, at) for i, e, at in self.events])

    def views(self, nodes: set[str]) -> dict[str, NodeView]:
        """Each of ``nodes`` as the batch left it (after ``write``: new incidents named): its
        incident's faults are those it had and those of the alerts the batch gave it, whatever
        their status, as ``_ACTIVE`` reads them."""
        given: dict[str, set[str]] = {}
        for row in self.inserts:
            if row[6] is not None and row[7] is not None:
                given.setdefault(row[6], set()).add(row[7])
        views: dict[str, NodeView] = {}
        for node in nodes:
            incident_id, state = self.active.get(node, (None, None))
            if incident_id is None or state is None:
                views[node] = None
                continue
            faults = self.faults_of.get(incident_id, set()) | given.get(incident_id, set())
            views[node] = (self.names.get(incident_id, incident_id), state, frozenset(faults))
        return views

    def rename(self, names: dict[str, str]) -> None:
        """Give the outcomes and cache entries the incident ids the database assigned."""

        def real(incident_id: str | None) -> str | None:
            return names.get(incident_id, incident_id) if incident_id else incident_id

        for key, (status, incident_id) in list(self.known.items()):
            self.known[key] = (status, real(incident_id))
        for out in self.outcomes:
            out.opened = [names.get(i, i) for i in out.opened]
            out.attached = [names.get(i, i) for i in out.attached]
            out.cache = {key: (status, real(incident_id)) for key, (status, incident_id) in out.cache.items()}


#: A batch's new alerts, their counters and its events on Postgres: one statement a table, the rows
#: one JSON array (``bot.store.postgres._bulk``), where each row was a statement of its own, quoted
#: by psycopg in Python on the event loop and parsed and planned by the server: 4,000 of the
#: 11,400 statements of ``bench/ingest.py``'s stream. In the rows' order (the events' ``seq``).
_INSERT_ALERTS_BULK = (
    "INSERT INTO alerts (fingerprint, starts_at, ends_at, status, alertname, node, incident_id, fault_key,"
    " fault_json, labels_json, annotations_json, group_key, first_seen)"
    " SELECT r->>0, r->>1, r->>2, r->>3, r->>4, r->>5, r->>6, r->>7, r->>8, r->>9, r->>10, r->>11, r->>12"
    " FROM jsonb_array_elements(?::jsonb) WITH ORDINALITY AS e(r, n) ORDER BY n"
)
_INSERT_DELIVERIES_BULK = (
    "INSERT INTO alert_deliveries (fingerprint, starts_at, deliveries, last_seen)"
    " SELECT r->>0, r->>1, 1, r->>2 FROM jsonb_array_elements(?::jsonb) WITH ORDINALITY AS e(r, n) ORDER BY n"
)

#: ``bump_seen`` on Postgres, one statement for all the rows: a flush of a second's repeats is a
#: thousand counters and more, and a statement a row held the write lock's shared mode (and the
#: deliveries queued behind it) 50-130 ms under ``bench/ingest.py``; this way a third of that.
#: The rows are summed by key first (a batch may count one alert twice), and locked in key order,
#: as the statement a row did, so two replicas' flushes never wait on each other's rows. The rows
#: come as one JSON array (``bot.store.postgres._bulk``).
_BUMP_SEEN_BULK = (
    "WITH v AS (SELECT r->>2 AS fingerprint, r->>3 AS starts_at, MAX(r->>0) AS last_seen,"
    " SUM((r->>1)::bigint) AS n FROM jsonb_array_elements(?::jsonb) AS e(r) GROUP BY 1, 2),"
    " locked AS (SELECT d.fingerprint, d.starts_at FROM alert_deliveries d JOIN v USING (fingerprint, starts_at)"
    " ORDER BY d.fingerprint, d.starts_at FOR UPDATE OF d)"
    " UPDATE alert_deliveries d SET last_seen = GREATEST(d.last_seen, v.last_seen), deliveries = d.deliveries + v.n"
    " FROM v JOIN locked USING (fingerprint, starts_at)"
    " WHERE d.fingerprint = v.fingerprint AND d.starts_at = v.starts_at"
)


def bump_seen(seen: Sequence[Seen]) -> Stmt:
    """Repeat deliveries: ``(last_seen, count, fingerprint, starts_at)``.

    On Postgres a transaction updates counters in one such statement, never two (``Batch.write``,
    ``bot.store.group_commit.deliveries``): the counts of repeats answered from memory commit
    without the write lock, beside a batch of deliveries (``PostgresStore._count``), and two
    transactions that each lock counter rows in key order in one statement never wait on each
    other in a cycle, where a batch with two (its repeats, then its resolutions, each in key order)
    could hold a row the flush waits for while it waits for one the flush holds: a deadlock, which
    Postgres breaks after a second by failing one. (SQLite's one writer locks no rows.)"""
    return many(
        "UPDATE alert_deliveries SET last_seen = {greatest}(last_seen, ?), deliveries = deliveries + ?"
        " WHERE fingerprint = ? AND starts_at = ?",
        seen,
        bulk=_BUMP_SEEN_BULK,
    )


#: What an alert said, as the timeline tells it: every other event is the audit log of what pitcrew
#: and people did or decided (a step, a command, an approval, a state, a notice), kept for good;
#: these go once their incident is closed and pruned (``bot.store.retention``), as the alerts they
#: tell of do. They are most of the timeline: one at least an alert stored.
ALERT_EVENTS = frozenset({"alert_firing", "alert_resolved", "alert_resolved_unseen", "alert_unroutable"})


def _alert_event(kind: str, alertname: str, fault: Any, key: tuple[str, str | None]) -> NewEvent:
    detail = f"{alertname}: {fault.describe()}" if fault is not None else alertname
    return NewEvent(kind, detail=detail, data={"fingerprint": key[0], "starts_at": key[1]})


_INSERT_EVENT = (
    "INSERT INTO events (incident_id, at, kind, step, outcome, attempt, actor, detail, data_json, audit)"
    " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
)
#: ``insert_events`` on Postgres (see ``_INSERT_ALERTS_BULK``): ``seq`` in the rows' order.
_INSERT_EVENTS_BULK = (
    "INSERT INTO events (incident_id, at, kind, step, outcome, attempt, actor, detail, data_json, audit)"
    " SELECT r->>0, r->>1, r->>2, r->>3, r->>4, (r->>5)::integer,"
    " r->>6, r->>7, r->>8, (r->>9)::integer FROM jsonb_array_elements(?::jsonb) WITH ORDINALITY AS e(r, n)"
    " ORDER BY n"
)


def event_row(incident_id: str | None, event: NewEvent, at: datetime) -> tuple[Any, ...]:
    data = dumps(dict(event.data))
    return (
        incident_id,
        ts(at),
        event.kind,
        event.step,
        event.outcome,
        event.attempt,
        event.actor,
        event.detail,
        data,
        int(event.kind not in ALERT_EVENTS),
    )


def append_event(incident_id: str | None, event: NewEvent, at: datetime, when: When | None = None) -> Stmt:
    """Append one event to the audit log, its ``seq`` not read (``{event_seq}`` names it after);
    with ``when``, only if it finds a row (``bot.store.sql.provided``)."""
    appended = put(_INSERT_EVENT, event_row(incident_id, event, at))
    return appended if when is None else provided(appended, when)


def insert_events(events: Sequence[tuple[str | None, NewEvent, datetime]]) -> Stmt:
    """Append to the audit log (append-only: the schema refuses updates and deletes)."""
    return many(_INSERT_EVENT, [event_row(i, e, at) for i, e, at in events], bulk=_INSERT_EVENTS_BULK)


#: An alert's stored state, by fingerprint (the primary key's prefix, so an index search, where a
#: row-value IN would scan the table); matched on startsAt in ``_known``.
_KEYS = (
    "SELECT 'alert' AS what, fingerprint, starts_at, status, incident_id, NULL AS node, NULL AS state,"
    " NULL AS fault_key FROM alerts WHERE fingerprint IN (?*)"
)
#: The active incident of each node, with the fault keys it has.
_ACTIVE = (
    "SELECT DISTINCT 'incident' AS what, NULL AS fingerprint, NULL AS starts_at, NULL AS status,"
    " i.id AS incident_id, i.node, i.state, a.fault_key FROM incidents i LEFT JOIN alerts a"
    " ON a.incident_id = i.id WHERE i.node IN (?*) AND i.state NOT IN {terminal}"
)

Active = tuple[dict[str, tuple[str, str]], dict[str, set[str]]]
#: What ``_look_up`` answers (and ``_expected`` expects): the keys stored, with their state, and
#: ``Active``.
LookedUp = tuple[dict[tuple[str, str], KeyState], dict[str, tuple[str, str]], dict[str, set[str]]]

#: What ``_KEYS`` and ``_ACTIVE`` would answer, confirmed instead of read (``_confirm``): the
#: batch's keys that are stored, with their status and incident (a JSON array of ``[fingerprint,
#: startsAt]`` asked, and their fingerprints, the primary key's prefix, for an index search), and
#: the nodes' active incidents, whether each is open, and their faults. Each is one JSON array of
#: rows in a bytewise order (as Python orders text, whatever the database's collation), compared
#: with the one expected as JSON values, not text: equal only if every row is. An incident without
#: a fault is one row with none, as ``_active`` reads the ``LEFT JOIN``.
_CONFIRM = (
    "SELECT 1 AS confirmed WHERE (SELECT COALESCE(jsonb_agg(jsonb_build_array(fingerprint, starts_at, status,"
    ' incident_id) ORDER BY fingerprint COLLATE "C", starts_at COLLATE "C"), \'[]\'::jsonb) FROM alerts'
    " WHERE fingerprint IN (?*) AND (fingerprint, starts_at) IN"
    " (SELECT k->>0, k->>1 FROM jsonb_array_elements(?::jsonb) AS e(k))) = ?::jsonb"
    " AND (SELECT COALESCE(jsonb_agg(jsonb_build_array(node, id, open, fault_key)"
    ' ORDER BY node COLLATE "C", fault_key COLLATE "C" NULLS FIRST), \'[]\'::jsonb)'
    " FROM (SELECT DISTINCT i.node, i.id, i.state = ? AS open, a.fault_key FROM incidents i"
    " LEFT JOIN alerts a ON a.incident_id = i.id AND a.fault_key IS NOT NULL"
    " WHERE i.node IN (?*) AND i.state NOT IN {terminal}) AS r) = ?::jsonb"
)


def _or_none(faults: list[str]) -> list[str | None]:
    """An incident's fault keys, or one row without any (the ``LEFT JOIN`` of ``_CONFIRM``)."""
    return [*faults] if faults else [None]


def _confirm(
    keys: Sequence[tuple[str, str]],
    found: Mapping[tuple[str, str], KeyState],
    nodes: set[str],
    active: dict[str, tuple[str, str]],
    faults_of: dict[str, set[str]],
) -> Stmt:
    """The transaction commits only if ``_look_up(keys, nodes)`` would answer ``found`` (the keys
    stored, none other), ``active`` (as far as a batch reads a state: open or not) and
    ``faults_of``; else ``Mispredicted`` (Postgres only: ``bot.store.expect``)."""
    asked = sorted(set(keys))
    stored = [[*key, *found[key]] for key in asked if key in found]
    incidents = [
        [node, incident_id, state == State.OPEN.value, fault]
        for node, (incident_id, state) in sorted(active.items())
        for fault in _or_none(sorted(faults_of.get(incident_id, ())))
    ]
    fingerprints = sorted({fingerprint for fingerprint, _ in keys})
    return check(
        _CONFIRM,
        [
            fingerprints,
            dumps(asked),
            dumps(stored),
            State.OPEN.value,
            sorted(nodes),
            dumps(incidents),
        ],
        Mispredicted,
    )


def known_keys(keys: Sequence[tuple[str, str]]) -> Op[dict[tuple[str, str], KeyState]]:
    """Stored state of these keys (one query a chunk)."""
    known: dict[tuple[str, str], KeyState] = {}
    wanted = set(keys)
    for chunk in _chunks(sorted({fingerprint for fingerprint, _ in wanted})):
        _known((yield rows(_KEYS, [chunk])), wanted, known)
    return known


def _active_incidents(nodes: set[str]) -> Op[Active]:
    """The active incident of each node, and the fault keys each already has (one query a chunk)."""
    active: Active = ({}, {})
    for chunk in _chunks(sorted(nodes)):
        _active((yield rows(_ACTIVE, [chunk])), active)
    return active


def _look_up(keys: Sequence[tuple[str, str]], nodes: set[str]) -> Op[LookedUp]:
    """``known_keys`` and ``_active_incidents`` of ``nodes``: in one statement when each list fits
    one query (a batch of deliveries, nearly always), which on Postgres is one round trip less
    with the write lock held; else each on its own."""
    fingerprints = sorted({fingerprint for fingerprint, _ in keys})
    if not nodes or len(fingerprints) > _CHUNK or len(nodes) > _CHUNK:
        stored = yield from known_keys(keys)
        found, faults = (yield from _active_incidents(nodes)) if nodes else ({}, {})
        return stored, found, faults
    answer = yield rows(f"{_KEYS} UNION ALL {_ACTIVE}", [fingerprints, sorted(nodes)])
    known: dict[tuple[str, str], KeyState] = {}
    _known([r for r in answer if r["what"] == "alert"], set(keys), known)
    active: Active = ({}, {})
    _active([r for r in answer if r["what"] != "alert"], active)
    return known, *active


def _known(
    found: Sequence[Any], wanted: set[tuple[str, str]], known: dict[tuple[str, str], KeyState]
) -> None:
    for r in found:
        key = (r["fingerprint"], r["starts_at"])
        if key in wanted:
            known[key] = (r["status"], r["incident_id"])


def _active(found: Sequence[Any], active: Active) -> None:
    incidents, faults = active
    for r in found:
        incidents[r["node"]] = (r["incident_id"], r["state"])
        keys = faults.setdefault(r["incident_id"], set())
        if r["fault_key"] is not None:
            keys.add(r["fault_key"])
