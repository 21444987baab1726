"""Slurm behind the scheduler port: settings, the backend factory and the ownership rule.

Two backends behave the same: ``scontrol`` (Slurm's commands; ``bot.integrations.slurm_cli``)
and ``rest`` (slurmrestd with a JWT; ``bot.integrations.slurm_rest``, which falls back to the
commands for node updates on servers older than v0.0.39 and for requeue). This module owns
the configuration surface and the choice between them; it must not parse Slurm output or
hold clients of its own.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Literal, Protocol

from pydantic import BaseModel, ConfigDict, Field, model_validator

from bot.domain.jobs import pitcrew_reason
from bot.domain.nodemap import DEFAULT_SLINKY_SELECTOR, NodeMapping
from bot.engine.ports import Scheduler
from bot.integrations.slurm_cli import ScontrolScheduler
from bot.integrations.slurm_rest import RestScheduler

__all__ = [
    "ClosableScheduler",
    "RestScheduler",
    "ScontrolScheduler",
    "SlurmSettings",
    "build_scheduler",
    "pitcrew_reason",
    "resume_if_ours",
]

log = logging.getLogger(__name__)


class SlurmSettings(BaseModel):
    """How pitcrew reaches Slurm and maps Kubernetes nodes to Slurm nodes (config key ``slurm``)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    backend: Literal["scontrol", "rest"] = Field(
        "scontrol",
        description="`scontrol`: Slurm's commands, any version. `rest`: slurmrestd for reads, and for "
        "node updates where the server offers them (v0.0.39+), else scontrol.",
    )
    bin_dir: Path | None = Field(
        None, description="Directory holding scontrol and squeue; unset means search PATH."
    )
    slurm_conf: Path | None = Field(
        None, description="slurm.conf for the commands (exported as SLURM_CONF); unset means Slurm's default."
    )
    command_timeout: float = Field(
        20.0,
        gt=0,
        description="Seconds before a Slurm command is killed. Slurm itself needs ~10 s to give up on "
        "an unreachable controller, so keep this above that to see its message.",
    )
    rest_url: str = Field("http://127.0.0.1:6820", description="slurmrestd base URL.")
    rest_user: str = Field("root", description="Slurm user sent as X-SLURM-USER-NAME.")
    rest_token_file: Path | None = Field(
        None,
        description="File holding the JWT (`scontrol token` output or the bare token). Re-read when it "
        "changes; never logged.",
    )
    rest_api_version: str = Field(
        "auto",
        pattern=r"^(auto|v0\.0\.\d+)$",
        description="`auto` picks the highest slurm/v0.0.XX in the server's OpenAPI document; or pin one.",
    )
    request_timeout: float = Field(10.0, gt=0, description="Seconds per slurmrestd request.")
    node_mapping: Literal["identity", "label", "annotation", "slinky"] = Field(
        "identity",
        description="How a Kubernetes node names its Slurm node(s): same name, a label, an annotation, "
        "or the Slinky slurmd pods on it (then Slurm is drained through the slurm-operator).",
    )
    node_mapping_key: str | None = Field(
        None, description="Label or annotation key holding the Slurm node name(s) (a hostlist is allowed)."
    )
    slinky_namespace: str = Field("slurm", description="Namespace of the Slinky NodeSet (slurmd) pods.")
    slinky_pod_selector: dict[str, str] = Field(
        default_factory=lambda: dict(DEFAULT_SLINKY_SELECTOR),
        description="Labels that select slurmd pods in Slinky mode.",
    )

    @model_validator(mode="after")
    def _check(self) -> SlurmSettings:
        if self.node_mapping in ("label", "annotation") and not self.node_mapping_key:
            raise ValueError(f"slurm.node_mapping={self.node_mapping} needs slurm.node_mapping_key")
        if self.backend == "rest" and self.rest_token_file is None:
            raise ValueError("slurm.backend=rest needs slurm.rest_token_file")
        return self

    def mapping(self) -> NodeMapping:
        """The pure mapping rule (``bot.domain.nodemap``) these settings describe."""
        return NodeMapping(self.node_mapping, self.node_mapping_key, dict(self.slinky_pod_selector))


class ClosableScheduler(Scheduler, Protocol):
    """A scheduler the application closes on shutdown."""

    backend: str

    async def aclose(self) -> None: ...


def build_scheduler(settings: SlurmSettings) -> ScontrolScheduler | RestScheduler:
    """The backend ``settings`` ask for. Nothing connects until the first call."""
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
    )


async def resume_if_ours(scheduler: Scheduler, name: str) -> bool:
    """RESUME ``name`` only if pitcrew set its reason; return whether it did.

    A node someone else took out of service stays out: their reason is their decision. A
    node already in service needs nothing (so a retried step is harmless).
    """
    node = await scheduler.node(name)
    if node.in_service:
        return False
    if not node.reason_is_ours:
        log.warning(
            "not resuming a node pitcrew did not take out of service",
            extra={"slurm_node": name, "reason_user": node.reason_user},
        )
        return False
    await scheduler.resume(name)
    return True
