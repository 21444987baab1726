"""The store port over SQL, once for both databases: each method is one operation of
``bot.store.queries`` (or ``outbox``), run through the store's two drivers.

A concrete store (``SqliteStore``, ``PostgresStore``) supplies how an operation runs:

* ``_read(op)``: outside any write transaction (SQLite's reader thread, a Postgres connection);
* ``_transact(make)``: in one write transaction, with the store's own write lock, returning the
  operation's result and whether it routed a timeline event to an outbox;
* ``_lease_write(make)``: the lease's own writes, never fenced (a standby must be able to take it);
* ``_bulk_transact(make)``: a write that may touch many rows (a fleet's watch memory), ``_transact``
  unless the store runs such writes elsewhere (SQLite: in its writer thread, off the event loop);
* ``_prune_transact(make)``: retention's transactions, each store's own way (SQLite: on the event
  loop, committed without an fsync of their own, ``bot.store.writer.Redoable``; Postgres: beside
  its other writes, without the write lock, ``PostgresStore._prune_transact``).

A write is handed over as ``make``, a function that makes the operation, never as the operation
itself: a generator runs once, and SQLite's writer may run a write twice — in a batch that rolled
back because another write in it failed, then again alone.

plus what truly differs: opening, readiness, ingest's fast paths. Everything else — the fence
checked in the write's own transaction, routing timeline events to outboxes, the reads and the
engine's writes — is here.
"""

from __future__ import annotations

import asyncio
import copy
import time
from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable, Mapping, Sequence
from datetime import datetime, timedelta
from functools import partial
from typing import Any, Self

from bot.domain.alerts import dedupe_key
from bot.domain.faults import Fault
from bot.domain.incident import State
from bot.domain.planner import PastIncident, Plan
from bot.store import codec, queries, retention
from bot.store import outbox as _outbox
from bot.store.base import (
    NOTICE,
    AlertRecord,
    ApprovalRecord,
    ApprovalStatus,
    Event,
    GuardReads,
    IncidentRecord,
    JsonObject,
    Lease,
    NewEvent,
    OutboxItem,
    Page,
    SkippedStep,
    StepRecord,
    StepStatus,
    link_key,
)
from bot.store.lease import Deposed, Fence
from bot.store.sql import Dialect, Op, Stmt, T, When, both, holds, reads, single


class SqlStore(ABC):
    dialect: Dialect
    #: How long one prune transaction's statements should take (``prune``).
    _prune_budget: float = retention.BUDGET
    #: Alerts a prune's first transaction removes at most (then sized by ``_prune_budget``).
    _prune_start: int = retention.BATCH
    #: How many times as long as a prune transaction took the prune waits before the next.
    _prune_pace: float = retention.PACE

    def __init__(self, clock: Callable[[], datetime] | None) -> None:
        #: The lease's clock: ``None`` is the database's own; tests pass fake time.
        self._clock = clock
        #: Set on a fenced view (``fenced``): every write checks it in its transaction.
        self._fence: Fence | None = None
        #: Event kind → outbox destinations it is also written to (``route_events``).
        self._routes: dict[str, tuple[str, ...]] = {}
        self._on_routed: list[Callable[[], None]] = []

    # ---------------------------------------------------------------- the drivers
    @abstractmethod
    async def _read(self, op: Op[T]) -> T: ...

    @abstractmethod
    async def _transact(self, make: Callable[[], Op[T]]) -> tuple[T, bool]: ...

    @abstractmethod
    async def _lease_write(self, make: Callable[[], Op[T]]) -> T: ...

    @abstractmethod
    async def _prune_transact(self, make: Callable[[], Op[T]]) -> tuple[T, bool]: ...

    def route_events(
        self, kinds: frozenset[str], destination: str, *, wake: Callable[[], None] | None = None
    ) -> None:
        """Timeline events of ``kinds`` also go to ``destination``'s outbox, in their own transaction
        (step outcomes and decisions for Slack's thread). Set up before the store is used.

        ``wake`` (the outbox sender's) is called once a write that routed an event has committed,
        so a routed notice leaves at once instead of at the sender's next idle poll."""
        for kind in kinds:
            self._routes[kind] = (*self._routes.get(kind, ()), destination)
        if wake is not None:
            self._on_routed.append(wake)

    def fenced(self, fence: Fence) -> Self:
        """This store (same connections and routes), every write checked against ``fence``."""
        view = copy.copy(self)
        view._fence = fence
        return view

    async def _bulk_transact(self, make: Callable[[], Op[T]]) -> tuple[T, bool]:
        """A write that may touch many rows: by default as every other write, ``_transact``."""
        return await self._transact(make)

    async def _write(
        self,
        make: Callable[[], Op[T]],
        *,
        fence: bool = True,
        transact: Callable[[Callable[[], Op[T]]], Awaitable[tuple[T, bool]]] | None = None,
        routed_if: Callable[[T], bool] | None = None,
    ) -> T:
        """Run ``op`` in one write transaction (``transact``, else ``_transact``); on a fenced
        view, first check in that transaction that the leadership row still carries this process's
        holder and epoch. After the commit, wake the outbox if the operation routed an event
        (``routed_if``: if its result says its rows, written ``provided``, were made)."""
        view_fence = self._fence if fence else None
        token = view_fence.token() if view_fence is not None else None  # Deposed before any I/O
        run = transact or self._transact
        try:
            value, routed = await run(lambda: queries.fenced(token, make()))
        except Deposed as exc:
            if view_fence is not None:
                view_fence.deposed(str(exc))
            raise
        if routed and (routed_if is None or routed_if(value)):
            for wake in self._on_routed:
                wake()
        return value

    async def _run(self, stmt: Stmt) -> Any:
        return await self._write(lambda: single(stmt))

    async def _put(self, stmt: Stmt) -> None:
        """A write of one statement whose answer nobody reads (``put``): on Postgres it goes with
        its transaction's ``COMMIT``, or, in a group of the engine's writes
        (``bot.store.postgres._Writes.write``), with the statements after it, never in a round trip
        of its own while the group holds the write lock."""
        assert stmt.kind == "many", "a statement whose answer is read runs with _run"

        def op() -> Op[None]:
            yield stmt

        await self._write(op)

    def _events(
        self, incident_id: str | None, events: Sequence[NewEvent], now: datetime, when: When | None = None
    ) -> Op[None]:
        """Append to the timeline and, for routed kinds, to the outbox, in the caller's transaction;
        with ``when``, only if it finds a row."""
        for event in events:
            yield from _outbox.route(incident_id, event, self._routes.get(event.kind, ()), now, when)

    def _alert(self, alert: AlertRecord) -> AlertRecord:
        """An alert as read, with what the store knows and has not written yet (SQLite's counters)."""
        return alert

    # ---------------------------------------------------------------------- reads
    async def incident(self, incident_id: str) -> IncidentRecord | None:
        return await self._read(queries.incident(incident_id))

    async def incidents(
        self, *, active_only: bool = False, node: str | None = None, limit: int = 100
    ) -> list[IncidentRecord]:
        return await self._read(queries.incidents(active_only, node, limit))

    async def faults_of(self, incident_ids: Sequence[str]) -> dict[str, tuple[Fault, ...]]:
        return await self._read(queries.faults(incident_ids))

    async def active(self) -> list[tuple[str, State, datetime]]:
        return await self._read(queries.active())

    async def last_opened(self) -> int:
        return await self._read(queries.last_opened())

    async def opened_after(self, seq: int) -> list[tuple[int, str, State]]:
        return await self._read(queries.opened_after(seq))

    async def alerts_of(self, incident_id: str) -> list[AlertRecord]:
        return [self._alert(a) for a in await self._read(queries.alerts_of(incident_id))]

    async def firing(self, incident_id: str) -> int:
        return await self._read(queries.firing(incident_id))

    async def alerts_on(
        self, nodes: Sequence[str], since: datetime, *, limit: int, other_than: str = ""
    ) -> list[AlertRecord]:
        return [self._alert(a) for a in await self._read(queries.alerts_on(nodes, since, limit, other_than))]

    async def alerts_page(
        self, incident_id: str, *, limit: int, after: str | None = None
    ) -> Page[AlertRecord]:
        page = await self._read(queries.alerts_page(incident_id, limit, after))
        return Page(tuple(self._alert(a) for a in page.items), page.next)

    async def alert(self, fingerprint: str, starts_at: datetime) -> AlertRecord | None:
        found = await self._read(queries.alert(dedupe_key(fingerprint, starts_at)))
        return self._alert(found) if found is not None else None

    async def events_of(self, incident_id: str) -> list[Event]:
        return await self._read(queries.events_of(incident_id))

    async def events_page(self, incident_id: str, *, limit: int, after: str | None = None) -> Page[Event]:
        return await self._read(queries.events_page(incident_id, limit, after))

    async def events_since(self, seq: int, limit: int = 1000) -> list[Event]:
        return await self._read(queries.events_since(seq, limit))

    async def audit_log(
        self,
        *,
        after: int = 0,
        since: datetime | None = None,
        until: datetime | None = None,
        limit: int = 1000,
    ) -> list[Event]:
        return await self._read(queries.audit_log(after, since, until, limit))

    async def steps_of(self, incident_id: str) -> dict[str, StepRecord]:
        return await self._read(queries.steps_of(incident_id))

    async def incident_and_steps(
        self, incident_id: str
    ) -> tuple[IncidentRecord | None, dict[str, StepRecord]]:
        return await self._read(both(queries.incident(incident_id), queries.steps_of(incident_id)))

    async def approval(self, incident_id: str) -> ApprovalRecord | None:
        return await self._read(queries.approval(incident_id))

    async def switch(self, name: str) -> Mapping[str, Any] | None:
        return await self._read(queries.switch(name))

    async def memory(self, watch: str) -> dict[str, JsonObject]:
        return await self._read(queries.memory(watch))

    async def remember(self, watch: str, changed: Mapping[str, JsonObject | None], now: datetime) -> None:
        if changed:
            await self._write(lambda: queries.remember(watch, changed, now), transact=self._bulk_transact)

    async def history(self, node: str, since: datetime, exclude: str | None = None) -> list[PastIncident]:
        return await self._read(queries.history(node, since, exclude))

    async def nodes_in_remediation(self, since: datetime, exclude_node: str | None = None) -> frozenset[str]:
        return await self._read(queries.nodes_in_remediation(since, exclude_node))

    async def guard_reads(
        self,
        switches: Sequence[str],
        *,
        node: str,
        remediation_since: datetime,
        history_since: datetime,
        exclude: str,
    ) -> GuardReads:
        found = await self._read(
            reads(
                [
                    *(queries.switch(name) for name in switches),
                    queries.nodes_in_remediation(remediation_since, node),
                    queries.history(node, history_since, exclude),
                ]
            )
        )
        *values, remediating, history = found
        return GuardReads(dict(zip(switches, values, strict=True)), remediating, history)

    async def rollbacks_requested(self) -> list[str]:
        return await self._read(queries.rollbacks_requested())

    # --------------------------------------------------------------------- writes
    async def record(self, incident_id: str | None, event: NewEvent, now: datetime) -> None:
        await self._write(lambda: self._events(incident_id, [event], now))

    async def save_plan(
        self, incident_id: str, plan: Plan, events: Sequence[NewEvent], now: datetime
    ) -> None:
        document = codec.dumps(codec.encode_plan(plan))

        def op() -> Op[None]:
            yield queries.save_plan(incident_id, document, plan.playbook, plan.mode.value, now)
            for event in events:
                yield from _outbox.route(incident_id, event, (), now)  # the timeline only, as before

        await self._write(op)

    async def ack_faults(self, incident_id: str) -> None:
        await self._put(queries.ack_faults(incident_id))

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
    ) -> IncidentRecord:
        """Move an incident. ``unless="new_fault"`` skips the move if a new fault attached
        meanwhile; ``unless="firing"`` also if any of its alerts still fires. Decided inside the
        write, so a delivery landing at the same moment never attaches to an incident that then
        closes. Its event is written if it moved, decided in the database (``queries.transition``):
        nothing is read back, so on Postgres the move is one message with the writes grouped with
        it (``bot.store.postgres._Writes.write``), the server's implicit transaction."""
        await self._write(
            lambda: self._move(
                incident_id, state, now, event, outcome=outcome, guarded=guarded, unless=unless
            ),
            routed_if=bool,
        )
        record = await self.incident(incident_id)
        assert record is not None
        self._moved(record)
        return record

    def _move(
        self,
        incident_id: str,
        state: State,
        now: datetime,
        event: NewEvent | None,
        *,
        outcome: str | None,
        guarded: bool,
        unless: str | None,
    ) -> Op[bool]:
        """A transition's operation (``transition``): the move, and its event provided it moved;
        its result, whether routed rows were made (the outbox is woken only then), read last, with
        the ``COMMIT``, or in a group with the message it is in (``later``)."""
        update, moved = queries.transition(
            incident_id, state, now, outcome=outcome, guarded=guarded, unless=unless
        )
        yield update
        if event is None:
            return False
        yield from self._events(incident_id, [event], now, moved)
        if not self._routes.get(event.kind):
            return False
        return (yield from single(holds(moved))) is not None

    def _moved(self, record: IncidentRecord) -> None:
        """An incident this process moved, as read after the move committed (Postgres: what its
        batches expect of the node, ``bot.store.expect``)."""
        return None

    async def advance(self, incident_id: str, step_index: int, now: datetime) -> None:
        await self._put(queries.advance(incident_id, step_index, now))

    async def step_started(
        self, incident_id: str, step: str, attempt: int, now: datetime, *, acted: bool
    ) -> None:
        def op() -> Op[None]:
            yield queries.step_started(incident_id, step, attempt, now)
            if acted:
                yield queries.acted(incident_id)
            started = NewEvent("step_started", step=step, attempt=attempt)
            yield from _outbox.route(incident_id, started, (), now)  # never routed

        await self._write(op)

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
        ended = [(step, status, codec.dumps(dict(result or {})))]
        await self._write(lambda: self._steps_ended(incident_id, ended, [event], step_index, now))

    async def steps_skipped(
        self, incident_id: str, skipped: Sequence[SkippedStep], step_index: int | None, now: datetime
    ) -> None:
        ended: list[tuple[str, StepStatus, str]] = [
            (s.step, "skipped", codec.dumps(dict(s.result))) for s in skipped
        ]
        events = [s.event for s in skipped]
        await self._write(lambda: self._steps_ended(incident_id, ended, events, step_index, now))

    def _steps_ended(
        self,
        incident_id: str,
        ended: Sequence[tuple[str, StepStatus, str]],
        events: Sequence[NewEvent],
        step_index: int | None,
        now: datetime,
    ) -> Op[None]:
        """Steps' ends (step, status, result document), their events, and the node track's cursor
        moved to ``step_index`` (``None``: not moved): ``step_finished``'s and ``steps_skipped``'s."""
        for step, status, document in ended:
            yield queries.step_finished(incident_id, step, status, now, document)
        yield from self._events(incident_id, events, now)
        if step_index is not None:
            yield queries.advance(incident_id, step_index, now)

    async def request_rollback(
        self, incident_id: str, result: JsonObject, event: NewEvent, now: datetime, *, again: bool = False
    ) -> bool:
        document = codec.dumps(dict(result))

        def op() -> Op[bool]:
            recorded = yield queries.request_rollback(incident_id, document, now, again=again)
            if recorded:
                yield from self._events(incident_id, [event], now)
            return bool(recorded)

        return await self._write(op)

    async def step_progress(self, incident_id: str, step: str, progress: JsonObject, now: datetime) -> None:
        await self._put(queries.step_progress(incident_id, step, codec.dumps(dict(progress)), now))

    async def request_approval(
        self, incident_id: str, step: str, approvers: Sequence[str], deadline: datetime, now: datetime
    ) -> ApprovalRecord:
        await self._put(queries.request_approval(incident_id, step, approvers, deadline, now))
        record = await self.approval(incident_id)
        assert record is not None
        return record

    async def decide_approval(
        self, incident_id: str, status: ApprovalStatus, actor: str, now: datetime
    ) -> ApprovalRecord | None:
        changed = await self._run(queries.decide_approval(incident_id, status, actor, now))
        return await self.approval(incident_id) if changed else None

    async def set_switch(self, name: str, value: Mapping[str, Any] | None, actor: str, now: datetime) -> None:
        await self._put(queries.set_switch(name, value, actor, now))

    # --------------------------------------------------------------------- outbox
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
        if once is not None and event.step is None:
            raise ValueError("a notice posted once belongs to a step")
        return await self._write(
            lambda: _outbox.enqueue(incident_id, event, kind, payload, destinations, now, once)
        )

    async def told(self, incident_id: str | None, step: str, once: str) -> int | None:
        return await self._read(_outbox.told(incident_id, NOTICE, step, once))

    async def outbox_pending(self, destination: str, limit: int = 100) -> list[OutboxItem]:
        return await self._read(_outbox.pending(destination, limit))

    async def outbox_item(self, item_id: int) -> OutboxItem | None:
        return await self._read(_outbox.item(item_id))

    async def outbox_attempt(self, item_id: int, now: datetime) -> None:
        await self._put(_outbox.attempt(item_id))

    async def outbox_delivered(self, item_id: int, ref: str | None, now: datetime) -> None:
        await self._put(_outbox.delivered(item_id, ref, now))

    async def outbox_defer(self, item_id: int, not_before: datetime, error: str) -> None:
        await self._put(_outbox.defer(item_id, not_before, error))

    async def outbox_ref(self, destination: str, key: str) -> str | None:
        return await self._read(_outbox.ref(destination, key))

    async def set_outbox_ref(self, destination: str, key: str, ref: str, now: datetime) -> None:
        await self._put(_outbox.set_ref(destination, key, ref, now))

    async def incident_links(self, incident_id: str) -> dict[str, str]:
        return await self._read(_outbox.refs_by_key(link_key(incident_id)))

    # ---------------------------------------------------------------------- lease
    def _now(self) -> datetime | None:
        return self._clock() if self._clock is not None else None

    async def lease(self) -> Lease | None:
        return await self._read(queries.lease(self.dialect, self._now()))

    async def acquire_lease(self, holder: str, ttl: timedelta) -> Lease:
        now = self._now()
        return await self._lease_write(
            lambda: queries.acquire_lease(self.dialect, now, holder, ttl.total_seconds())
        )

    async def renew_lease(self, holder: str, epoch: int, ttl: timedelta) -> Lease | None:
        now = self._now()
        return await self._lease_write(
            lambda: queries.renew_lease(self.dialect, now, holder, epoch, ttl.total_seconds())
        )

    async def release_lease(self, holder: str, epoch: int) -> None:
        stmt = queries.release_lease(self.dialect, self._now(), holder, epoch)
        await self._lease_write(lambda: single(stmt))

    # ------------------------------------------------------------------ retention
    async def prune(self, before: datetime, *, batch: int = retention.BATCH) -> retention.Pruned:
        """Remove what ``bot.store.retention`` says is past ``before``, one bounded transaction at a
        time (each fenced: only the leader prunes), each after the writes queued before it
        (``_turn``), sized so its statements take about ``_prune_budget`` and followed by a
        pause as long as the whole write took times ``_prune_pace``; the rows removed."""
        total = retention.Pruned()
        size, budget = min(batch, self._prune_start), self._prune_budget
        while True:
            await self._turn()
            started = time.monotonic()
            done = await self._write(
                partial(retention.prune_batch, before, size), transact=self._prune_transact
            )
            took = time.monotonic() - started
            self._pruned(done)
            total.add(done)
            if not done.more:
                return total
            if done.took > budget:
                size = max(min(retention.MIN_BATCH, batch), size // 2)
            elif done.took < budget / 2:
                size = min(batch, size * 2)
            await asyncio.sleep(took * self._prune_pace)

    async def _turn(self) -> None:  # noqa: B027 - a hook, nothing by default
        """Wait (at most ``retention.YIELD``) for the writes already waiting to go first."""

    def _pruned(self, done: retention.Pruned) -> None:  # noqa: B027 - a hook, nothing by default
        """What a store keeps beside the database about rows now gone (SQLite's key cache)."""
