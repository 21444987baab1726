"""The breaker's fleet: which size its share limit is a share of, where it came from, and the words.

Cases:
* precedence, one table row per combination: ``guards.breaker.fleet_size`` over Kubernetes'
  node count over the Slurm partitions of the node; a count of zero is no count; with none
  known the fleet is unknown and says why;
* the breaker with each source, a second node joining one already under remediation (default
  policy: max_nodes 3, max_fraction 5%): a 4-node Slurm fleet lets one node through and trips
  on the second, naming "fleet of 4 nodes from Slurm partitions gpu"; the configured size and
  Kubernetes' count win over Slurm's; an unknown fleet goes one node at a time and names why;
  every decision, let through or not, names the fleet; a World that was told nothing about
  the fleet lets one node through, not three;
* ``node_facts`` against far sides (the simulated world, the dry-run journal): Slurm-only
  (no cluster) reads the partitions; a cluster's count wins and Slurm is not asked; a
  configured size asks neither; a cluster that cannot count falls back to Slurm; the journal
  knows no partitions; a node in no partition; every gap is named.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from bot.config import load_catalog, load_playbooks
from bot.domain.faults import classify
from bot.domain.guards import CONFIGURED, Fleet, World, choose_fleet, evaluate
from bot.domain.labels import Subject
from bot.domain.planner import plan
from bot.domain.policy import Mode, Policy
from bot.engine.admission import node_facts
from bot.engine.context import Ports
from bot.engine.steps import REGISTRY
from bot.integrations.journal import DryRunJournal, LogNotifier
from tests.simulator.cluster import SimulatedCluster
from tests.simulator.world import Journal, SimulatedWorld

NOW = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)
AUTO = Policy(mode=Mode.AUTO)
XID79 = classify(Subject("gpu-002", "3", None, None, 79, "79", None, ""), load_catalog())
assert XID79 is not None
ACTING = plan("gpu-002", [XID79], [], AUTO, load_playbooks(), NOW, REGISTRY)


# ------------------------------------------------------------------------- precedence
@pytest.mark.parametrize(
    ("inputs", "expected"),
    [
        ({"configured": 40, "kubernetes": 6, "slurm": 4}, Fleet(40, CONFIGURED)),
        ({"configured": None, "kubernetes": 6, "slurm": 4}, Fleet(6, "Kubernetes")),
        ({"configured": None, "kubernetes": None, "slurm": 4}, Fleet(4, "Slurm partitions gpu")),
        ({"configured": None, "kubernetes": 0, "slurm": 4}, Fleet(4, "Slurm partitions gpu")),
        (
            {"configured": None, "kubernetes": None, "slurm": 6, "partitions": ("gpu", "debug")},
            Fleet(6, "Slurm partitions gpu,debug"),
        ),
        ({"configured": None, "kubernetes": None, "slurm": None}, Fleet(None, "why not")),
        ({"configured": None, "kubernetes": None, "slurm": 0}, Fleet(None, "why not")),
    ],
    ids=[
        "configured-wins",
        "kubernetes-over-slurm",
        "slurm-alone",
        "kubernetes-zero-is-no-count",
        "slurm-two-partitions",
        "unknown",
        "slurm-zero-is-no-count",
    ],
)
def test_fleet_precedence(inputs: dict[str, Any], expected: Fleet) -> None:
    args = {"partitions": ("gpu",), "unknown": "why not", **inputs}
    assert choose_fleet(**args) == expected


# ------------------------------------------------------------------------- the breaker
@dataclass(frozen=True)
class BreakerCase:
    fleet: Fleet
    #: Nodes already under remediation besides the judged one.
    others: frozenset[str]
    allowed: bool
    words: str


ONE_OTHER = frozenset({"gpu-001"})
UNKNOWN = Fleet(None, "no Kubernetes cluster; Slurm partitions unreadable (timeout)")
BREAKER = {
    "slurm-4-first-node": BreakerCase(
        Fleet(4, "Slurm partitions gpu"),
        frozenset(),
        True,
        "1 of max 3 nodes out of service or under remediation within 1h, 25.0% of the fleet of 4 nodes from Slurm partitions gpu "
        "(share limit 1 node)",
    ),
    "slurm-4-second-node-trips": BreakerCase(
        Fleet(4, "Slurm partitions gpu"),
        ONE_OTHER,
        False,
        "2 of 4 nodes (50.0%) would be out of service or under remediation within 1h, more than max_fraction 5.0% (1 node) "
        "of the fleet of 4 nodes from Slurm partitions gpu",
    ),
    "configured-40-second-node-passes": BreakerCase(
        Fleet(40, CONFIGURED),
        ONE_OTHER,
        True,
        "5.0% of the fleet of 40 nodes from guards.breaker.fleet_size (share limit 2 nodes)",
    ),
    "kubernetes-6-second-node-trips": BreakerCase(
        Fleet(6, "Kubernetes"),
        ONE_OTHER,
        False,
        "more than max_fraction 5.0% (1 node) of the fleet of 6 nodes from Kubernetes",
    ),
    "unknown-first-node": BreakerCase(
        UNKNOWN,
        frozenset(),
        True,
        "1 of max 3 nodes out of service or under remediation within 1h; fleet size unknown (no Kubernetes cluster; "
        "Slurm partitions unreadable (timeout)), so 1 node at a time",
    ),
    "unknown-second-node-trips": BreakerCase(
        UNKNOWN,
        ONE_OTHER,
        False,
        "2 nodes would be out of service or under remediation within 1h, more than 1 node at a time: fleet size unknown "
        "(no Kubernetes cluster; Slurm partitions unreadable (timeout))",
    ),
    "max-nodes-names-the-fleet": BreakerCase(
        Fleet(500, "Kubernetes"),
        frozenset({"a", "b", "c"}),
        False,
        "4 nodes would be out of service or under remediation within 1h, more than max_nodes 3 (fleet of 500 nodes from Kubernetes)",
    ),
}


@pytest.mark.parametrize("case", BREAKER.values(), ids=BREAKER.keys())
def test_breaker_with_each_fleet_source(case: BreakerCase) -> None:
    world = World(nodes_in_remediation=case.others, fleet=case.fleet, node_labels={})
    verdict = evaluate(ACTING, world, AUTO, NOW)
    [breaker] = [d for d in verdict.decisions if d.guard == "breaker"]
    assert (verdict.allowed, breaker.ok) == (case.allowed, case.allowed)
    assert case.words in breaker.words, breaker.words
    # The trip reason is what the breaker notice and the open breaker repeat: it names the fleet too.
    assert (verdict.trip_breaker is not None) == (not case.allowed)
    if verdict.trip_breaker is not None:
        assert case.words in verdict.trip_breaker


def test_an_unknown_fleet_lets_one_node_through_at_a_time() -> None:
    """The 4-node storm without Kubernetes: the size was never read, and the second node waits."""
    world = World(node_labels={})  # nothing told the guards how big the fleet is
    assert evaluate(ACTING, world, AUTO, NOW).allowed
    second = evaluate(ACTING, World(nodes_in_remediation=ONE_OTHER, node_labels={}), AUTO, NOW)
    assert not second.allowed
    assert second.trip_breaker is not None and "fleet size unknown" in second.trip_breaker


# ------------------------------------------------------------------------- reading the far sides
class Counting:
    """A far side whose port calls are counted (to show which source was not asked)."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner
        self.calls: Counter[str] = Counter()

    def __getattr__(self, name: str) -> Any:
        target = getattr(self._inner, name)

        async def call(*args: Any, **kwargs: Any) -> Any:
            self.calls[name] += 1
            return await target(*args, **kwargs)

        return call


def _inventory() -> dict[str, Any]:
    """Four GPU nodes in partition gpu, two CPU nodes in partition cpu, one node in none."""
    nodes: dict[str, Any] = {f"gpu-00{n}": {} for n in range(1, 5)}
    nodes.update({f"cpu-00{n}": {"partitions": ["cpu"]} for n in range(1, 3)})
    nodes["spare-001"] = {"partitions": []}
    return {"nodes": nodes}


@dataclass(frozen=True)
class FactsCase:
    cluster: str  # "none", "simulated", "journal"
    scheduler: str  # "simulated", "journal"
    node: str
    configured: int | None
    fleet: Fleet
    slurm_asked: bool


FACTS = {
    "slurm-only": FactsCase("none", "simulated", "gpu-002", None, Fleet(4, "Slurm partitions gpu"), True),
    "kubernetes-count-wins": FactsCase(
        "simulated", "simulated", "gpu-002", None, Fleet(7, "Kubernetes"), False
    ),
    "configured-asks-neither": FactsCase(
        "simulated", "simulated", "gpu-002", 40, Fleet(40, CONFIGURED), False
    ),
    "cluster-cannot-count": FactsCase(
        "journal", "simulated", "cpu-001", None, Fleet(2, "Slurm partitions cpu"), True
    ),
    "journal-knows-no-partitions": FactsCase(
        "none",
        "journal",
        "gpu-002",
        None,
        Fleet(None, "no Kubernetes cluster; Slurm partitions unreadable (dry_run)"),
        True,
    ),
    "node-in-no-partition": FactsCase(
        "none",
        "simulated",
        "spare-001",
        None,
        Fleet(None, "no Kubernetes cluster; Slurm node spare-001 is in no partition"),
        True,
    ),
    "both-unreadable": FactsCase(
        "journal",
        "journal",
        "gpu-002",
        None,
        Fleet(None, "Kubernetes node count unreadable (dry_run); Slurm partitions unreadable (dry_run)"),
        True,
    ),
}


@pytest.mark.parametrize("case", FACTS.values(), ids=FACTS.keys())
async def test_node_facts_reads_the_fleet_in_order(case: FactsCase, tmp_path: Path) -> None:
    world = SimulatedWorld(Journal(None), _inventory())
    journal = DryRunJournal(tmp_path / "journal.jsonl")
    scheduler = Counting(world if case.scheduler == "simulated" else journal)
    cluster = {"none": None, "simulated": SimulatedCluster(world), "journal": journal}[case.cluster]
    ports = Ports(scheduler=scheduler, cluster=cluster, notifier=LogNotifier())
    facts = await node_facts(ports, case.node, configured_fleet=case.configured)
    assert facts.fleet(case.configured) == case.fleet
    assert (scheduler.calls["partition_nodes"] == 1) == case.slurm_asked
