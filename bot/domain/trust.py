"""The trust ledger recomputed from incident records: pitcrew's own false-positive and repeat rates.

The same figures ``pitcrew_trust_*_total`` count as they happen (``bot.engine.trust``), here
from the store, so ``pitcrew trust`` shows them across restarts. Per playbook and decisive
fault class of each remediation (an incident whose plan would change a node):

* overridden — humans rolled it back, or an approver rejected its plan;
* passed — its node came back into service (Ready, Slurm node resumed: the retest);
* repeat — a later incident on the same node, within the escalation window, whose decisive
  fault class is one of the remediation's (counted against the latest such remediation);
* climbed — a rung of the repair ladder whose repair did not clear the fault (its validation
  failed, or the fault came back after the node's return), so the incident climbed to the next
  rung: counted against the rung that failed, itself a remediation of that playbook.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta


@dataclass(frozen=True, slots=True)
class IncidentFacts:
    """What the ledger needs of one incident."""

    incident_id: str
    node: str
    opened_at: datetime
    playbook: str
    #: The decisive fault's class (``unknown`` without one).
    fault_class: str
    fault_classes: frozenset[str]
    #: The plan would change a node (a remediation; observe mode included).
    remediates: bool
    rolled_back: bool = False
    rejected: bool = False
    back_in_service: bool = False
    #: The plan changes the node, whether or not the incident has ended (what the lemon rule counts).
    acts: bool = False
    #: The planner found the node a lemon (``Plan.lemon``).
    lemon: bool = False
    #: The rungs of the repair ladder the incident climbed from, in order (``playbook`` is its last).
    climbed_from: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Offender:
    """A node that keeps coming back: its remediations inside one lemon window."""

    node: str
    incidents: tuple[str, ...]
    lemon: bool
    last: datetime


def offenders(incidents: Sequence[IncidentFacts], window: timedelta, at_least: int = 2) -> list[Offender]:
    """Nodes with ``at_least`` remediations (any fault) inside ``window`` ending at their latest, most first.

    ``lemon`` says the planner already called the node a lemon (its Nth remediation, ``lemon.incidents``).
    """
    by_node: dict[str, list[IncidentFacts]] = defaultdict(list)
    for incident in incidents:
        if incident.acts:
            by_node[incident.node].append(incident)
    found = []
    for node, acted in by_node.items():
        acted.sort(key=lambda i: (i.opened_at, i.incident_id))
        last = acted[-1].opened_at
        recent = [i for i in acted if last - window <= i.opened_at]
        if len(recent) >= at_least:
            ids = tuple(i.incident_id for i in recent)
            found.append(Offender(node, ids, any(i.lemon for i in recent), last))
    return sorted(found, key=lambda o: (-len(o.incidents), -o.last.timestamp(), o.node))


@dataclass(frozen=True, slots=True)
class TrustRow:
    playbook: str
    fault_class: str
    remediations: int = 0
    rolled_back: int = 0
    rejected: int = 0
    passed: int = 0
    repeat: int = 0
    climbed: int = 0

    @property
    def overridden_rate(self) -> float | None:
        """Share of remediations humans rolled back or rejected."""
        return (self.rolled_back + self.rejected) / self.remediations if self.remediations else None

    @property
    def repeat_rate(self) -> float | None:
        """Repeats per node that passed its retest."""
        return self.repeat / self.passed if self.passed else None


def ledger(incidents: Sequence[IncidentFacts], window: timedelta) -> list[TrustRow]:
    """One row per (playbook, fault class) with at least one remediation, most remediations first."""
    counts: dict[tuple[str, str], dict[str, int]] = defaultdict(lambda: defaultdict(int))
    by_node: dict[str, list[IncidentFacts]] = defaultdict(list)
    for incident in sorted(incidents, key=lambda i: (i.opened_at, i.incident_id)):
        earlier = [
            r
            for r in by_node[incident.node]
            if r.remediates
            and incident.opened_at - window <= r.opened_at
            and incident.fault_class in r.fault_classes
        ]
        if earlier:
            counts[(earlier[-1].playbook, earlier[-1].fault_class)]["repeat"] += 1
        by_node[incident.node].append(incident)
        if not incident.remediates:
            continue
        for rung in incident.climbed_from:
            failed = counts[(rung, incident.fault_class)]
            failed["remediations"] += 1
            failed["climbed"] += 1
        row = counts[(incident.playbook, incident.fault_class)]
        row["remediations"] += 1
        row["rolled_back"] += incident.rolled_back
        row["rejected"] += incident.rejected
        row["passed"] += incident.back_in_service
    rows = [TrustRow(playbook, fault_class, **dict(c)) for (playbook, fault_class), c in counts.items()]
    return sorted(rows, key=lambda r: (-r.remediations, r.playbook, r.fault_class))
