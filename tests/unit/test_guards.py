"""The breaker's decision, table-tested: which node goes through and which is held, not the words.

Cases:
* the ``max_nodes`` boundary: with ``max_nodes`` 2, the node that makes 2 goes through, the
  one that would make 3 is held and trips the breaker (a ``>=`` would hold the second);
* the ``max_fraction`` boundary: 20 % of 10 nodes lets the second node through, holds the third;
* nodes out of service count whoever took them out: 2 drained by an administrator on a 4-node
  fleet (max_nodes 3) leave room for one, a third out (Slurm's health check) leaves none; a
  node out that is the judged node itself is not counted twice; pitcrew's own incident's
  node, seen both in the store and in the snapshot, counts once; an unread snapshot counts
  only pitcrew's own and says so;
* who took a node out, from Slurm states and reasons and from Kubernetes nodes (one row each);
* the words name the nodes out and why, grouped by who took them out, at most three names a group;
* the per-node windows (attempts, cooldown) include their start instant; after a breaker reset
  an alert is stale only if it started before the reset and is older than the cutoff.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import pytest

from bot.config import load_catalog, load_playbooks
from bot.domain.faults import classify
from bot.domain.guards import BreakerState, Fleet, World, evaluate
from bot.domain.labels import Subject
from bot.domain.outages import (
    Outage,
    OutOfService,
    Taker,
    kubernetes_outage,
    out_words,
    slurm_outage,
)
from bot.domain.planner import PastIncident, plan
from bot.domain.policy import BreakerPolicy, GuardPolicy, Mode, NodePolicy, Policy
from bot.engine.steps import REGISTRY

NOW = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)
XID79 = classify(Subject("gpu-004", "3", None, None, 79, "79", None, ""), load_catalog())
assert XID79 is not None
ACTING = plan("gpu-004", [XID79], [], Policy(mode=Mode.AUTO), load_playbooks(), NOW, REGISTRY)


def policy(max_nodes: int, max_fraction: float = 1.0) -> Policy:
    return Policy(
        mode=Mode.AUTO,
        guards=GuardPolicy(breaker=BreakerPolicy(max_nodes=max_nodes, max_fraction=max_fraction)),
    )


def admin(node: str) -> Outage:
    return Outage(node, Taker.ADMIN, "admin: bios update")


def nhc(node: str) -> Outage:
    return Outage(node, Taker.HEALTH_CHECK, "NHC: check_gpu failed")


NONE_OUT = OutOfService.of(())


@dataclass(frozen=True)
class Case:
    policy: Policy
    fleet: Fleet
    others: frozenset[str] = frozenset()
    out: OutOfService = NONE_OUT
    allowed: bool = True


HUNDRED, TEN, FOUR = Fleet(100, "Kubernetes"), Fleet(10, "Kubernetes"), Fleet(4, "Slurm partitions gpu")
CASES = {
    "max-nodes-first": Case(policy(2), HUNDRED),
    "max-nodes-at-the-limit-goes-through": Case(policy(2), HUNDRED, frozenset({"a"})),
    "max-nodes-past-the-limit-is-held": Case(policy(2), HUNDRED, frozenset({"a", "b"}), allowed=False),
    "max-fraction-at-the-limit-goes-through": Case(policy(10, 0.2), TEN, frozenset({"a"})),
    "max-fraction-past-the-limit-is-held": Case(policy(10, 0.2), TEN, frozenset({"a", "b"}), allowed=False),
    "two-drained-by-hand-leave-room-for-one": Case(
        policy(3), FOUR, out=OutOfService.of([admin("gpu-001"), admin("gpu-002")])
    ),
    "three-out-leave-none": Case(
        policy(3),
        FOUR,
        out=OutOfService.of([admin("gpu-001"), admin("gpu-002"), nhc("gpu-003")]),
        allowed=False,
    ),
    "the-judged-node-out-counts-once": Case(
        policy(3), FOUR, out=OutOfService.of([admin("gpu-001"), admin("gpu-002"), nhc("gpu-004")])
    ),
    "pitcrews-own-node-counts-once": Case(
        policy(3),
        FOUR,
        frozenset({"gpu-001"}),
        OutOfService.of([Outage("gpu-001", Taker.PITCREW, "pitcrew: pc-00001 XID 79"), admin("gpu-002")]),
    ),
    "unread-counts-pitcrews-own": Case(policy(2), HUNDRED, frozenset({"a"}), OutOfService()),
    "unread-still-holds-past-the-limit": Case(
        policy(2), HUNDRED, frozenset({"a", "b"}), OutOfService(), allowed=False
    ),
}


@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
def test_breaker_decision(case: Case) -> None:
    world = World(nodes_in_remediation=case.others, out_of_service=case.out, fleet=case.fleet, node_labels={})
    verdict = evaluate(ACTING, world, case.policy, NOW)
    [breaker] = [d for d in verdict.decisions if d.guard == "breaker"]
    assert verdict.allowed is case.allowed
    assert breaker.ok is case.allowed
    assert (verdict.trip_breaker is not None) is (not case.allowed)


def test_the_plan_names_the_nodes_out_and_why() -> None:
    out = OutOfService.of([admin("gpu-001"), admin("gpu-002"), nhc("gpu-003")])
    verdict = evaluate(ACTING, World(out_of_service=out, fleet=FOUR, node_labels={}), policy(3), NOW)
    assert verdict.trip_breaker is not None
    assert verdict.trip_breaker.endswith(
        "3 of 4 nodes already out: 2 by an administrator (gpu-001: admin: bios update, gpu-002: admin: bios "
        "update), 1 by Slurm's health check (gpu-003: NHC: check_gpu failed)"
    )
    none_out = evaluate(ACTING, World(out_of_service=NONE_OUT, fleet=FOUR, node_labels={}), policy(3), NOW)
    assert any(d.words.endswith("; no other node is out of service") for d in none_out.decisions)
    unread = evaluate(ACTING, World(fleet=FOUR, node_labels={}), policy(3), NOW)
    [breaker] = [d for d in unread.decisions if d.guard == "breaker"]
    assert "nodes out of service not read, so only pitcrew's own are counted" in breaker.words


def test_at_most_three_names_a_group() -> None:
    words = out_words(tuple(admin(f"gpu-{n:03d}") for n in range(1, 8)), 10_000)
    assert words == (
        "7 of 10000 nodes already out: 7 by an administrator (gpu-001: admin: bios update, gpu-002: admin: "
        "bios update, gpu-003: admin: bios update, and 4 more)"
    )


@pytest.mark.parametrize(
    ("states", "reason", "user", "taker"),
    [
        ({"IDLE"}, "", None, None),
        ({"ALLOCATED"}, "", None, None),
        ({"IDLE", "DRAIN"}, "admin: bios update", "root", Taker.ADMIN),
        ({"DOWN"}, "ops: RMA", "alice", Taker.ADMIN),
        ({"IDLE", "DRAIN"}, "NHC: check_gpu failed", "root", Taker.HEALTH_CHECK),
        ({"DOWN", "NOT_RESPONDING"}, "Not responding", "slurm", Taker.HEALTH_CHECK),
        ({"DOWN"}, "Kill task failed", "root", Taker.HEALTH_CHECK),
        ({"IDLE", "DRAIN"}, "Prolog error", "root", Taker.HEALTH_CHECK),
        ({"IDLE", "DRAIN"}, "epilog error", "root", Taker.HEALTH_CHECK),
        ({"IDLE", "DRAIN"}, "anything at all", "slurm", Taker.HEALTH_CHECK),
        ({"DOWN"}, "", None, Taker.HEALTH_CHECK),
        ({"FAIL"}, "hardware", "bob", Taker.ADMIN),
        ({"IDLE", "NOT_RESPONDING"}, "", None, Taker.HEALTH_CHECK),
        # Power saving (ping_nodes.c pings none of these; power_save.c, node_mgr.c set the flag):
        ({"IDLE", "POWERED_DOWN"}, "", None, None),
        ({"IDLE", "POWERED_DOWN", "NOT_RESPONDING"}, "", None, None),  # RESUMEd while powered down
        ({"MIXED", "NOT_RESPONDING", "POWERING_UP"}, "", None, None),  # woken for a job, booting
        ({"DOWN", "POWERED_DOWN"}, "ResumeTimeout reached", "slurm", Taker.HEALTH_CHECK),
        ({"DOWN", "DRAIN", "POWERED_DOWN"}, "pitcrew: pc-00007 XID 79 gpu3", "root", Taker.PITCREW),
        ({"DOWN"}, "pitcrew: pc-00007 XID 79 gpu3", "root", Taker.PITCREW),
        ({"IDLE", "DRAIN"}, "slurm-operator: pitcrew: pc-00007 XID 79 gpu3", "root", Taker.PITCREW),
    ],
)
def test_slurm_outage(states: set[str], reason: str, user: str | None, taker: Taker | None) -> None:
    found = slurm_outage("gpu-001", states, reason, user)
    assert (found.by if found else None) is taker


@pytest.mark.parametrize(
    ("unschedulable", "ready", "taints", "annotations", "taker"),
    [
        (False, True, (), {}, None),
        (True, True, (), {}, Taker.ADMIN),
        (True, True, ("pitcrew.dev/gpu-fault",), {"pitcrew.dev/incident": "pc-1"}, Taker.PITCREW),
        (True, True, ("ToBeDeletedByClusterAutoscaler",), {}, Taker.CONTROLLER),
        (True, True, ("karpenter.sh/disrupted",), {}, Taker.CONTROLLER),
        (False, False, (), {}, Taker.NOT_READY),
        (True, False, (), {}, Taker.ADMIN),  # cordoned and NotReady: the cordon says who
        (
            True,
            True,
            (),
            {"nodeset.slinky.slurm.net/node-cordon-reason": "pitcrew: pc-1 XID 79"},
            Taker.PITCREW,
        ),
        (True, True, (), {"nodeset.slinky.slurm.net/node-cordon-reason": "ops: maintenance"}, Taker.ADMIN),
    ],
)
def test_kubernetes_outage(
    unschedulable: bool,
    ready: bool,
    taints: tuple[str, ...],
    annotations: dict[str, str],
    taker: Taker | None,
) -> None:
    found = kubernetes_outage(
        "gpu-001", unschedulable=unschedulable, ready=ready, taint_keys=taints, annotations=annotations
    )
    assert (found.by if found else None) is taker


@pytest.mark.parametrize(
    ("ago", "guard"),
    [
        (timedelta(hours=24), "attempts"),  # exactly at the window's start: still inside it
        (timedelta(hours=24, seconds=1), None),
        (timedelta(minutes=30), "cooldown"),  # exactly at the cooldown's start: still inside it
    ],
)
def test_the_node_windows_include_their_start(ago: timedelta, guard: str | None) -> None:
    node = NodePolicy(
        max_attempts=1 if guard != "cooldown" else 2,
        attempt_window=timedelta(hours=24),
        cooldown=timedelta(minutes=30),
    )
    policy = Policy(mode=Mode.AUTO, guards=GuardPolicy(node=node))
    history = [PastIncident("pc-00001", "replace-node", NOW - ago, True)]
    verdict = evaluate(ACTING, World(history=history, fleet=HUNDRED, node_labels={}), policy, NOW)
    assert {d.guard for d in verdict.blocking} == ({guard} if guard else set())


@pytest.mark.parametrize(
    ("started_before_reset", "age", "stale"),
    [
        (timedelta(seconds=1), timedelta(minutes=15, seconds=1), True),
        (timedelta(seconds=1), timedelta(minutes=15), False),  # exactly the cutoff: not yet stale
        (timedelta(0), timedelta(minutes=20), False),  # started at the reset itself: not before it
    ],
)
def test_stale_after_a_breaker_reset(started_before_reset: timedelta, age: timedelta, stale: bool) -> None:
    started = NOW - age
    breaker = BreakerState(reset_at=started + started_before_reset)
    world = World(breaker=breaker, alert_started_at=started, fleet=HUNDRED, node_labels={})
    verdict = evaluate(ACTING, world, Policy(mode=Mode.AUTO), NOW)
    assert ({d.guard for d in verdict.blocking} == {"stale"}) is stale
