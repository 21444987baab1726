"""Slurm as a second source of faults: which Slurm nodes Slurm itself took out, as alerts.

A health check (LBNL NHC, Slurm's ``HealthCheckProgram``), slurmctld (``Not responding``,
``Kill task failed``, a prolog or epilog error) or a person sets a node DOWN, DRAIN or FAIL with a
reason; Kubernetes never hears of it. pitcrew turns each such node into one alert-like record that
enters the store like Alertmanager's (so a Prometheus alert and a Slurm drain of one node are one
incident), and resolves it when Slurm returns the node. A node out with pitcrew's own reason (or the
Slinky operator's copy of it) is pitcrew's doing, not a fault. Pure: no I/O, ``now`` passed in.

When Slurm itself sets a node DOWN, the jobs on it are gone from it before pitcrew looks: a
requeued job is PENDING at once with its restart count grown and no node list, and without
slurmdbd nothing Slurm serves says where it ran (``sacct``: "Slurm accounting storage is
disabled"; only ``jobcomp/filetxt`` writes the run, as ``NODE_FAIL`` with its ``NodeList``, to a
file on the controller's host). So the record carries the jobs the watch saw on the node at its
last look while the node was in service (``slurm_jobs``: ``<job id>@<restart count>``), and the
incident follows those.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from datetime import datetime

from bot.domain.jobs import JobSnapshot, SlurmNodeState
from bot.domain.outages import SLURM_OUT, Taker, slurm_outage
from bot.domain.sourced import Sourced

#: The catalog fault and the alert name a Slurm-sourced record carries.
SLURM_FAULT = "slurm-node-out"
ALERTNAME = "SlurmNodeOut"
#: The annotation naming the jobs seen on the node before it went out, and their restart counts.
SEEN_JOBS = "slurm_jobs"


#: One Slurm node out of service by someone else's hand, as an alert's identity and words.
Outage = Sourced


def out_by_others(state: SlurmNodeState) -> bool:
    """Out of service (DOWN, DRAIN or FAIL) with a reason pitcrew did not write: who took it out is
    ``bot.domain.outages``' one rule, the breaker's too."""
    if not state.states & SLURM_OUT or not state.reason:
        return False
    taken = slurm_outage(state.name, state.states, state.reason)
    return taken is not None and taken.by is not Taker.PITCREW


def outage(state: SlurmNodeState, now: datetime, seen: Sequence[JobSnapshot] = ()) -> Outage:
    """The record for a node ``out_by_others``. Its identity is the node and the time Slurm set the
    reason, so every poll of the same outage is a repeat, and a new reason is a new alert. ``seen``:
    the jobs running on it at the watch's last look while it was in service."""
    since = state.reason_time or now
    digest = hashlib.sha256(f"{state.name}\0{since.isoformat()}\0{state.reason}".encode()).hexdigest()
    shown = "+".join(sorted(state.states & SLURM_OUT))
    labels = {
        "alertname": ALERTNAME,
        "node": state.name,
        "slurm_node": state.name,
        "fault": SLURM_FAULT,
        "severity": "warning",
        "slurm_state": shown,
    }
    by = f" by {state.reason_user}" if state.reason_user else ""
    annotations = {
        "summary": f"Slurm set {state.name} {shown}: {state.reason}",
        "description": f"Slurm's reason{by}: {state.reason!r} (pitcrew leaves it as it is)",
    }
    if seen:
        annotations[SEEN_JOBS] = " ".join(f"{job.job_id}@{job.restarts}" for job in seen)
    return Outage(state.name, f"slurm:{digest[:16]}", since, labels, annotations)


def seen_jobs(annotations: Mapping[str, str]) -> dict[str, int]:
    """The jobs an outage record says ran on the node before it went out: job id → restart count
    then. A malformed entry is skipped (an annotation is text anyone's rule could have set)."""
    found: dict[str, int] = {}
    for entry in annotations.get(SEEN_JOBS, "").split():
        job_id, _, restarts = entry.partition("@")
        if job_id and restarts.isdigit():
            found[job_id] = int(restarts)
    return found
