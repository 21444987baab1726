"""GPU counts from every Slurm interface, and the cost arithmetic.

Cases: GRES/TRES spellings (typed, untyped, summed, with index suffixes, none); a job's GPUs
from allocated TRES or per-node request x nodes; the captured ``scontrol -o``, ``squeue
--json`` and slurmrestd fixtures give each node and job its GPUs; a job's loss adds the
progress it redid (in seconds where the unit is configured) and never goes negative; one
incident adds at most its bound (node and job, by one rule: a job measured at 305 days to running
again counts a day, as a node out for 305 days does) and says it was cut; the alert's age is
measured to its first delivery.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from bot.domain.goodput import Goodput, alert_age, gpus_in_gres, job_gpus, job_loss
from bot.integrations.slurm.cli import parse_job_line, parse_node_line
from bot.integrations.slurm.json import jobs_from_payload, nodes_from_payload

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "slurm"
T0 = datetime(2026, 12, 1, 3, 0, tzinfo=UTC)


@pytest.mark.parametrize(
    ("text", "gpus"),
    [
        ("gpu:h100:8", 8),
        ("gres:gpu:h100:8", 8),
        ("gpu:h100:8(S:0-1)", 8),
        ("gpu:h100:8(IDX:0-7)", 8),
        ("gpu:8", 8),
        ("gres/gpu=8", 8),
        ("cpu=2,mem=2G,node=1,billing=2,gres/gpu=8,gres/gpu:h100=8", 8),
        ("gpu:a100:4,gpu:h100:4", 8),
        ("cpu=1,node=1,billing=1", None),
        ("(null)", None),
        ("", None),
        (None, None),
    ],
)
def test_gpus_in_gres(text: str | None, gpus: int | None) -> None:
    assert gpus_in_gres(text) == gpus


@pytest.mark.parametrize(
    ("per_node", "nodes", "tres", "gpus"),
    [
        ("gres:gpu:h100:8", "2", "cpu=2,node=2", 16),
        ("gres:gpu:h100:8", "", "", 8),
        ("", "2", "cpu=2,node=2,gres/gpu=12", 12),
        ("", "1", "cpu=1,node=1", None),
    ],
)
def test_job_gpus(per_node: str, nodes: str, tres: str, gpus: int | None) -> None:
    assert job_gpus(per_node, nodes, tres) == gpus


def test_every_slurm_interface_reports_the_gpus() -> None:
    cli = FIXTURES / "cli"
    nodes = [line for line in (cli / "scontrol-show-node-o.txt").read_text().splitlines() if line.strip()]
    assert [parse_node_line(line).gpus for line in nodes] == [8] * len(nodes)
    jobs = [line for line in (cli / "scontrol-show-job-o.txt").read_text().splitlines() if line.strip()]
    assert [parse_job_line(line).gpus for line in jobs] == [8, 8, 8, 2, 2]
    squeue = jobs_from_payload(json.loads((cli / "squeue.json").read_text()))
    assert [j.gpus for j in squeue] == [8, 8, 8, 2, 2]
    rest = FIXTURES / "rest"
    assert [j.gpus for j in jobs_from_payload(json.loads((rest / "jobs-running.json").read_text()))] == [8]
    healthy = nodes_from_payload(json.loads((rest / "nodes-all-healthy.json").read_text()))
    assert [n.gpus for n in healthy] == [8, 8, 8]


def test_a_job_loses_time_to_running_plus_progress_redone() -> None:
    loss = job_loss(
        "7",
        8,
        "resumed",
        T0,
        T0 + timedelta(seconds=90),
        T0 + timedelta(minutes=30),
        progress_before=120,
        progress_at_restart=100,
        progress_unit_seconds=1.5,
    )
    assert (loss.seconds_to_running, loss.progress_redone, loss.seconds_redone) == (90, 20, 30)
    assert loss.gpu_hours == pytest.approx(8 * 120 / 3600)


def test_a_job_never_back_loses_until_the_close_and_nothing_is_negative() -> None:
    lost = job_loss(
        "7", 4, "lost", T0, None, T0 + timedelta(hours=1), progress_before=5, progress_at_restart=9
    )
    assert (lost.seconds_to_running, lost.progress_redone, lost.seconds_redone) == (3600, 0, None)
    assert lost.gpu_hours == 4
    early = job_loss("8", 4, "resumed", T0, T0 - timedelta(seconds=5), T0)  # alert clock ahead of ours
    assert early.gpu_hours == 0


def test_the_node_is_out_until_back_or_until_the_close() -> None:
    back = Goodput(8, "slurm", T0, T0 + timedelta(minutes=45), T0 + timedelta(hours=1))
    assert (back.seconds_out, back.gpu_hours_lost) == (2700, 6)
    never = Goodput(8, "config", T0, None, T0 + timedelta(hours=2))
    assert never.gpu_hours_lost == 16


def test_one_incident_adds_at_most_its_bound_and_says_so() -> None:
    week = Goodput(8, "slurm", T0, None, T0 + timedelta(days=7), max_seconds=86400)
    assert (week.seconds_out, week.gpu_hours_lost, week.capped) == (86400, 192, True)
    assert week.measured_seconds_out == 7 * 86400
    job = job_loss("9", 4, "lost", T0, None, T0 + timedelta(days=7))
    with_job = Goodput(
        8, "slurm", T0, T0 + timedelta(hours=1), T0 + timedelta(days=7), (job,), max_seconds=86400
    )
    assert with_job.gpu_hours_lost == 8 and with_job.job_gpu_hours_lost == 4 * 24 and with_job.capped
    within = Goodput(8, "slurm", T0, T0 + timedelta(hours=1), T0 + timedelta(hours=2), max_seconds=86400)
    assert (within.gpu_hours_lost, within.capped) == (8, False)


@pytest.mark.parametrize(
    ("running_after", "redone_seconds", "counted_seconds"),
    [
        (timedelta(days=305), 0, 86400),  # a start time far from the fault's
        (timedelta(hours=23), 2 * 3600, 86400),  # the progress redone counts toward the bound
        (timedelta(hours=23), 0, 23 * 3600),
        (timedelta(days=1), 0, 86400),  # exactly the bound: not cut
    ],
)
def test_a_jobs_loss_is_bounded_by_the_nodes_rule(
    running_after: timedelta, redone_seconds: float, counted_seconds: float
) -> None:
    job = job_loss(
        "9",
        8,
        "resumed",
        T0,
        T0 + running_after,
        T0 + running_after,
        progress_before=redone_seconds,
        progress_at_restart=0,
        progress_unit_seconds=1,
    )
    node_out = running_after + timedelta(seconds=redone_seconds)
    cost = Goodput(8, "slurm", T0, T0 + node_out, T0 + node_out, (job,), max_seconds=86400)
    assert cost.job_seconds(job) == counted_seconds == cost.seconds_out  # one rule for both
    assert cost.job_gpu_hours_lost == cost.job_gpu_hours(job) == 8 * counted_seconds / 3600
    assert cost.job_capped(job) == cost.node_capped == (job.seconds_lost > 86400) == cost.capped
    assert job.gpu_hours == 8 * node_out.total_seconds() / 3600  # the measured figure is kept


def test_the_alerts_age_is_measured_to_the_first_delivery() -> None:
    assert alert_age(T0 - timedelta(days=3650), T0) == 3650 * 86400
    assert alert_age(T0 + timedelta(seconds=3), T0) == 0  # its clock ahead of ours
    assert alert_age(None, T0) == 0
