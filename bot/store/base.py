"""The incident store port and the records it speaks in.

Everything pitcrew must not forget lives behind this port: every alert received (keyed by
fingerprint + startsAt), one incident per node with its plan and step cursor, per-step
records (what was done, what pitcrew owns), approvals, switches (pause, breaker) and an
append-only audit log. Methods take ``now`` from the caller: the store reads no clock.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Generic, Protocol, TypeAlias, TypeVar

from bot.domain.faults import Fault
from bot.domain.incident import State
from bot.domain.planner import PastIncident, Plan

#: A JSON value as stored. Typed records are encoded to and decoded from it by ``bot.store.codec``.
Json: TypeAlias = str | int | float | bool | list["Json"] | dict[str, "Json"] | None
JsonObject: TypeAlias = Mapping[str, Json]


class StoreUnavailable(RuntimeError):
    """The store cannot take writes right now (closed, disk full, locked): the caller should retry."""


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
T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Page(Generic[T]):
    """Rows of a longer list, in the list's order; ``next`` is the cursor to pass as ``after`` for
    the rows after these, ``None`` when these are the last."""

    items: tuple[T, ...]
    next: str | None = None


@dataclass(frozen=True, slots=True)
class IncomingAlert:
    """One alert of a delivery, already normalised and classified."""

    fingerprint: str
    starts_at: datetime
    ends_at: datetime | None
    status: str
    alertname: str
    node: str | None
    labels: Mapping[str, str]
    annotations: Mapping[str, str]
    fault: Fault | None


@dataclass(frozen=True, slots=True)
class Delivery:
    receiver: str
    group_key: str
    status: str
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
    #: Alert keys and their state after this delivery, for the store's cache of committed keys.
    cache: dict[tuple[str, str], tuple[str, str | None]] = field(default_factory=dict)


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


@dataclass(frozen=True, slots=True)
class AlertRecord:
    fingerprint: str
    starts_at: datetime
    ends_at: datetime | None
    status: str
    alertname: str
    node: str | None
    incident_id: str | None
    fault_key: str | None
    deliveries: int
    first_seen: datetime
    last_seen: datetime
    labels: Mapping[str, str]
    #: As the rule gave them (``summary``, ``runbook_url`` ...).
    annotations: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Event:
    seq: int
    incident_id: str | None
    at: datetime
    kind: str
    step: str | None = None
    outcome: str | None = None
    attempt: int | None = None
    actor: str | None = None
    detail: str = ""
    data: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class StepRecord:
    incident_id: str
    step: str
    status: str  # running | ok | failed | skipped | undone | superseded
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
    status: str  # pending | approved | rejected | expired
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
    kind: str
    step: str | None = None
    outcome: str | None = None
    attempt: int | None = None
    actor: str | None = None
    detail: str = ""
    data: Mapping[str, Any] = field(default_factory=dict)


def link_key(incident_id: str) -> str:
    """The ``outbox_refs`` key under which a destination keeps the URL where people see the
    incident (its Slack thread); ``Store.incident_links`` reads them."""
    return f"link:{incident_id}"


class Store(Protocol):
    async def open(self) -> None: ...
    async def close(self) -> None: ...
    async def ping(self) -> bool: ...

    # alerts in, incidents out
    async def ingest(self, delivery: Delivery, now: datetime) -> IngestOutcome: ...
    def count_repeats(self, alerts: Sequence[tuple[str, datetime, str]], now: datetime) -> int | None:
        """Fast path for redeliveries: ``(fingerprint, startsAt, status)`` all known in that status."""
        ...

    async def incident(self, incident_id: str) -> IncidentRecord | None: ...
    async def incidents(
        self, *, active_only: bool = False, node: str | None = None, limit: int = 100
    ) -> list[IncidentRecord]: ...
    async def active(self) -> list[tuple[str, State, datetime]]:
        """Id, state and opening time of every non-terminal incident (cheap: no faults)."""
        ...

    async def rollbacks_under_way(self) -> list[str]:
        """Incidents, terminal or not, whose rollback was requested and has not finished (read
        once at start: a rollback held by a pause, or cut by a crash, goes on)."""
        ...

    async def alerts_of(self, incident_id: str) -> list[AlertRecord]:
        """Every alert of the incident, first seen first (the engine's view; the API reads pages)."""
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
        status: str,
        now: datetime,
        *,
        result: JsonObject | None = None,
        event: NewEvent,
    ) -> None: ...
    async def steps_of(self, incident_id: str) -> dict[str, StepRecord]: ...
    async def record(self, incident_id: str | None, event: NewEvent, now: datetime) -> None: ...
    async def step_progress(self, incident_id: str, step: str, progress: JsonObject, now: datetime) -> None:
        """Store the step's progress record *before* acting, so a resumed step knows its intent."""
        ...

    async def ack_faults(self, incident_id: str) -> None: ...

    # approvals, switches, history
    async def request_approval(
        self, incident_id: str, step: str, approvers: Sequence[str], deadline: datetime, now: datetime
    ) -> ApprovalRecord: ...
    async def approval(self, incident_id: str) -> ApprovalRecord | None: ...
    async def decide_approval(
        self, incident_id: str, status: str, actor: str, now: datetime
    ) -> ApprovalRecord | None: ...
    async def switch(self, name: str) -> Mapping[str, Any] | None: ...
    async def set_switch(
        self, name: str, value: Mapping[str, Any] | None, actor: str, now: datetime
    ) -> None: ...
    async def history(self, node: str, since: datetime, exclude: str | None = None) -> list[PastIncident]: ...
    async def nodes_in_remediation(self, since: datetime, exclude_node: str | None = None) -> frozenset[str]:
        """Nodes of incidents admitted since ``since``: while active, and after they ended only
        if pitcrew changed something for them (an ``ACTION`` event)."""
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
    ) -> int:
        """Append ``event`` to the timeline and, in the same transaction, one outbox row per
        destination carrying ``payload``; the event's seq."""
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
