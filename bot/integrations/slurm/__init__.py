"""Slurm behind the scheduler port: settings and the backend factory.

Two backends behave the same: ``scontrol`` (Slurm's commands; ``bot.integrations.slurm.cli``)
and ``rest`` (slurmrestd with a JWT; ``bot.integrations.slurm.rest``, which falls back to the
commands for node updates on servers older than v0.0.39 and for requeue before v0.0.45). This
module owns the configuration surface and the choice between them; it must not parse Slurm output or
hold clients of its own, nor decide what is pitcrew's to resume (``bot.domain.ownership`` and the
``slurm_resume`` step do).
"""

from __future__ import annotations

from typing import Protocol

from bot.config import SlurmSettings
from bot.engine.ports import Scheduler
from bot.integrations.slurm.cli import ScontrolScheduler
from bot.integrations.slurm.rest import RestScheduler
from bot.store.lease import Fence

__all__ = [
    "ClosableScheduler",
    "RestScheduler",
    "ScontrolScheduler",
    "SlurmSettings",
    "build_scheduler",
]


class ClosableScheduler(Scheduler, Protocol):
    """A scheduler the application closes on shutdown."""

    backend: str

    async def aclose(self) -> None: ...


def build_scheduler(settings: SlurmSettings, fence: Fence | None = None) -> ScontrolScheduler | RestScheduler:
    """The backend ``settings`` ask for, its REST requests that change Slurm fenced by ``fence``
    (``RestScheduler``). Nothing connects until the first call."""
    cli = ScontrolScheduler(
        bin_dir=settings.bin_dir, command_timeout=settings.command_timeout, slurm_conf=settings.slurm_conf
    )
    if settings.backend == "scontrol":
        return cli
    return RestScheduler(
        url=settings.rest_url,
        user=settings.rest_user,
        token_file=settings.rest_token_file,
        fallback=cli,
        api_version=settings.rest_api_version,
        request_timeout=settings.request_timeout,
        fence=fence,
    )
