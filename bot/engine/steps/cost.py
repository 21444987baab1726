"""What the incident cost, assembled at close from the other steps' typed results.

The arithmetic is ``bot.domain.goodput``; this module only finds its inputs in the
incident's timeline (fault time, the node's GPUs, when it was back, each job's way back)
and exports the result once, with the close.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from bot.domain.durations import format_duration
from bot.domain.goodput import Goodput, JobLoss, alert_age, job_loss
from bot.engine.context import Results, StepContext
from bot.engine.metrics import Metrics
from bot.engine.steps.back import SlurmResumeResult
from bot.engine.steps.resumed import ConfirmResumedResult
from bot.engine.steps.slurm import SlurmDownResult
from bot.engine.trust import fault_class


def account(ctx: StepContext[Any], facts: Results, now: datetime) -> Goodput | None:
    """The incident's cost, from the steps' results ``facts`` (``close``'s one read of them);
    ``None`` when pitcrew never took the node out of Slurm."""
    down = facts.of(SlurmDownResult)
    if down is None or not down.slurm_nodes:
        return None
    fault_at = ctx.incident.opened_at  # the first delivery: when pitcrew could first have acted
    resumed = facts.of(SlurmResumeResult)
    confirmed = facts.of(ConfirmResumedResult)
    settings = ctx.settings.goodput
    known = [down.gpus[n] for n in down.slurm_nodes if n in down.gpus]
    node_gpus = sum(known) if known else settings.gpus_per_node * len(down.slurm_nodes)
    gpus_of = {job.job_id: job.gpus for job in down.jobs or ()}
    jobs: list[JobLoss] = []
    for outcome in confirmed.jobs if confirmed else ():
        verdict = outcome.verdict
        if verdict.status == "finished":
            continue  # it completed on its own: nothing was lost
        jobs.append(
            job_loss(
                verdict.job_id,
                gpus_of.get(verdict.job_id) or node_gpus,
                verdict.status,
                fault_at,
                outcome.restarted_at or outcome.resumed_at,
                now,
                progress_before=verdict.progress_before,
                progress_at_restart=verdict.progress_at_restart,
                progress_unit_seconds=settings.progress_unit_seconds,
            )
        )
    return Goodput(
        node_gpus=node_gpus,
        gpus_from="slurm" if known else "config",
        fault_at=fault_at,
        back_at=resumed.returned_at if resumed else None,
        ended_at=now,
        jobs=tuple(jobs),
        alert_age_seconds=alert_age(ctx.incident.first_alert_at, fault_at),
        max_seconds=settings.max_hours_per_incident * 3600,
    )


def export(metrics: Metrics, playbook: str, fault: str, cost: Goodput) -> None:
    metrics.gpu_hours_lost.labels(playbook, fault).inc(cost.gpu_hours_lost)
    metrics.job_gpu_hours_lost.labels(playbook, fault).inc(cost.job_gpu_hours_lost)


def export_for(ctx: StepContext[Any], cost: Goodput) -> None:
    export(ctx.deps.metrics, ctx.incident.playbook or "unknown", fault_class(ctx.plan), cost)


def lines(cost: Goodput) -> list[str]:
    """The cost as the close summary and ``pitcrew incidents show`` print it."""
    out = [
        f"GPU-hours lost: {cost.gpu_hours_lost:.2f} ({cost.node_gpus} GPUs x "
        f"{format_duration_s(cost.seconds_out)} out of service"
        f"{'' if cost.back_at else ', not back by the close'})"
    ]
    if cost.capped:
        cut = [f"{format_duration_s(cost.measured_seconds_out)} out of service"] if cost.node_capped else []
        cut += [
            f"job {job.job_id} {format_duration_s(job.seconds_lost)} lost"
            for job in cost.jobs
            if cost.job_capped(job)
        ]
        out.append(
            f"counted up to {format_duration_s(cost.max_seconds)} per node and per job "
            f"(goodput.max_hours_per_incident); measured {', '.join(cut)}"
        )
    for job in cost.jobs:
        redone = ""
        if job.progress_redone is not None:
            redone = f" + {job.progress_redone:g} progress redone"
            if job.seconds_redone is not None:
                redone += f" ({format_duration_s(job.seconds_redone)})"
        measured = f"{format_duration_s(job.seconds_to_running)} to running again{redone}"
        if cost.job_capped(job):
            measured = f"{format_duration_s(cost.job_seconds(job))} counted of {measured}"
        out.append(
            f"job {job.job_id} training lost: {cost.job_gpu_hours(job):.2f} GPU-hours ({job.gpus} GPUs x "
            f"{measured}; {job.status})"
        )
    return out


def format_duration_s(seconds: float) -> str:
    return format_duration(timedelta(seconds=seconds))
