"""Hung jobs, the pure part (``bot.domain.hung``), table-driven.

Cases: the flat clock starts at the first sample and restarts whenever the value changes (up, or down
after a restart from a checkpoint); no sample forgets; a job is hung only after the full time with a
value; the alert's identity is the job and the moment progress stopped (the same stall is one alert, a
new stall is another), on the job's first node, and its words name the job, nodes and last progress;
the other alerts on its nodes are named, latest first, at most five and each cut short, the rest
said to exist, and none is a sentence of its own.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from bot.domain.hung import (
    HUNG_FAULT,
    SIGNAL_LIMIT,
    Progress,
    Signal,
    hung_job,
    is_hung,
    observe,
    signal_words,
)
from bot.domain.jobs import JobSnapshot

T0 = datetime(2026, 12, 2, 1, 0, tzinfo=UTC)
MIN = timedelta(minutes=1)
HALF_HOUR = timedelta(minutes=30)


def walk(values: list[float | None]) -> list[Progress | None]:
    """The progress after each sample, one a minute."""
    out: list[Progress | None] = []
    current: Progress | None = None
    for n, value in enumerate(values):
        current = observe(current, value, T0 + n * MIN)
        out.append(current)
    return out


@pytest.mark.parametrize(
    ("values", "since_minute"),
    [
        ([5.0, 5.0, 5.0], 0),
        ([5.0, 6.0, 6.0], 1),
        ([5.0, 6.0, 4.0], 2),  # back to an older checkpoint: progress changed
        ([5.0, None, 5.0], 2),  # no sample: forgotten, counted again from the next
    ],
)
def test_the_flat_clock(values: list[float | None], since_minute: int) -> None:
    last = walk(values)[-1]
    assert last is not None and last.since == T0 + since_minute * MIN and last.value == values[-1]


def test_no_sample_is_no_progress_known() -> None:
    assert walk([None]) == [None]
    assert not is_hung(None, T0 + timedelta(days=1), HALF_HOUR)


@pytest.mark.parametrize(("flat", "hung"), [(29, False), (30, True), (90, True)])
def test_hung_after_the_full_time(flat: int, hung: bool) -> None:
    assert is_hung(Progress(5.0, T0), T0 + flat * MIN, HALF_HOUR) is hung


JOB = JobSnapshot("101", "llm-pretrain", "dana", "RUNNING", ("gpu-node-02", "gpu-node-03"))


def test_one_stall_is_one_alert_a_new_stall_another() -> None:
    first = hung_job(JOB, Progress(1200.0, T0), T0 + HALF_HOUR)
    again = hung_job(JOB, Progress(1200.0, T0), T0 + 2 * HALF_HOUR)
    later = hung_job(JOB, Progress(1300.0, T0 + 3 * HALF_HOUR), T0 + 4 * HALF_HOUR)
    assert first.fingerprint == again.fingerprint != later.fingerprint
    assert (first.node, first.starts_at, first.labels["fault"]) == ("gpu-node-02", T0, HUNG_FAULT)
    assert first.labels["slurm_job_id"] == "101"
    words = first.annotations["description"]
    assert all(
        part in words for part in ("101", "llm-pretrain", "dana", "gpu-node-02, gpu-node-03", "1200", "30m")
    )
    assert "no other alert on its nodes in the last 1h" in words


def test_the_other_alerts_on_its_nodes_are_named_and_bounded() -> None:
    xid = Signal("GpuXidError", "gpu-node-03", "xid:13", True, T0 + 5 * MIN)
    port = Signal("NodeInfinibandLinkFlapping", "gpu-node-02", "", False, T0 + 7 * MIN)
    words = hung_job(JOB, Progress(1200.0, T0), T0 + HALF_HOUR, (xid, port)).annotations["description"]
    assert (
        "other alerts on its nodes (last 1h): GpuXidError (xid:13) on gpu-node-03 firing since 01:05 UTC;"
        in words
    )
    assert "NodeInfinibandLinkFlapping on gpu-node-02 at 01:07 UTC" in words
    many = [Signal("A" * 200, "gpu-node-02", "d" * 200, True, T0)] * (SIGNAL_LIMIT + 3)
    text = signal_words(many)
    assert text.count("on gpu-node-02") == SIGNAL_LIMIT and text.endswith(" and more")
    assert "A" * 60 not in text and "A" * 59 + "…" in text
    assert len(text) < 1000  # one notice line, far inside Slack's 3000 characters a section holds
