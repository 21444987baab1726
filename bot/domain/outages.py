"""Nodes out of service, and who took them out: what the breaker counts besides pitcrew's own work.

The blast radius is every node that cannot run work, whoever took it out: a Slurm node
DOWN, DRAIN or FAIL for any reason, a Kubernetes node cordoned or NotReady. Two nodes an
administrator drained plus one pitcrew takes leave three out, exactly as if pitcrew had
taken all three. This module classifies what the far sides report (reasons, taints,
conditions) into who took a node out and says it in words; the engine reads the far sides
(``bot.engine.fleet``) and passes the snapshot in. Pure: no I/O, no clock.

A node seen under two names (its Slurm name and its Kubernetes name, where they differ) is
counted twice: an error towards touching fewer nodes, never more.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import StrEnum

from bot.domain.jobs import not_responding
from bot.domain.ownership import (
    OWNER_ANNOTATION,
    SLINKY_CORDON_REASON,
    is_pitcrew_reason,
    slinky_reason_is_ours,
)


class Taker(StrEnum):
    """Who took a node out of service, as the plan says it ("1 by an administrator")."""

    PITCREW = "pitcrew"
    ADMIN = "an administrator"
    HEALTH_CHECK = "Slurm's health check"
    CONTROLLER = "another controller"
    NOT_READY = "Kubernetes (NotReady)"


#: Reasons Slurm itself, or a node health check it runs (NHC, prolog, epilog), sets; matched
#: case-insensitively at the start or anywhere in the reason (Slurm's own texts, src/slurmctld).
HEALTH_CHECK_REASONS = (
    "nhc",
    "health check",
    "healthcheck",
    "not responding",
    "kill task failed",
    "prolog",
    "epilog",
    "node unexpectedly rebooted",
    "low realmemory",
    "low tmpdisk",
    "low socket*core*thread count",
    "gres/gpu count",
    "batch job complete failure",
)
#: Taints of controllers that cordon nodes for their own work: their key → the controller's name.
CONTROLLER_TAINTS = {
    "ToBeDeletedByClusterAutoscaler": "cluster-autoscaler",
    "DeletionCandidateOfClusterAutoscaler": "cluster-autoscaler",
    "karpenter.sh/disrupted": "Karpenter",
    "karpenter.sh/disruption": "Karpenter",
    "node.cluster.x-k8s.io/uninitialized": "Cluster API",
}
#: Slurm states that take a node out of service (base states and flags as both backends list them):
#: by someone's hand, or by Slurm's own (FAIL). A node Slurm cannot reach (``jobs.not_responding``:
#: not one power saving put to sleep or is waking) is an outage too (``slurm_outage``), but no one
#: took it out (``bot.domain.slurm_watch``).
SLURM_OUT = frozenset({"DOWN", "DRAIN", "DRAINED", "DRAINING", "FAIL", "FAILING"})

#: How many node names each group lists before "and N more" (the words stay one readable line).
NAMES_SHOWN = 3


@dataclass(frozen=True, slots=True)
class Outage:
    """One node out of service: its name, who took it out and the mark that says so."""

    node: str
    by: Taker
    why: str


def slurm_outage(
    name: str, states: Iterable[str], reason: str = "", reason_user: str | None = None
) -> Outage | None:
    """A Slurm node DOWN, DRAIN(ING/ED), FAIL(ING) or not responding, and who did it; else ``None``."""
    flags = {s.upper() for s in states}
    if not flags & SLURM_OUT and not not_responding(flags):
        return None
    state = "/".join(sorted(flags))
    if is_pitcrew_reason(reason) or slinky_reason_is_ours(reason):
        return Outage(name, Taker.PITCREW, reason)
    lowered = reason.lower()
    if reason_user == "slurm" or any(mark in lowered for mark in HEALTH_CHECK_REASONS):
        return Outage(name, Taker.HEALTH_CHECK, reason or state)
    if not reason:  # Slurm marks a node it lost DOWN/NOT_RESPONDING without a human's reason
        return Outage(name, Taker.HEALTH_CHECK, state)
    return Outage(name, Taker.ADMIN, reason)


def kubernetes_outage(
    name: str,
    *,
    unschedulable: bool,
    ready: bool,
    taint_keys: Iterable[str] = (),
    annotations: Mapping[str, str] | None = None,
) -> Outage | None:
    """A Kubernetes node cordoned or NotReady, and who did it; else ``None``."""
    marks = annotations or {}
    if unschedulable:
        if marks.get(OWNER_ANNOTATION):
            return Outage(name, Taker.PITCREW, f"cordoned by pitcrew incident {marks[OWNER_ANNOTATION]}")
        slinky = marks.get(SLINKY_CORDON_REASON, "")
        if slinky and is_pitcrew_reason(slinky):
            return Outage(name, Taker.PITCREW, slinky)
        for key in taint_keys:
            if key in CONTROLLER_TAINTS:
                return Outage(name, Taker.CONTROLLER, f"cordoned by {CONTROLLER_TAINTS[key]} (taint {key})")
        return Outage(name, Taker.ADMIN, f"cordoned{': ' + slinky if slinky else ''}")
    if not ready:
        return Outage(name, Taker.NOT_READY, "NotReady")
    return None


@dataclass(frozen=True, slots=True)
class OutOfService:
    """The fleet's nodes out of service at one moment (a snapshot the engine read), or why not."""

    outages: tuple[Outage, ...] = ()
    #: ``None``: read from the far sides; else why no snapshot could be read (only pitcrew's own
    #: incidents are counted then, and the breaker's words say so).
    unread: str | None = "not read"
    #: What of the snapshot could not be read (one far side of two), said with the count.
    gaps: str = ""

    @classmethod
    def of(cls, outages: Iterable[Outage], gaps: str = "") -> OutOfService:
        """A snapshot that was read: one entry per node name (the first mark found wins)."""
        seen: dict[str, Outage] = {}
        for outage in outages:
            seen.setdefault(outage.node, outage)
        return cls(tuple(seen.values()), None, gaps)

    def besides(self, node: str) -> tuple[Outage, ...]:
        """Every node out of service except ``node`` itself (the one being judged)."""
        return tuple(o for o in self.outages if o.node != node)


def already_out(outages: Iterable[Outage], pitcrew_nodes: Iterable[str] = ()) -> tuple[Outage, ...]:
    """The snapshot's outages, plus pitcrew's own incidents' nodes the snapshot did not show."""
    out = {o.node: o for o in outages}
    for node in pitcrew_nodes:
        out.setdefault(node, Outage(node, Taker.PITCREW, "under remediation by pitcrew"))
    return tuple(out.values())


def out_words(outages: tuple[Outage, ...], fleet_size: int | None) -> str:
    """``2 of 4 nodes already out: 1 by an administrator (gpu-001: admin: bios update), 1 by
    Slurm's health check (gpu-003: NHC: gpu check failed)``; groups in ``Taker`` order."""
    if not outages:
        return "no other node is out of service"
    total = f"{len(outages)} of {fleet_size}" if fleet_size else str(len(outages))
    groups = []
    for taker in Taker:
        mine = sorted((o for o in outages if o.by is taker), key=lambda o: o.node)
        if not mine:
            continue
        shown = ", ".join(f"{o.node}: {o.why}" for o in mine[:NAMES_SHOWN])
        more = f", and {len(mine) - NAMES_SHOWN} more" if len(mine) > NAMES_SHOWN else ""
        groups.append(f"{len(mine)} by {taker.value} ({shown}{more})")
    noun = "node" if len(outages) == 1 and not fleet_size else "nodes"
    return f"{total} {noun} already out: " + ", ".join(groups)
