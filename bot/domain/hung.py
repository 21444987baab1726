"""Hung jobs: a Slurm job RUNNING whose training progress has not moved for too long, as an alert.

A job can hang without any fault pitcrew sees (a collective waiting for ever on a peer, a deadlock, a
data loader stuck on a mount): the GPUs look busy and nothing is learned. pitcrew reads the job's
progress (``resumption.progress_query``, the query the resumption proof uses) every look; a job whose
progress has stood still for ``engine.hung_job_after`` becomes one alert-like record (fault
``job-hung``) that enters the store like Alertmanager's, on the job's first node. The catalog gives
it ``notify-only``: one notice, and nothing is done to a node. It resolves when progress moves or the
job ends. A job without a progress sample is never called hung: no data is no evidence.

The notice also says what else its nodes showed lately (``Signal``: the alerts pitcrew has on
them, DCGM's and the network's, firing or from the last ``SIGNAL_WINDOW``), at most
``SIGNAL_LIMIT`` of them, so a human sees at once whether the stall has a visible cause.

Pure: no I/O, ``now`` passed in.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from bot.domain.durations import format_duration
from bot.domain.jobs import JobSnapshot
from bot.domain.sourced import Sourced

HUNG_FAULT = "job-hung"
ALERTNAME = "SlurmJobHung"
#: How far back the notice looks for other alerts on the job's nodes, and how many it names.
SIGNAL_WINDOW = timedelta(hours=1)
SIGNAL_LIMIT = 5
#: Longest alert name or detail a signal shows (a notice line stays short).
_WORD_MAX = 60


@dataclass(frozen=True, slots=True)
class Signal:
    """One other alert on a node of the job: what it was, where, whether it still fires, since when."""

    alertname: str
    node: str
    detail: str
    firing: bool
    at: datetime


def signal_words(signals: Sequence[Signal], window: timedelta = SIGNAL_WINDOW) -> str:
    """The signals as one short sentence: at most ``SIGNAL_LIMIT`` named, and whether there are more
    (the store is asked for one more than that, so their number is not known)."""
    if not signals:
        return f"no other alert on its nodes in the last {format_duration(window)}"
    shown = [
        f"{_short(s.alertname)}{f' ({_short(s.detail)})' if s.detail else ''} on {s.node}"
        f" {'firing since' if s.firing else 'at'} {s.at:%H:%M} UTC"
        for s in signals[:SIGNAL_LIMIT]
    ]
    more = " and more" if len(signals) > SIGNAL_LIMIT else ""
    return f"other alerts on its nodes (last {format_duration(window)}): {'; '.join(shown)}{more}"


def _short(text: str) -> str:
    return text if len(text) <= _WORD_MAX else text[: _WORD_MAX - 1] + "…"


@dataclass(frozen=True, slots=True)
class Progress:
    """A job's last progress value and since when it has stood at it."""

    value: float
    since: datetime


def observe(before: Progress | None, value: float | None, now: datetime) -> Progress | None:
    """The job's progress after a sample: the clock restarts whenever the value changes (a restart
    from a checkpoint too); no sample forgets what was known."""
    if value is None:
        return None
    if before is None or value != before.value:
        return Progress(value, now)
    return before


def is_hung(progress: Progress | None, now: datetime, after: timedelta) -> bool:
    return progress is not None and now - progress.since >= after


#: One hung job, as an alert's identity and words.
HungJob = Sourced


def hung_job(job: JobSnapshot, progress: Progress, now: datetime, signals: Sequence[Signal] = ()) -> HungJob:
    """The record for a hung job. Its identity is the job and the moment its progress stopped, so
    every look at the same stall is a repeat and a new stall after progress is a new alert."""
    node = job.nodes[0]
    stamp = progress.since.isoformat()
    digest = hashlib.sha256(f"{job.job_id}\0{stamp}".encode()).hexdigest()
    labels = {
        "alertname": ALERTNAME,
        "node": node,
        "fault": HUNG_FAULT,
        "severity": "warning",
        "slurm_job_id": job.job_id,
    }
    flat = format_duration(now - progress.since)
    annotations = {
        "summary": f"Slurm job {job.job_id} ({job.name}, {job.user}) made no progress for {flat}",
        "description": (
            f"job {job.job_id} ({job.name}, owner {job.user}) RUNNING on {', '.join(job.nodes)}:"
            f" progress stands at {progress.value:g} since {stamp} ({flat}); {signal_words(signals)}"
        ),
    }
    return HungJob(node, f"hung:{digest[:16]}", progress.since, labels, annotations)
