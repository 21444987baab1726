"""What a fault cost: GPU-hours out of service, and training time lost per interrupted job.

Pure arithmetic over an incident's own timeline (no clock, no I/O), so the figure a human
recomputes from ``pitcrew incidents show`` is the figure exported as
``pitcrew_gpu_hours_lost_total``:

* node: the node's GPUs x (first delivery → back in service, or → close when it never came back);
* job: the job's GPUs x (first delivery → running again + the progress it had to redo since its
  last checkpoint, in seconds), where the resumption settings' progress query measured it.

The clock starts at the incident's first delivery — when pitcrew could first have acted —
not at the alert's ``startsAt``: an alert already firing for years when pitcrew was deployed
must not add years to the figures. The alert's own age is reported apart
(``alert_age_seconds``), never counted; and one incident adds at most ``max_seconds`` out of
service per node and per job to the counters (the counters are never decreased: one stuck
incident must not poison them for good). That bound is one rule (``counted``), applied to the
node's time out of service and to each job's time lost (to running again + redone) alike; what
was measured beyond it is kept and shown, never counted.

GPU counts come from Slurm's generic resources (``Gres=gpu:h100:8`` on a node,
``TresPerNode=gres:gpu:8`` on a job), parsed here once for every Slurm interface.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime

from bot.domain.jobs import ResumeStatus

_GPU_GRES = re.compile(r"(?:^|[,\s])(?:gres[:/])?gpu(:[^:,=()\s]+)?[:=](\d+)")


def gpus_in_gres(text: str | None) -> int | None:
    """GPUs in a Slurm GRES/TRES string, summed over types: ``gpu:h100:8(S:0-1)``,
    ``gres:gpu:8``, ``gres/gpu=8,gres/gpu:h100=8``, ``gpu:a100:4,gpu:h100:4`` → 8; ``None`` when it names none."""
    if not text:
        return None
    found = _GPU_GRES.findall(text)
    # A TRES string lists the total (``gres/gpu=8``) beside each type (``gres/gpu:h100=8``).
    untyped = [int(n) for kind, n in found if not kind]
    return sum(untyped) if untyped else sum(int(n) for _, n in found) if found else None


def job_gpus(per_node: str | None, nodes: str | None, tres: str | None) -> int | None:
    """A job's GPUs: its allocated TRES when it counts GPUs (accounting of ``gres/gpu`` on),
    else its per-node request times its node count."""
    allocated = gpus_in_gres(tres)
    if allocated is not None:
        return allocated
    each = gpus_in_gres(per_node)
    count = int(nodes) if nodes and nodes.isdigit() else 1
    return each * count if each is not None else None


@dataclass(frozen=True, slots=True)
class JobLoss:
    """Training time one interrupted Slurm job lost to the fault."""

    job_id: str
    gpus: int
    status: ResumeStatus
    #: Fault → the job running again (→ close for a job that never did).
    seconds_to_running: float
    #: Progress (in the query's units) done before the fault and done again after the restart.
    progress_redone: float | None = None
    #: That progress as training seconds (``goodput.progress_unit_seconds``), where known.
    seconds_redone: float | None = None

    @property
    def seconds_lost(self) -> float:
        """Measured: to running again, plus the progress redone where it is known in seconds."""
        return self.seconds_to_running + (self.seconds_redone or 0.0)

    @property
    def gpu_hours(self) -> float:
        """As measured; what an incident counts is ``Goodput.job_gpu_hours``."""
        return self.gpus * self.seconds_lost / 3600


#: The most one incident adds to the counters by default: a day out of service per node and per job.
MAX_SECONDS = 24 * 3600.0


def counted(measured_seconds: float, max_seconds: float) -> float:
    """The seconds one incident adds to the counters for one node or one job: what was measured,
    up to the bound."""
    return min(measured_seconds, max_seconds)


@dataclass(frozen=True, slots=True)
class Goodput:
    """An incident's cost, recorded with the close step's result."""

    node_gpus: int
    #: Where ``node_gpus`` came from: ``slurm`` (the node's Gres) or ``config`` (goodput.gpus_per_node).
    gpus_from: str
    #: Where the clock starts: the incident's first delivery (when pitcrew could first have acted).
    fault_at: datetime
    #: When the node was back in service; ``None``: not by the close (counted to ``ended_at``).
    back_at: datetime | None
    ended_at: datetime
    jobs: tuple[JobLoss, ...] = ()
    #: How long the alert had been firing before the first delivery: reported, never counted.
    alert_age_seconds: float = 0.0
    #: The most this incident adds to the counters, per node and per job (seconds out).
    max_seconds: float = MAX_SECONDS

    @property
    def seconds_out(self) -> float:
        return counted(self.measured_seconds_out, self.max_seconds)

    @property
    def measured_seconds_out(self) -> float:
        return _seconds(self.fault_at, self.back_at or self.ended_at)

    @property
    def capped(self) -> bool:
        """The incident measured more than it may add to the counters."""
        return self.node_capped or any(self.job_capped(job) for job in self.jobs)

    @property
    def node_capped(self) -> bool:
        return self.measured_seconds_out > self.seconds_out

    @property
    def gpu_hours_lost(self) -> float:
        return self.node_gpus * self.seconds_out / 3600

    def job_seconds(self, job: JobLoss) -> float:
        """The seconds this incident counts for one job (by the node's rule)."""
        return counted(job.seconds_lost, self.max_seconds)

    def job_capped(self, job: JobLoss) -> bool:
        return job.seconds_lost > self.job_seconds(job)

    def job_gpu_hours(self, job: JobLoss) -> float:
        return job.gpus * self.job_seconds(job) / 3600

    @property
    def job_gpu_hours_lost(self) -> float:
        return sum(self.job_gpu_hours(job) for job in self.jobs)


def alert_age(first_alert_at: datetime | None, first_delivery: datetime) -> float:
    """Seconds the alert had fired before pitcrew's first delivery of it (0: it started after,
    or its ``startsAt`` is unknown)."""
    return 0.0 if first_alert_at is None else _seconds(first_alert_at, first_delivery)


def job_loss(
    job_id: str,
    gpus: int,
    status: ResumeStatus,
    fault_at: datetime,
    running_at: datetime | None,
    ended_at: datetime,
    *,
    progress_before: float | None = None,
    progress_at_restart: float | None = None,
    progress_unit_seconds: float | None = None,
) -> JobLoss:
    """One job's loss: until it ran again (or the incident ended), plus progress redone."""
    redone = None
    if progress_before is not None and progress_at_restart is not None:
        redone = max(progress_before - progress_at_restart, 0.0)
    seconds_redone = redone * progress_unit_seconds if redone is not None and progress_unit_seconds else None
    return JobLoss(
        job_id=job_id,
        gpus=gpus,
        status=status,
        seconds_to_running=_seconds(fault_at, running_at or ended_at),
        progress_redone=redone,
        seconds_redone=seconds_redone,
    )


def _seconds(start: datetime, end: datetime) -> float:
    """Never negative: an alert's startsAt may be ahead of pitcrew's clock."""
    return round(max((end - start).total_seconds(), 0.0), 3)
