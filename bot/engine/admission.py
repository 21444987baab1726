"""Admission: plan an open incident and put it through the guards, one incident at a time.

Serialised by a lock so that two incidents planned at the same instant cannot both slip
under the blast-radius limit. The plan, every guard decision and the verdict are written
to the incident before anything else happens. What the guards need from the far sides
(``node_facts``: the node's labels, the fleet's size) is read before the lock is taken, so
a slow far side never holds up the admission of other incidents: the fleet from Kubernetes'
node count, else from the Slurm partitions the node is in, not read at all when
``guards.breaker.fleet_size`` is configured (``bot.domain.guards.choose_fleet`` decides).
The Kubernetes count and the nodes out of service come from one cached snapshot of the fleet
(``bot.engine.fleet``), read at most once per poll interval, not once per alert.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any

from bot import logger
from bot.domain import guards, planner
from bot.domain.catalog import severity
from bot.domain.guards import BreakerState, Fleet, Verdict, World, choose_fleet
from bot.domain.incident import State
from bot.domain.outages import OutOfService
from bot.domain.planner import PastIncident, Plan
from bot.domain.playbooks import CLIMBS_ON, repairs_in_place
from bot.domain.policy import Mode, Policy
from bot.domain.returns import RETURNS
from bot.engine import trust
from bot.engine.context import Ports
from bot.engine.deps import EngineDeps
from bot.engine.errors import PitcrewError
from bot.engine.fleet import FleetSnapshot, FleetView
from bot.engine.pause import PAUSE as PAUSE
from bot.engine.ports import Notice, PartitionNodes
from bot.engine.rollback import ROLLBACK
from bot.store.base import SUPERSEDED, IncidentRecord, NewEvent, StepRecord, Store

log = logger(__name__)
BREAKER = "breaker"
#: The guards' verdict on a plan: its timeline event, and the step a refusal's notice is told under.
GUARDS = "guards"


async def breaker_state(store: Store) -> BreakerState:
    return breaker_from(await store.switch(BREAKER))


def breaker_from(switch: Mapping[str, Any] | None) -> BreakerState:
    """The breaker as its switch's value says."""
    value = switch or {}
    return BreakerState(
        open=bool(value.get("open")),
        opened_at=_when(value.get("opened_at")),
        reason=str(value.get("reason", "")),
        reset_at=_when(value.get("reset_at")),
        reset_by=value.get("reset_by"),
    )


def _when(text: Any) -> datetime | None:
    return datetime.fromisoformat(text) if isinstance(text, str) and text else None


async def post_safely(ports: Ports, store: Store, clock: Callable[[], datetime], notice: Notice) -> None:
    """Post a notice outside a step: a failing notifier is logged and audited, never fatal."""
    try:
        await ports.notifier.post(notice)
    except PitcrewError as exc:
        log.warning("notice not delivered", extra={"incident": notice.incident_id, "kind": notice.kind})
        await store.record(
            notice.incident_id, NewEvent("notice_failed", detail=f"{notice.kind}: {exc}"), clock()
        )


@dataclass(frozen=True, slots=True)
class NodeFacts:
    """What the guards need from the far sides; fetched before the admission lock is taken."""

    labels: Mapping[str, str] | None = None
    #: Nodes Kubernetes counts; ``None`` without a cluster or when it could not say.
    kubernetes_nodes: int | None = None
    #: The node's Slurm partitions and their nodes, read only when Kubernetes gave no count.
    partitions: PartitionNodes | None = None
    #: Why no fleet size was read, in words the breaker repeats.
    fleet_unknown: str = "not read"
    #: Every node out of service, whoever took it out (the snapshot ``bot.engine.fleet`` read).
    out_of_service: OutOfService = field(default_factory=OutOfService)

    def fleet(self, configured: int | None) -> Fleet:
        return choose_fleet(
            configured=configured,
            kubernetes=self.kubernetes_nodes,
            slurm=self.partitions.nodes if self.partitions else None,
            partitions=self.partitions.partitions if self.partitions else (),
            unknown=self.fleet_unknown,
        )


async def node_facts(
    ports: Ports, node: str, *, configured_fleet: int | None = None, fleet: FleetSnapshot | None = None
) -> NodeFacts:
    """Labels from Kubernetes and, unless configured, the fleet size from the first far side
    that knows it; with ``fleet`` (the cached snapshot), its node count and nodes out of service
    instead of a list per call. A read that fails leaves its fact unknown: the guards say so,
    never guess."""
    facts = await _node_facts(ports, node, configured_fleet, fleet)
    return facts if fleet is None else replace(facts, out_of_service=fleet.out_of_service)


async def _node_facts(
    ports: Ports, node: str, configured_fleet: int | None, fleet: FleetSnapshot | None
) -> NodeFacts:
    labels: Mapping[str, str] | None = None
    kubernetes: int | None = None
    gaps: list[str] = []
    if ports.cluster is None:
        gaps.append("no Kubernetes cluster")
    else:
        try:
            found = await ports.cluster.node(node)
            labels = dict(found.labels) if found is not None else {}
        except PitcrewError:
            pass  # the opt-out guard says it could not check
        if configured_fleet is None and fleet is not None:
            kubernetes = fleet.kubernetes_nodes
            if kubernetes is None:
                gaps.append(fleet.kubernetes_gap)
        elif configured_fleet is None:
            try:
                kubernetes = await ports.cluster.count_nodes() or None
                if kubernetes is None:
                    gaps.append("Kubernetes counts no nodes")
            except PitcrewError as exc:
                gaps.append(f"Kubernetes node count unreadable ({exc.reason})")
    if configured_fleet is not None or kubernetes is not None:
        return NodeFacts(labels, kubernetes)
    partitions: PartitionNodes | None = None
    try:
        names = await ports.slurm_names(node)
        if names:
            partitions = await ports.scheduler.partition_nodes(names[0])
        if partitions is None or not partitions.nodes:
            gaps.append(f"Slurm node {names[0] if names else node} is in no partition")
    except PitcrewError as exc:
        gaps.append(f"Slurm partitions unreadable ({exc.reason})")
    return NodeFacts(labels, None, partitions, "; ".join(gaps))


#: The facts of a dry run (``pitcrew plan``): nothing is read from a far side.
NOT_READ = NodeFacts(fleet_unknown="not read: a dry run contacts no far side")


async def build_world(
    policy: Policy, store: Store, incident: IncidentRecord, now: datetime, facts: NodeFacts | None
) -> World:
    """Everything the guards look at: the store's switches and history, and the cluster facts."""
    history_since = now - max(policy.escalation.window, policy.node.attempt_window, policy.lemon.window)
    found = await store.guard_reads(
        (PAUSE, BREAKER),
        node=incident.node,
        remediation_since=now - policy.breaker.window,
        history_since=history_since,
        exclude=incident.id,
    )
    pause = found.switches[PAUSE]
    return World(
        paused=pause is not None,
        paused_by=(pause or {}).get("set_by"),
        breaker=breaker_from(found.switches[BREAKER]),
        nodes_in_remediation=found.nodes_in_remediation,
        fleet=(facts or NOT_READ).fleet(policy.breaker.fleet_size),
        out_of_service=(facts or NOT_READ).out_of_service,
        history=found.history,
        node_labels=(facts or NOT_READ).labels,
        alert_started_at=incident.first_alert_at,
    )


class Admission:
    def __init__(self, deps: EngineDeps) -> None:
        self._deps = deps
        self._policy = deps.policy
        self._store = deps.store
        self._ports = deps.ports
        self._metrics = deps.metrics
        self._clock = deps.clock
        self._lock = asyncio.Lock()
        #: Nodes out of service, read at most once per poll interval however many alerts arrive.
        self.fleet = FleetView(deps.ports, deps.clock, deps.settings.poll_interval, deps.store)

    async def world(self, incident: IncidentRecord, now: datetime, facts: NodeFacts | None = None) -> World:
        facts = facts or await self._facts(incident)
        return await build_world(self._policy, self._store, incident, now, facts)

    async def _facts(self, incident: IncidentRecord) -> NodeFacts:
        return await node_facts(
            self._ports,
            incident.node,
            configured_fleet=self._policy.breaker.fleet_size,
            fleet=await self.fleet.snapshot(),
        )

    def _plan(self, incident: IncidentRecord, world: World, now: datetime) -> planner.Plan:
        return planner.plan(
            incident.node,
            incident.faults,
            world.history,
            self._policy,
            self._deps.playbooks,
            now,
            self._deps.registry,
        )

    async def admit(self, incident: IncidentRecord) -> IncidentRecord:
        """Plan, guard, persist; returns the incident in its new state."""
        facts = await self._facts(incident)  # far sides: outside the lock
        record, plan, history = await self._admit(incident, facts)
        # The trust ledger's repeat count reads past incidents: outside the admission lock.
        window, now = self._policy.escalation.window, self._clock()
        await trust.count_repeat(self._metrics, self._store, plan, history, window, now)
        return record

    async def _admit(
        self, incident: IncidentRecord, facts: NodeFacts
    ) -> tuple[IncidentRecord, planner.Plan, Sequence[PastIncident]]:
        async with self._lock:
            now = self._clock()
            world = await self.world(incident, now, facts)
            planned = self._plan(incident, world, now)
            verdict = guards.evaluate(planned, world, self._policy, now)
            plan = verdict.admit(planned)
            enforced = plan.guards_enforced
            events = [
                NewEvent(
                    "planned",
                    detail=f"{plan.playbook} ({plan.mode.value}): {' → '.join(plan.steps)}",
                    data={"reasons": list(plan.reasons)},
                ),
                NewEvent(
                    GUARDS,
                    outcome="allowed" if plan.allowed else "blocked",
                    detail=verdict.summary(),
                    data={
                        "decisions": [{"guard": d.guard, "ok": d.ok, "words": d.words} for d in plan.guards],
                        "enforced": enforced,
                    },
                ),
            ]
            await self._store.save_plan(incident.id, plan, events, now)
            if enforced and verdict.trip_breaker:
                await self._trip(verdict.trip_breaker, incident, now)
            if enforced and not verdict.allowed:
                return await self._suppress(incident, verdict, now), plan, world.history
            record = await self._store.transition(
                incident.id,
                State.GUARDED,
                now,
                guarded=enforced and plan.mode is not Mode.OBSERVE,
                event=NewEvent("state", outcome=State.GUARDED.value, detail=verdict.summary()),
            )
            return record, plan, world.history

    async def _trip(self, reason: str, incident: IncidentRecord, now: datetime) -> None:
        # One summary for the whole storm; incidents stopped by the open breaker stay quiet, so
        # it is told before the breaker opens (the other order could leave the breaker open and
        # nobody told). A crash between the two admits the incident again, which trips the
        # breaker again: the notice is keyed to the incident that trips it, so the outbox finds
        # it told and it is not posted twice.
        await post_safely(
            self._ports,
            self._store,
            self._clock,
            Notice(
                None,
                "breaker",
                "pitcrew circuit breaker opened: no more nodes will be touched",
                (
                    reason,
                    "Incidents arriving while it is open are recorded and suppressed, not replayed.",
                    "Reset it with `pitcrew breaker reset` once the cause is understood.",
                ),
                severity="critical",
                actions=("breaker-reset",),
                step=GUARDS,
                key=f"breaker:{incident.id}",
            ),
        )
        await self._store.set_switch(
            BREAKER, {"open": True, "opened_at": now.isoformat(), "reason": reason}, "pitcrew", now
        )
        await self._store.record(incident.id, NewEvent("breaker_opened", actor="pitcrew", detail=reason), now)
        self._metrics.breaker_open.set(1)

    async def _suppress(self, incident: IncidentRecord, verdict: Verdict, now: datetime) -> IncidentRecord:
        # Told before the incident ends (once: keyed to the guards' verdict), as the flow's ending
        # notices are: a crash between tells it once when the incident is admitted again.
        quiet = {d.guard for d in verdict.blocking} == {"breaker"}
        if not quiet:
            await post_safely(
                self._ports,
                self._store,
                self._clock,
                Notice(
                    incident.id,
                    "suppressed",
                    f"{incident.node}: no action taken",
                    tuple(d.words for d in verdict.blocking),
                    severity="warning",
                    node=incident.node,
                    step=GUARDS,
                    key="suppressed",
                ),
            )
        for decision in verdict.blocking:
            self._metrics.guard_blocks.labels(decision.guard).inc()
        record = await self._store.transition(
            incident.id,
            State.SUPPRESSED,
            now,
            outcome=verdict.summary(),
            event=NewEvent("state", outcome=State.SUPPRESSED.value, detail=verdict.summary()),
        )
        self._metrics.incidents_closed.labels(State.SUPPRESSED.value, record.playbook or "none").inc()
        self._metrics.incidents.drop(incident.id)
        return record

    async def climb(
        self, incident: IncidentRecord, step: str, detail: str, *, back: bool = False
    ) -> str | None:
        """The repair ladder inside one incident: ``step`` failed in a playbook with a ``next`` rung
        (or, ``back``, returned the node and the fault came back: ``bot.domain.returns``), so plan
        that rung (guarded, its approval asked again in approve mode) and go on from its first step
        not already done. Returns the rung climbed to, or ``None`` (humans take over)."""
        current = incident.playbook or ""
        rung = self._deps.playbooks.playbooks.get(current)
        if rung is None or rung.next is None or step not in (RETURNS if back else CLIMBS_ON):
            return None
        now = self._clock()
        world = await self.world(incident, now)
        faults = [replace(f, playbook=rung.next) for f in incident.faults]
        fresh = planner.plan(
            incident.node, faults, world.history, self._policy, self._deps.playbooks, now, self._deps.registry
        )
        verdict = guards.evaluate(fresh, world, self._policy, now)
        fresh = verdict.admit(fresh)
        if not fresh.allowed or fresh.playbook != rung.next:
            await self._store.record(
                incident.id,
                NewEvent("climb_blocked", detail=f"{current} → {rung.next} refused: {verdict.summary()}"),
                now,
            )
            return None
        done = await self._store.steps_of(incident.id)
        # What the failed rung already did to take the node out carries over; its repair does not.
        # After the node's return nothing carries over: the next rung takes the node out again.
        keep = (
            set()
            if back
            else {
                s
                for s, r in done.items()
                if r.status in {"ok", "skipped"} and s != "notify" and s not in CLIMBS_ON
            }
        )
        keep -= _redrained(incident, fresh)
        trust.climbed(self._metrics, incident)
        why = detail if back else f"{step} failed: {detail}"
        event = NewEvent(
            "climbed",
            step=step,
            detail=f"{current} → {fresh.playbook}: {why}",
            data={"from": current, "to": fresh.playbook, "fault_back": back, "reasons": list(fresh.reasons)},
        )
        # The failed rung's own step (failed) is superseded too: the next rung redoes the repair.
        await self._switch(incident, fresh, done, keep, event, now, {"ok", "skipped", "running", "failed"})
        return fresh.playbook

    async def replan(self, incident: IncidentRecord) -> None:
        """A new fault arrived on an incident already under way: escalate if it is more severe."""
        now = self._clock()
        world = await self.world(incident, now)
        fresh = self._plan(incident, world, now)
        current = incident.playbook or "ignore"
        if severity(fresh.playbook) <= severity(current):
            await self._store.ack_faults(incident.id)
            await self._store.record(
                incident.id,
                NewEvent("fault_attached", detail=f"new fault on the node; {current} already covers it"),
                now,
            )
            return
        verdict = guards.evaluate(fresh, world, self._policy, now)
        fresh = verdict.admit(fresh)
        if not fresh.allowed:
            await self._store.ack_faults(incident.id)
            await self._store.record(
                incident.id,
                NewEvent(
                    "escalation_blocked", detail=f"{current} → {fresh.playbook} refused: {verdict.summary()}"
                ),
                now,
            )
            return
        done = await self._store.steps_of(incident.id)
        returned = done.get("slurm_resume") is not None and done["slurm_resume"].status == "ok"
        # Steps already done carry over — unless the node was already returned to service, in
        # which case the new playbook starts from the top (the node must be taken out again).
        keep = (
            set()
            if returned
            else {s for s, r in done.items() if r.status in {"ok", "skipped"} and s != "notify"}
        )
        keep -= _redrained(incident, fresh)
        event = NewEvent(
            "replanned",
            detail=f"{current} → {fresh.playbook}: a more severe fault arrived",
            data={"reasons": list(fresh.reasons)},
        )
        await self._switch(incident, fresh, done, keep, event, now, {"ok", "skipped", "running"})

    async def _switch(
        self,
        incident: IncidentRecord,
        fresh: Plan,
        done: Mapping[str, StepRecord],
        keep: set[str],
        event: NewEvent,
        now: datetime,
        superseded: set[str],
    ) -> None:
        """Put ``fresh`` in place of the incident's plan (a replan or a climb): the steps done that
        do not carry over (``keep``), in a ``superseded`` status, are marked so, and the flow goes on
        from the new plan's first step not kept."""
        for name, record in done.items():
            if name not in keep and name != ROLLBACK and record.status in superseded:
                await self._store.step_finished(
                    incident.id,
                    name,
                    "superseded",
                    now,
                    result=record.result,
                    event=NewEvent(SUPERSEDED, step=name),
                )
        index = next((i for i, s in enumerate(fresh.steps) if s not in keep), len(fresh.steps))
        await self._store.save_plan(incident.id, fresh, [event], now)
        await self._store.advance(incident.id, index, now)


def _redrained(incident: IncidentRecord, fresh: Plan) -> set[str]:
    """The steps that do not carry over from ``incident``'s plan into ``fresh`` though done: the
    drain, into a plan with a drain that does not repair the machine in place from one that did
    (``repairs_in_place``): that drain left the node's Slinky NodeSet slurmd pods, which a
    replacement, or humans, need evicted, so it runs again. A plan without a drain keeps it done."""
    before = incident.plan.steps if incident.plan is not None else ()
    again = "drain" in fresh.steps and repairs_in_place(before) and not repairs_in_place(fresh.steps)
    return {"drain"} if again else set()
