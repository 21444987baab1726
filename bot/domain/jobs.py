"""Slurm nodes and jobs as pitcrew sees them, and the proof that a job resumed.

Plain frozen records filled by the scheduler adapters (``bot.integrations.slurm``) and
judged here without I/O: whether a job that was on a faulty node is running again elsewhere.
The adapters own parsing; this module owns the meaning. Whose a node's reason is, is
``bot.domain.ownership``'s to say.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence, Set
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Literal

_ACTIVE_JOB_STATES = frozenset({"RUNNING", "SUSPENDED", "COMPLETING", "CONFIGURING"})
_PENDING_JOB_STATES = frozenset({"PENDING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "RESIZING"})
_FINAL_FAILED_STATES = frozenset(
    {"NODE_FAIL", "FAILED", "CANCELLED", "TIMEOUT", "OUT_OF_MEMORY", "BOOT_FAIL", "DEADLINE", "PREEMPTED"}
)


#: Slurm node base states with jobs on them (``SlurmNodeState.busy``).
BUSY = frozenset({"ALLOCATED", "MIXED", "COMPLETING"})
#: Power saving's flags: slurmctld pings no node that carries one (``ping_nodes.c`` ``ping_nodes``).
POWER_SAVING = frozenset({"POWERED_DOWN", "POWERING_DOWN", "POWERING_UP"})


def not_responding(states: Set[str]) -> bool:
    """Slurm lost the node: ``NOT_RESPONDING`` where slurmctld expects an answer. Power saving sets
    the flag itself on a node it wakes (``power_save.c``: ``POWERING_UP`` until its slurmd registers)
    and on a DOWN node RESUMEd while powered down (``node_mgr.c`` ``_require_node_reg``), and pings
    neither; it schedules both all the same: no fault of the node's, and no outage."""
    return "NOT_RESPONDING" in states and not states & POWER_SAVING


@dataclass(frozen=True, slots=True)
class SlurmNodeState:
    """One Slurm node: its state flags (upper case, e.g. ``{"IDLE", "DRAIN"}``) and reason."""

    name: str
    states: frozenset[str]
    reason: str = ""
    reason_user: str | None = None
    reason_time: datetime | None = None
    #: When its slurmd started (``SlurmdStartTime``): the slurmd's host clock when it first
    #: registered (slurmd.c ``_fill_registration_msg``: ``time(NULL)``), kept by slurmctld as reported
    #: (job_mgr.c ``validate_jobs_on_node``). A reboot or replacement starts a new slurmd, with
    #: another; a time of another host's clock, never compared with pitcrew's (``slurmd_started_again``).
    slurmd_started_at: datetime | None = None
    #: GPUs in its generic resources (``Gres=gpu:h100:8``), where Slurm lists them.
    gpus: int | None = None

    @property
    def down(self) -> bool:
        return "DOWN" in self.states

    @property
    def drained(self) -> bool:
        return bool(self.states & {"DRAIN", "DRAINED", "DRAINING"})

    @property
    def busy(self) -> bool:
        """Jobs run on it, or are being ended there: its base state is ALLOCATED, MIXED or
        COMPLETING (as both backends list it)."""
        return bool(self.states & BUSY)

    @property
    def taken_out(self) -> bool:
        """DOWN, or DRAIN (draining or drained): out of service by a node update, what a RESUME
        undoes. A RESUME took once this is false; FAIL and NOT_RESPONDING are Slurm's own view of
        the node, which no RESUME of pitcrew's answers for."""
        return self.down or self.drained

    @property
    def in_service(self) -> bool:
        """Slurm may give it jobs: not taken out, not FAIL, not lost (``not_responding``; a node
        power saving put to sleep or is waking is in service)."""
        return not (self.taken_out or "FAIL" in self.states or not_responding(self.states))


@dataclass(frozen=True, slots=True)
class SlurmdSeen:
    """A Slurm node's slurmd as Slurm reported it just before a repair was issued (persisted with
    the repair's intent): the start time the slurmd that registers after the repair must not have."""

    slurm_node: str
    #: Its ``SlurmdStartTime`` then; None: Slurm reported none (or did not know the node).
    started_at: datetime | None


def slurmd_started_again(
    state: SlurmNodeState, before: Sequence[SlurmdSeen] | None, since: datetime | None = None
) -> bool | None:
    """Whether the Slurm node's slurmd has started again since a reboot or replacement that ends it.

    The one rule, whatever the node mapping: Slurm reporting a start time other than the one it
    reported before the repair was issued (``before``). slurmctld answers for the old slurmd until
    it finds it gone (``SlurmdTimeout``, 300 s by default), so "not NOT_RESPONDING" is no sign of a
    new one. Start times are compared with each other only, never with pitcrew's clock: they are
    the slurmd host's (``SlurmNodeState.slurmd_started_at``), which may run ahead of or behind
    pitcrew's. A Slurm node not in ``before`` is a new record (a successor serving other Slurm node
    names): True. None where Slurm cannot tell: it reports no start time now.

    ``before`` None: an intent persisted by a pitcrew that read no start time, knowing only when the
    repair was issued (``since``; None: nothing known): its start time at or after that second, as
    that pitcrew compared (Slurm keeps whole seconds)."""
    started = state.slurmd_started_at
    if started is None:
        return None
    if before is not None:
        seen = next((s for s in before if s.slurm_node == state.name), None)
        return seen is None or started != seen.started_at
    if since is None:
        return None
    return started >= since.replace(microsecond=0)


#: Why slurmctld refuses to requeue a job, for the job's life (``job_mgr.c`` ``_job_requeue_op``,
#: 22.05 to 26.05, in its order): submitted not requeueable (``ESLURM_DISABLED``, "Requested
#: operation is presently disabled"), then not a batch job (``ESLURM_BATCH_ONLY``, "Only batch jobs
#: are accepted or processed"). It ends neither, and neither can come back by itself elsewhere.
NO_REQUEUE = "it was submitted not requeueable (--no-requeue)"
NOT_BATCH = "it is not a batch job (started by srun or salloc, not sbatch)"


@dataclass(frozen=True, slots=True)
class JobSnapshot:
    """One Slurm job at one moment."""

    job_id: str
    name: str
    user: str
    state: str
    nodes: tuple[str, ...] = ()
    restarts: int = 0
    requeue: bool = True
    reason: str = ""
    start_time: datetime | None = None
    #: GPUs the job holds over all its nodes (``TresPerNode`` x nodes), where Slurm lists them.
    gpus: int | None = None
    #: Submitted by ``sbatch`` (``BatchFlag=1``, REST ``batch_flag``); ``srun`` and ``salloc``
    #: start jobs that are not.
    batch: bool = True

    @property
    def running(self) -> bool:
        return self.state in _ACTIVE_JOB_STATES

    @property
    def who(self) -> str:
        """The job as people know it: its id, name and owner."""
        return f"job {self.job_id} ({self.name or 'no name'}, owner {self.user or 'unknown'})"

    @property
    def not_requeueable(self) -> str | None:
        """Why Slurm refuses to requeue this job (``NO_REQUEUE``, ``NOT_BATCH``), or ``None``."""
        if not self.requeue:
            return NO_REQUEUE
        if not self.batch:
            return NOT_BATCH
        return None

    @property
    def pending(self) -> bool:
        return self.state in _PENDING_JOB_STATES

    @property
    def ended_for_good(self) -> bool:
        return self.state in _FINAL_FAILED_STATES or self.state == "COMPLETED"


#: ``resumed`` (running elsewhere with restarts incremented), ``waiting`` (not yet), ``lost``
#: (ended for good: report to humans, do not wait) or ``finished`` (completed on its own,
#: nothing to prove).
ResumeStatus = Literal["resumed", "waiting", "lost", "finished"]


@dataclass(frozen=True, slots=True)
class ResumeVerdict:
    """Where one recorded job stands after the fault, and the facts it was judged on."""

    job_id: str
    status: ResumeStatus
    detail: str
    old_nodes: tuple[str, ...] = ()
    new_nodes: tuple[str, ...] = ()
    restarts_before: int = 0
    restarts_now: int = 0
    #: Progress read before the fault (the query's units).
    progress_before: float | None = None
    #: The first progress sample after the restart (it may still be the pre-fault run's last).
    progress_at_restart: float | None = None
    progress_now: float | None = None


def judge_resumption(
    before: JobSnapshot,
    now: JobSnapshot | None,
    faulty_nodes: Iterable[str],
    *,
    progress_before: float | None = None,
    progress_at_restart: float | None = None,
    progress_now: float | None = None,
    progress_required: bool = False,
) -> ResumeVerdict:
    """Judge one job recorded on a faulty node against its current snapshot.

    A job counts as resumed only when it runs again, on none of the faulty nodes, with a
    restart count above the recorded one, and — when a progress query is configured —
    with progress strictly past its pre-fault value and past its first sample after the
    restart (which may still be the pre-fault run's last, scraped after the value read
    before DOWN: a job stuck at its checkpoint must not count as resumed).
    """
    bad = frozenset(faulty_nodes)
    base = ResumeVerdict(
        job_id=before.job_id,
        status="waiting",
        detail="",
        old_nodes=before.nodes,
        new_nodes=now.nodes if now else (),
        restarts_before=before.restarts,
        restarts_now=now.restarts if now else before.restarts,
        progress_before=progress_before,
        progress_at_restart=progress_at_restart,
        progress_now=progress_now,
    )

    def verdict(status: ResumeStatus, detail: str) -> ResumeVerdict:
        return replace(base, status=status, detail=detail)

    if now is None:
        return verdict("lost", "Slurm no longer knows the job")
    if now.state == "COMPLETED" and now.restarts == before.restarts:
        return verdict("finished", "job completed before it was interrupted")
    if now.state == "COMPLETED" and not bad & set(now.nodes):
        # It was requeued, ran elsewhere and finished before we looked: resumed, not lost.
        return verdict("resumed", "completed after requeue")
    if now.ended_for_good:
        return verdict("lost", f"job ended {now.state}; it was not requeued")
    if not now.running:
        return verdict("waiting", f"job is {now.state} ({now.reason or 'no reason'})")
    if now.state == "COMPLETING":
        # The interrupted run still ending on its other nodes (a multi-node job loses the faulty
        # node from its NodeList at DOWN, and its restart count has already grown): not a new run.
        return verdict("waiting", "the interrupted run is still completing")
    if bad & set(now.nodes):
        return verdict("waiting", "job still runs on a faulty node")
    if now.restarts <= before.restarts:
        return verdict("waiting", "job runs but its restart count did not grow")
    if progress_required:
        past = max((v for v in (progress_before, progress_at_restart) if v is not None), default=None)
        if progress_now is None:
            return verdict("waiting", "no progress sample yet")
        if past is not None and progress_now <= past:
            return verdict("waiting", f"progress {progress_now:g} not past pre-fault {past:g}")
    return verdict("resumed", "running again elsewhere")


_HOSTLIST_PART = re.compile(r"([^,\[]+)(?:\[([^\]]+)\])?([^,\[]*)")


def expand_hostlist(spec: str) -> tuple[str, ...]:
    """Expand a Slurm hostlist such as ``gpu-[001-003,007],cpu-1`` into names.

    Handles one bracket group per name, zero padding and comma lists; an empty or ``(null)``
    spec is no nodes.
    """
    spec = spec.strip()
    if not spec or spec in {"(null)", "None"}:
        return ()
    names: list[str] = []
    for token in _split_top_level(spec):
        match = _HOSTLIST_PART.fullmatch(token)
        if match is None or match.group(2) is None:
            names.append(token)
            continue
        head, ranges, tail = match.group(1), match.group(2), match.group(3)
        for part in ranges.split(","):
            if "-" in part:
                lo, hi = part.split("-", 1)
                width = len(lo)
                names.extend(f"{head}{n:0{width}d}{tail}" for n in range(int(lo), int(hi) + 1))
            else:
                names.append(f"{head}{part}{tail}")
    return tuple(names)


def _split_top_level(spec: str) -> list[str]:
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(spec):
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth -= 1
        elif ch == "," and depth == 0:
            parts.append(spec[start:i])
            start = i + 1
    parts.append(spec[start:])
    return [p for p in (p.strip() for p in parts) if p]
