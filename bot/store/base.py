"""The incident store port and the records it speaks in.

Everything pitcrew must not forget lives behind this port: every alert received (keyed by
fingerprint + startsAt), one incident per node with its plan and step cursor, per-step
records (what was done, what pitcrew owns), approvals, switches (pause, breaker) and an
append-only audit log. Methods take ``now`` from the caller: the store reads no clock — except
for the leadership lease (``bot.store.lease``), whose expiry only the store's own clock may judge,
so that processes whose clocks disagree never both lead.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Generic, Literal, Protocol, TypeAlias, TypeVar, get_args

from bot.domain.alerts import AlertStatus
from bot.domain.faults import Fault
from bot.domain.incident import State
from bot.domain.planner import PastIncident, Plan
from bot.store.lease import Deposed as Deposed  # the lease's vocabulary is part of the port
from bot.store.lease import Fence as Fence
from bot.store.lease import Lease as Lease

#: A JSON value as stored. Typed records are encoded to and decoded from it by ``bot.store.codec``.
Json: TypeAlias = str | int | float | bool | list["Json"] | dict[str, "Json"] | None
#: How a Postgres server's commits reach its standbys (``bot.store.postgres.Replication``).
ReplicationMode: TypeAlias = Literal["none", "synchronous", "asynchronous"]
JsonObject: TypeAlias = Mapping[str, Json]
#: A step record: ``running`` (begun; after a crash, interrupted), ``ok``, ``failed`` (escalated),
#: ``held`` (paused before its far-side call; it goes on after resume), ``skipped`` (not applicable, or
#: observe mode), ``undone`` (rolled back), ``superseded`` (a replan
#: dropped it: its result no longer counts).
StepStatus = Literal["running", "held", "ok", "failed", "skipped", "undone", "superseded"]
#: A step whose change no longer stands, whatever its record's progress says: undone by a rollback,
#: superseded by a rung of the repair ladder that does it again, or never run. A rollback passes it
#: by, and a ``capacity`` step so has no node out of its pool.
NOT_STANDING: frozenset[StepStatus] = frozenset({"skipped", "undone", "superseded"})
#: An approval request: ``pending`` until a human decides (``approved``, ``rejected``), its
#: deadline passes (``expired``) or a rollback ends the incident first (``cancelled``).
ApprovalStatus = Literal["pending", "approved", "rejected", "expired", "cancelled"]


class StoreUnavailable(RuntimeError):
    """The store cannot take writes right now (closed, disk full, locked): the caller should retry."""


class StoreRefused(RuntimeError):
    """This pitcrew must not open the store as it is (its schema too new for it, its file where
    other hosts may open it): trying again will not help; the message says what will."""


@dataclass(frozen=True, slots=True)
class Inspection:
    """What ``check-config --live`` learns of the store without opening it (nothing created,
    migrated or written): reached and usable, or what is missing (``bot.probes`` reports it)."""

    system: str
    ok: bool
    detail: str
    missing: tuple[str, ...] = ()


class BadCursor(ValueError):
    """A page cursor this store never handed out (the message says what a cursor looks like)."""


#: Most rows one page of an incident's alerts or events may hold: a read stays short, and so does
#: what it takes from the webhook (bench/read_storm.py: with 1000-row pages a storm of 50 readers
#: pushed the webhook's p99 to ~95 ms, with 250-row pages to ~45 ms, against ~3 ms without reads).
PAGE_MAX = 200
#: Most incidents one list answer holds (each without its alerts and events).
LIST_MAX = 1000
#: Rows of a page when the reader does not say (the API and ``pitcrew incidents show``).
PAGE_DEFAULT = 100
#: The audit event of one change pitcrew made to a far side (``StepContext.acted``): an incident
#: with one holds its node's place under the breaker even after it ended.
ACTION = "action"
#: The timeline event of a notice to humans (``Store.enqueue``); ``ONCE`` is the key in its data
#: under which a step posted it at most once (``Store.told``).
NOTICE = "notice"
ONCE = "once"
#: The event of a step whose result no longer counts (a replan, a climb, a close taken back): the
#: step runs afresh after it, and what it posts then is news, not a repeat of what it posted before.
SUPERSEDED = "step_superseded"
T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Page(Generic[T]):
    """Rows of a longer list, in the list's order; ``next`` is the cursor to pass as ``after`` for
    the rows after these, ``None`` when these are the last."""

    items: tuple[T, ...]
    next: str | None = None


@dataclass(frozen=True, slots=True)
class SentAlert:
    """One alert as Alertmanager sent it, normalised: its identity (fingerprint + startsAt), status,
    node and what the rule gave it."""

    fingerprint: str
    starts_at: datetime
    ends_at: datetime | None
    status: AlertStatus
    alertname: str
    node: str | None
    labels: Mapping[str, str]
    #: As the rule gave them (``summary``, ``runbook_url`` ...).
    annotations: Mapping[str, str]


@dataclass(frozen=True, slots=True)
class IncomingAlert(SentAlert):
    """One alert of a delivery, classified."""

    fault: Fault | None


@dataclass(frozen=True, slots=True)
class Delivery:
    receiver: str
    group_key: str
    status: AlertStatus
    truncated_alerts: int
    alerts: tuple[IncomingAlert, ...]


@dataclass(slots=True)
class IngestOutcome:
    new_alerts: int = 0
    repeated_alerts: int = 0
    resolved: int = 0
    unroutable: int = 0
    opened: list[str] = field(default_factory=list)
    attached: list[str] = field(default_factory=list)
    #: Incidents that had an alert resolve in this delivery.
    resolved_in: list[str] = field(default_factory=list)
    #: Incidents already under way that got a fault they did not have (the engine replans them).
    changed: list[str] = field(default_factory=list)
    #: Incidents already under way whose own fault fired again (a new alert of a fault they have):
    #: after the node's return, the repair did not clear it (``bot.domain.returns``).
    recurred: list[str] = field(default_factory=list)
    #: Alert keys and their state after this delivery, for the store's cache of committed keys.
    cache: dict[tuple[str, str], tuple[AlertStatus, str | None]] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class IncidentRecord:
    id: str
    node: str
    state: State
    opened_at: datetime
    updated_at: datetime
    first_alert_at: datetime | None
    playbook: str | None = None
    mode: str | None = None
    plan: Plan | None = None
    step_index: int = 0
    acted: bool = False
    guarded_at: datetime | None = None
    closed_at: datetime | None = None
    outcome: str = ""
    group_key: str = ""
    faults: tuple[Fault, ...] = ()
    faults_changed: bool = False


@dataclass(frozen=True, slots=True, kw_only=True)
class AlertRecord(SentAlert):
    """A stored alert: where pitcrew filed it and how often Alertmanager sent it."""

    incident_id: str | None
    fault_key: str | None
    deliveries: int
    first_seen: datetime
    last_seen: datetime


@dataclass(frozen=True, slots=True)
class StepRecord:
    incident_id: str
    step: str
    status: StepStatus
    attempts: int
    started_at: datetime | None
    ended_at: datetime | None
    #: The step's result record as stored; the engine decodes it with ``codec.decode_record``.
    result: JsonObject = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class ApprovalRecord:
    incident_id: str
    step: str
    requested_at: datetime
    deadline: datetime
    approvers: tuple[str, ...]
    status: ApprovalStatus
    decided_by: str | None = None
    decided_at: datetime | None = None


@dataclass(frozen=True, slots=True)
class OutboxItem:
    """One notice waiting for (or done with) one destination (``bot.store.outbox``).

    ``attempts`` counts deliveries begun, persisted *before* each one: an item with attempts
    left over from a crash may already have reached the destination, which must look before
    it posts again. ``ref`` is what the destination answered (a Slack message ts)."""

    id: int
    destination: str
    incident_id: str | None
    kind: str
    payload: JsonObject
    created_at: datetime
    attempts: int = 0
    not_before: datetime | None = None
    delivered_at: datetime | None = None
    ref: str | None = None
    last_error: str = ""
    event_seq: int | None = None


@dataclass(frozen=True, slots=True)
class NewEvent:
    """What happened, as the engine hands it to the store for the timeline."""

    kind: str
    step: str | None = None
    outcome: str | None = None
    attempt: int | None = None
    actor: str | None = None
    detail: str = ""
    data: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class GuardReads:
    """What the guards read of the store to admit an incident on a node (``Store.guard_reads``):
    the switches asked for (``None``: not set), the other nodes under remediation, the node's past
    incidents."""

    switches: Mapping[str, Mapping[str, Any] | None]
    nodes_in_remediation: frozenset[str]
    history: list[PastIncident]


@dataclass(frozen=True, slots=True)
class SkippedStep:
    """A step ended as skipped without being run (``Store.steps_skipped``): its result and event."""

    step: str
    result: JsonObject
    event: NewEvent


@dataclass(frozen=True, slots=True, kw_only=True)
class Event(NewEvent):
    """An event as the timeline keeps it: what happened, with its place in the log, its
    incident and its time."""

    seq: int
    incident_id: str | None
    at: datetime


#: What a destination keeps of one incident in ``outbox_refs``, each under ``<what>:<incident>``
#: (``incident_ref``): Slack's thread, link, parent payload, the parent it replaced and why, the
#: parent it stopped editing; Grafana's region and its end. Retention removes every one of them
#: with the incident (``bot.store.retention``): a reference kept under a key made otherwise would
#: outlive it, so destinations make theirs only here.
IncidentRef: TypeAlias = Literal[
    "thread", "link", "parent", "replaced", "replaced-why", "frozen", "region", "end"
]
INCIDENT_REFS: tuple[IncidentRef, ...] = get_args(IncidentRef)


def incident_ref(what: IncidentRef, incident_id: str) -> str:
    """The ``outbox_refs`` key of a destination's reference ``what`` of an incident."""
    return f"{what}:{incident_id}"


def link_key(incident_id: str) -> str:
    """The ``outbox_refs`` key under which a destination keeps the URL where people see the
    incident (its Slack thread); ``Store.incident_links`` reads them."""
    return incident_ref("link", incident_id)


class Store(Protocol):
    async def open(self) -> None: ...
    async def close(self) -> None: ...
    async def ping(self) -> bool: ...
    def describe(self) -> dict[str, Any]:
        """What keeps an acknowledged write, as last seen (``/readyz``'s detail): the kind of store,
        and how its commits are made durable (SQLite's ``synchronous``, Postgres's replication)."""
        ...

    # alerts in, incidents out
    async def ingest(self, delivery: Delivery, now: datetime) -> IngestOutcome: ...
    async def count_repeats(
        self, alerts: Sequence[tuple[str, datetime, AlertStatus]], now: datetime
    ) -> int | None:
        """Fast path for redeliveries: ``(fingerprint, startsAt, status)`` all known in that status:
        counted, and their number returned; ``None`` (nothing counted) if any is new or changed."""
        ...

    async def incident(self, incident_id: str) -> IncidentRecord | None: ...
    async def incidents(
        self, *, active_only: bool = False, node: str | None = None, limit: int = 100
    ) -> list[IncidentRecord]: ...
    async def active(self) -> list[tuple[str, State, datetime]]:
        """Id, state and opening time of every non-terminal incident (cheap: no faults)."""
        ...

    async def last_opened(self) -> int:
        """The ``seq`` of the newest incident, closed or not (0: none yet)."""
        ...

    async def opened_after(self, seq: int) -> list[tuple[int, str, State]]:
        """``seq``, id and state of every incident newer than ``seq``, oldest first, closed ones
        too: what was opened since a look that saw ``seq`` last (``last_opened``), a few rows."""
        ...

    async def alerts_of(self, incident_id: str) -> list[AlertRecord]:
        """Every alert of the incident, first seen first (the engine's view; the API reads pages)."""
        ...

    async def firing(self, incident_id: str) -> int:
        """How many of the incident's alerts fire now: one count, no alert read (a watcher at
        ``close`` asks at every new occurrence)."""
        ...

    async def alerts_on(
        self, nodes: Sequence[str], since: datetime, *, limit: int, other_than: str = ""
    ) -> list[AlertRecord]:
        """At most ``limit`` alerts of these nodes, whatever their incident, firing or started or
        ended since ``since``, latest first; none named ``other_than``."""
        ...

    async def events_of(self, incident_id: str) -> list[Event]: ...
    async def alerts_page(
        self, incident_id: str, *, limit: int, after: str | None = None
    ) -> Page[AlertRecord]:
        """At most ``limit`` (1..``PAGE_MAX``) alerts of the incident after the cursor ``after``, in
        ``alerts_of`` order; ``BadCursor`` for a cursor that is not one."""
        ...

    async def events_page(self, incident_id: str, *, limit: int, after: str | None = None) -> Page[Event]:
        """At most ``limit`` (1..``PAGE_MAX``) events of the incident after the cursor ``after`` (an
        event's ``seq``), oldest first; ``BadCursor`` for a cursor that is not one."""
        ...

    async def events_since(self, seq: int, limit: int = 1000) -> list[Event]: ...
    async def audit_log(
        self,
        *,
        after: int = 0,
        since: datetime | None = None,
        until: datetime | None = None,
        limit: int = 1000,
    ) -> list[Event]:
        """The audit log, every incident's and none's: at most ``limit`` events after ``seq``
        ``after`` whose ``at`` is at or after ``since`` and before ``until``, oldest ``seq`` first.
        Read page after page (``after`` = the last one's ``seq``) it streams the whole log."""
        ...

    # the engine's writes
    async def save_plan(
        self, incident_id: str, plan: Plan, events: Sequence[NewEvent], now: datetime
    ) -> None: ...
    async def transition(
        self,
        incident_id: str,
        state: State,
        now: datetime,
        *,
        event: NewEvent | None = None,
        outcome: str | None = None,
        guarded: bool = False,
        unless: str | None = None,
    ) -> IncidentRecord: ...
    async def advance(self, incident_id: str, step_index: int, now: datetime) -> None: ...
    async def step_started(
        self, incident_id: str, step: str, attempt: int, now: datetime, *, acted: bool
    ) -> None: ...
    async def step_finished(
        self,
        incident_id: str,
        step: str,
        status: StepStatus,
        now: datetime,
        *,
        result: JsonObject | None = None,
        event: NewEvent,
        step_index: int | None = None,
    ) -> None:
        """The step's end, with its event; ``step_index``: and the node track's cursor moved there,
        in the same write."""
        ...

    async def steps_skipped(
        self, incident_id: str, skipped: Sequence[SkippedStep], step_index: int | None, now: datetime
    ) -> None:
        """Each of ``skipped`` ended as skipped, with its event, and the node track's cursor moved to
        ``step_index`` (``None``: not moved), in one write."""
        ...

    async def steps_of(self, incident_id: str) -> dict[str, StepRecord]: ...
    async def incident_and_steps(
        self, incident_id: str
    ) -> tuple[IncidentRecord | None, dict[str, StepRecord]]:
        """``incident`` and ``steps_of`` in one read (one round trip on Postgres)."""
        ...

    async def record(self, incident_id: str | None, event: NewEvent, now: datetime) -> None: ...
    async def step_progress(self, incident_id: str, step: str, progress: JsonObject, now: datetime) -> None:
        """Store the step's progress record *before* acting, so a resumed step knows its intent."""
        ...

    async def ack_faults(self, incident_id: str) -> None: ...
    async def request_rollback(
        self, incident_id: str, result: JsonObject, event: NewEvent, now: datetime, *, again: bool = False
    ) -> bool:
        """Record a rollback request (the ``rollback`` step, running, with ``result``) and ``event``,
        unless the incident has one already, requested or done (``again``: unless it has one under
        way; a done one is started anew); whether this call recorded it."""
        ...

    async def rollbacks_requested(self) -> list[str]:
        """Incidents, terminal or not, whose rollback was requested and is not done yet, oldest
        first: by any process (the leader carries out what a standby recorded), held by a pause,
        or cut by a crash — each goes on. Done yet means the incident shows it: a rollback that
        undid everything and was cut before the incident ended ``rolled_back`` is listed too."""
        ...

    # one actor per store (``bot.store.lease``): expiry is judged by the store's own clock
    async def lease(self) -> Lease | None:
        """The leadership row as it is now (``None``: nobody ever led this store)."""
        ...

    async def acquire_lease(self, holder: str, ttl: timedelta) -> Lease:
        """Take the lease for ``ttl`` if it is free, expired or ``holder``'s, with the epoch raised
        by one; the row as it is after (``lease.holder != holder``: someone else leads)."""
        ...

    async def renew_lease(self, holder: str, epoch: int, ttl: timedelta) -> Lease | None:
        """Extend the lease to ``ttl`` from now, only if ``holder`` still holds ``epoch`` (expired
        or not, as long as nobody took it over); ``None`` if not."""
        ...

    async def release_lease(self, holder: str, epoch: int) -> None:
        """End ``holder``'s term now (graceful shutdown), if it still holds ``epoch``."""
        ...

    def fenced(self, fence: Fence) -> Store:
        """This store for the engine of a process that may lead: reads as they are, every write
        checked against ``fence`` in its own transaction (``Deposed`` if the fence's holder and
        epoch are not the leadership row's). Webhook ingest and human commands use the unfenced
        store: every process takes them.

        The check must hold until the commit: SQLite's ``BEGIN IMMEDIATE`` write lock does that; a
        Postgres store starts each fenced transaction with ``SELECT 1 FROM leadership WHERE holder
        = $1 AND epoch = $2 FOR SHARE`` (a takeover's UPDATE of the row waits for the commit) and
        judges the lease with the database's ``now()``."""
        ...

    # approvals, switches, history
    async def request_approval(
        self, incident_id: str, step: str, approvers: Sequence[str], deadline: datetime, now: datetime
    ) -> ApprovalRecord: ...
    async def approval(self, incident_id: str) -> ApprovalRecord | None: ...
    async def decide_approval(
        self, incident_id: str, status: ApprovalStatus, actor: str, now: datetime
    ) -> ApprovalRecord | None: ...
    async def switch(self, name: str) -> Mapping[str, Any] | None: ...
    async def set_switch(
        self, name: str, value: Mapping[str, Any] | None, actor: str, now: datetime
    ) -> None: ...
    async def memory(self, watch: str) -> dict[str, JsonObject]:
        """What ``watch`` remembered, by key (``remember``): one of pitcrew's own alert sources
        between its looks, or the pools' index of ended incidents still holding a node
        (``bot.engine.steps.capacity.HELD``)."""
        ...

    async def remember(self, watch: str, changed: Mapping[str, JsonObject | None], now: datetime) -> None:
        """Store what ``watch`` remembers of each key in ``changed`` (``None``: forget it), in one
        write; fenced like every engine write, so a deposed process keeps nothing."""
        ...

    async def history(self, node: str, since: datetime, exclude: str | None = None) -> list[PastIncident]: ...
    async def nodes_in_remediation(self, since: datetime, exclude_node: str | None = None) -> frozenset[str]:
        """Nodes of incidents admitted since ``since``: while active, and after they ended only
        if pitcrew changed something for them (an ``ACTION`` event)."""
        ...

    async def guard_reads(
        self,
        switches: Sequence[str],
        *,
        node: str,
        remediation_since: datetime,
        history_since: datetime,
        exclude: str,
    ) -> GuardReads:
        """``switch`` of each of ``switches``, ``nodes_in_remediation`` but ``node``, and ``history``
        of ``node`` but the incident ``exclude``, in one read (one round trip on Postgres)."""
        ...

    # the outbox of notices (``bot.store.outbox``)
    async def enqueue(
        self,
        incident_id: str | None,
        event: NewEvent,
        kind: str,
        payload: JsonObject,
        destinations: Sequence[str],
        now: datetime,
        *,
        once: str | None = None,
    ) -> int:
        """Append ``event`` to the timeline and, in the same transaction, one outbox row per
        destination carrying ``payload``; the event's seq.

        With ``once`` (the event must name its ``step``), the notice is one that step posts at
        most once: when ``told`` finds it (for the event's kind) in the same transaction, nothing
        is written and that event's seq is returned; else the event keeps ``once`` in its data
        under ``ONCE``. A ``ValueError`` without a step."""
        ...

    async def told(self, incident_id: str | None, step: str, once: str) -> int | None:
        """The seq of the ``NOTICE`` event that ``step`` enqueued for the incident under ``once``
        since it last ran afresh (after its latest ``SUPERSEDED`` event, if any); ``None``: not
        posted in this run of the step. Without an incident (a notice about pitcrew as a whole),
        ever: ``once`` names what the notice is about."""
        ...

    async def outbox_pending(self, destination: str, limit: int = 100) -> list[OutboxItem]:
        """Undelivered items of ``destination``, oldest first (the order of delivery per incident)."""
        ...

    async def outbox_item(self, item_id: int) -> OutboxItem | None: ...
    async def outbox_attempt(self, item_id: int, now: datetime) -> None:
        """Count a delivery begun, before it is (so a crash leaves the mark)."""
        ...

    async def outbox_delivered(self, item_id: int, ref: str | None, now: datetime) -> None: ...
    async def outbox_defer(self, item_id: int, not_before: datetime, error: str) -> None: ...
    async def outbox_ref(self, destination: str, key: str) -> str | None:
        """A reference a destination keeps (``slack``, ``thread:pc-00042``) → ``C0GPUOPS/1795941999.000200``."""
        ...

    async def set_outbox_ref(self, destination: str, key: str, ref: str, now: datetime) -> None: ...
    async def incident_links(self, incident_id: str) -> dict[str, str]:
        """Where people see the incident, by destination (``slack`` → the thread's permalink):
        the references kept under ``link_key(incident_id)``."""
        ...
