"""Guards: the checks that stand between a plan and a node, each explained in words.

A pure function of the plan, a snapshot of the world (pause switch, breaker, what else is
under remediation, the fleet, this node's history and labels) and the policy. The engine
builds the snapshot from the store and the far sides; ``pitcrew plan`` builds it too and
prints every decision.

Also owns which fleet size the breaker's share limit is a share of (``choose_fleet``):
``guards.breaker.fleet_size`` when configured, else Kubernetes' node count, else the nodes
of the Slurm partitions the node is in; with none of them the share limit is one node at a
time, the most conservative there is: not knowing the size must never let more nodes go
than knowing it would. Every breaker decision names the size it used and where it came from.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime

from bot.domain.durations import format_duration
from bot.domain.outages import OutOfService, already_out, out_words
from bot.domain.planner import Decision, PastIncident, Plan
from bot.domain.policy import Policy


@dataclass(frozen=True, slots=True)
class BreakerState:
    open: bool = False
    opened_at: datetime | None = None
    reason: str = ""
    reset_at: datetime | None = None
    reset_by: str | None = None


@dataclass(frozen=True, slots=True)
class Fleet:
    """The fleet the breaker's share limit is a share of: its size and where the size came from."""

    size: int | None = None
    #: Where ``size`` came from ("Kubernetes", "Slurm partitions gpu"), or why none is known.
    source: str = "no fleet size was read"

    @property
    def words(self) -> str:
        if self.size:
            return f"fleet of {self.size} node{'s' if self.size != 1 else ''} from {self.source}"
        return f"fleet size unknown ({self.source})"

    def share_limit(self, max_fraction: float) -> int:
        """Most nodes the share limit lets through: never less than one (a small cluster must
        still heal), exactly one while the size is unknown."""
        if not self.size:
            return 1
        return max(1, math.floor(max_fraction * self.size))


#: Where a configured fleet size comes from (the key that sets it).
CONFIGURED = "guards.breaker.fleet_size"


def choose_fleet(
    *,
    configured: int | None,
    kubernetes: int | None,
    slurm: int | None,
    partitions: Sequence[str] = (),
    unknown: str = "no fleet size was read",
) -> Fleet:
    """The first size known, in this order: configured, Kubernetes' node count, the Slurm
    partitions of the node. A count of zero is no count (a far side that knows no nodes)."""
    if configured:
        return Fleet(configured, CONFIGURED)
    if kubernetes:
        return Fleet(kubernetes, "Kubernetes")
    if slurm:
        return Fleet(slurm, f"Slurm partitions {','.join(partitions) or '(unnamed)'}")
    return Fleet(None, unknown)


@dataclass(frozen=True, slots=True)
class World:
    """Everything the guards look at besides the plan and the policy."""

    paused: bool = False
    paused_by: str | None = None
    breaker: BreakerState = BreakerState()
    #: Other nodes let through for remediation within the breaker window.
    nodes_in_remediation: frozenset[str] = frozenset()
    #: Every node out of service right now, whoever took it out (``bot.domain.outages``).
    out_of_service: OutOfService = field(default_factory=OutOfService)
    fleet: Fleet = Fleet()
    history: Sequence[PastIncident] = ()
    #: Node labels from Kubernetes; ``None`` when they could not be read (dry run).
    node_labels: Mapping[str, str] | None = None
    alert_started_at: datetime | None = None
    extra: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Verdict:
    allowed: bool
    decisions: tuple[Decision, ...]
    #: Set when this plan is the one that trips the breaker: the reason to record.
    trip_breaker: str | None = None

    @property
    def blocking(self) -> tuple[Decision, ...]:
        return tuple(d for d in self.decisions if not d.ok)

    def admit(self, plan: Plan) -> Plan:
        return plan.admitted(self.decisions, self.allowed)

    def summary(self) -> str:
        blocked = self.blocking
        return "; ".join(d.words for d in blocked) if blocked else "all guards passed"


def evaluate(plan: Plan, world: World, policy: Policy, now: datetime) -> Verdict:
    """Run every guard; a plan that changes nothing passes them all trivially."""
    if not plan.acts:
        return Verdict(
            True, (Decision("scope", True, f"{plan.playbook} does not touch the node; no guard applies"),)
        )
    decisions = [
        _paused(world),
        _opt_out(plan.node, world, policy),
        _attempts(world, policy, now),
        _cooldown(world, policy, now),
        _stale(world, policy, now),
    ]
    others_ok = all(d.ok for d in decisions)
    breaker, trip = _breaker(plan.node, world, policy)
    decisions.append(breaker)
    # Only a plan that would otherwise go ahead counts toward the blast radius.
    return Verdict(others_ok and breaker.ok, tuple(decisions), trip if others_ok else None)


def _paused(world: World) -> Decision:
    if world.paused:
        who = f" by {world.paused_by}" if world.paused_by else ""
        return Decision(
            "pause", False, f"pitcrew is paused{who}: no node is touched until someone resumes it"
        )
    return Decision("pause", True, "not paused")


def _opt_out(node: str, world: World, policy: Policy) -> Decision:
    label = policy.node.opt_out_label
    if world.node_labels is None:
        return Decision("opt-out", True, f"label {label} not checked (node labels unavailable in a dry run)")
    if world.node_labels.get(label, "").lower() in {"true", "yes", "1"}:
        return Decision(
            "opt-out", False, f"node {node} carries {label}={world.node_labels[label]}: hands off"
        )
    return Decision("opt-out", True, f"node does not carry {label}=true")


def _acted_within(world: World, window_start: datetime) -> list[PastIncident]:
    return [h for h in world.history if h.acted and h.opened_at >= window_start]


def _attempts(world: World, policy: Policy, now: datetime) -> Decision:
    cap, window = policy.node.max_attempts, policy.node.attempt_window
    count = len(_acted_within(world, now - window))
    if count >= cap:
        return Decision(
            "attempts",
            False,
            f"{count} remediations on this node in the last {format_duration(window)} (cap {cap}): a human must look",
        )
    return Decision(
        "attempts", True, f"{count} of {cap} remediations used in the last {format_duration(window)}"
    )


def _cooldown(world: World, policy: Policy, now: datetime) -> Decision:
    cooldown = policy.node.cooldown
    recent = _acted_within(world, now - cooldown)
    if recent:
        last = max(recent, key=lambda h: h.opened_at)
        return Decision(
            "cooldown",
            False,
            f"incident {last.incident_id} acted on this node {format_duration(now - last.opened_at)} ago, "
            f"inside the {format_duration(cooldown)} cooldown",
        )
    return Decision("cooldown", True, f"no remediation on this node in the last {format_duration(cooldown)}")


def _stale(world: World, policy: Policy, now: datetime) -> Decision:
    reset_at, started = world.breaker.reset_at, world.alert_started_at
    cutoff = policy.breaker.stale_after
    if reset_at is not None and started is not None and started < reset_at and now - started > cutoff:
        return Decision(
            "stale",
            False,
            f"stale alert: it started {format_duration(now - started)} ago, before the breaker reset, and is older than "
            f"{format_duration(cutoff)}: skipped instead of replayed",
        )
    return Decision("stale", True, "alert is fresh")


def _breaker(node: str, world: World, policy: Policy) -> tuple[Decision, str | None]:
    """The blast radius: this node, pitcrew's other nodes in the window and every other node out
    of service (drained by an administrator, by Slurm's health check, cordoned by another
    controller), against ``max_nodes`` and ``max_fraction`` of the fleet."""
    breaker = world.breaker
    if breaker.open:
        since = f" since {breaker.opened_at.isoformat(timespec='seconds')}" if breaker.opened_at else ""
        return Decision(
            "breaker", False, f"circuit breaker is open{since} ({breaker.reason}); a human must reset it"
        ), None
    cfg, fleet = policy.breaker, world.fleet
    out = already_out(world.out_of_service.besides(node), world.nodes_in_remediation - {node})
    touched = len(out) + 1
    window = format_duration(cfg.window)
    unread = world.out_of_service.unread
    if unread is None or out:
        seen = out_words(out, fleet.size)
    else:
        seen = "no other node under remediation by pitcrew"
    if unread is not None:
        seen += f"; nodes out of service {unread}, so only pitcrew's own are counted"
    elif world.out_of_service.gaps:
        seen += f"; {world.out_of_service.gaps}: only what was read is counted"
    if touched > cfg.max_nodes:
        reason = (
            f"{touched} nodes would be out of service or under remediation within {window}, more than "
            f"max_nodes {cfg.max_nodes} ({fleet.words}); {seen}"
        )
        return Decision("breaker", False, f"breaker trips: {reason}"), reason
    allowed = fleet.share_limit(cfg.max_fraction)
    if fleet.size:
        share = f"{touched / fleet.size:.1%} of the {fleet.words}"
        if touched > allowed:
            reason = (
                f"{touched} of {fleet.size} nodes ({touched / fleet.size:.1%}) would be out of service or under "
                f"remediation within {window}, more than max_fraction {cfg.max_fraction:.1%} ({_nodes(allowed)}) "
                f"of the {fleet.words}; {seen}"
            )
            return Decision("breaker", False, f"breaker trips: {reason}"), reason
        share_words = f", {share} (share limit {_nodes(allowed)})"
    else:
        if touched > allowed:
            reason = (
                f"{touched} nodes would be out of service or under remediation within {window}, more than "
                f"{_nodes(allowed)} at a time: {fleet.words}; {seen}"
            )
            return Decision("breaker", False, f"breaker trips: {reason}"), reason
        share_words = f"; {fleet.words}, so {_nodes(allowed)} at a time"
    return Decision(
        "breaker",
        True,
        f"{touched} of max {cfg.max_nodes} nodes out of service or under remediation within {window}"
        f"{share_words}; {seen}",
    ), None


def _nodes(count: int) -> str:
    return f"{count} node{'s' if count != 1 else ''}"
