"""Training progress of Slurm jobs, read through the resumption settings' PromQL query."""

from __future__ import annotations

from collections.abc import Iterable

from bot.engine.context import StepDeps


async def job_progress(deps: StepDeps, job_id: str) -> float | None:
    """The job's progress now (``None`` without a query, a Prometheus, or a sample)."""
    return await _per_job(deps, deps.settings.resumption.progress_query, job_id)


async def job_checkpoint(deps: StepDeps, job_id: str) -> float | None:
    """The job's last checkpoint now (``resumption.checkpoint_query``; ``None`` as for progress)."""
    return await _per_job(deps, deps.settings.resumption.checkpoint_query, job_id)


async def _per_job(deps: StepDeps, template: str | None, job_id: str) -> float | None:
    if not template or deps.ports.query is None:
        return None
    samples = await deps.ports.query.instant(template.replace("{job_id}", job_id))
    values = [value for _, value in samples]
    return max(values) if values else None


async def progress_of(deps: StepDeps, job_ids: Iterable[str]) -> dict[str, float | None]:
    if not deps.settings.resumption.progress_query:
        return {}
    return {job_id: await job_progress(deps, job_id) for job_id in job_ids}
