"""Safety policy as data: modes, escalation, circuit breaker, per-node limits, approvals.

Every knob here is visible in ``pitcrew plan`` and validated at start-up. Defaults are the
cautious ones: observe mode, a small blast radius, approvals that do nothing on timeout.

``Policy``'s fields are pitcrew's top-level configuration keys (``mode``, ``playbook_modes``,
``escalation``, ``guards.breaker``, ``guards.node``, ``approvals``): the settings extend this
model rather than mirror it, so a knob added here is configurable with no other change.
``Mode`` is the one place a mode's spelling is normalised.
"""

from __future__ import annotations

from datetime import timedelta
from enum import StrEnum
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from bot.domain.durations import Duration


class Mode(StrEnum):
    """``observe`` records and notifies, ``approve`` waits for a human, ``auto`` acts."""

    OBSERVE = "observe"
    APPROVE = "approve"
    AUTO = "auto"

    @classmethod
    def _missing_(cls, value: object) -> Mode | None:
        # Any case is accepted wherever a mode is read: `mode`, `playbook_modes`, PITCREW_MODE.
        if isinstance(value, str):
            return next((mode for mode in cls if mode.value == value.lower()), None)
        return None


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class EscalationPolicy(_Section):
    window: Duration = Field(default=timedelta(hours=24), description="Repeats inside this window escalate.")
    ladder: tuple[str, ...] = Field(
        default=("reset-gpu", "reboot-node", "replace-node"),
        description="Each repeat on a node moves one rung up.",
    )


class LemonPolicy(_Section):
    """A node that keeps failing (configuration key ``lemon``): its Nth remediation in the window goes
    straight to replacement, the node is labelled, and humans are asked for an RMA with its history."""

    incidents: int = Field(
        default=3, ge=2, description="The remediation on a node that makes it a lemon (counting this one)."
    )
    window: Duration = Field(default=timedelta(days=7), description="Remediations inside this window count.")
    playbook: str = Field(default="replace-node", description="What a lemon's next fault gets.")
    label: str = Field(default="pitcrew.dev/lemon", description="Node label set on a lemon ('true').")


class BreakerPolicy(_Section):
    max_nodes: int = Field(default=3, ge=0, description="Most nodes under remediation within the window.")
    max_fraction: float = Field(
        default=0.05,
        gt=0,
        le=1,
        description="Most share of the fleet, same window (never less than one node).",
    )
    window: Duration = Field(default=timedelta(hours=1))
    stale_after: Duration = Field(
        default=timedelta(minutes=15),
        description="After a breaker reset, alerts that started this long before the reset are skipped.",
    )
    fleet_size: int | None = Field(
        default=None,
        ge=1,
        description="Fleet size for max_fraction; default: Kubernetes' node count, else the node's Slurm "
        "partitions, else unknown (one node at a time).",
    )


class NodePolicy(_Section):
    max_attempts: int = Field(default=3, ge=1, description="Remediations per node within attempt_window.")
    attempt_window: Duration = Field(default=timedelta(hours=24))
    cooldown: Duration = Field(default=timedelta(minutes=30), description="Quiet time after a remediation.")
    opt_out_label: str = Field(
        default="pitcrew.dev/opt-out", description="Node label; 'true' means hands off."
    )


class ApprovalPolicy(_Section):
    approvers: tuple[str, ...] = Field(default=(), description="Who may approve (Slack user ids or names).")
    timeout: Duration = Field(default=timedelta(minutes=30))
    on_timeout: Literal["nothing"] = Field(default="nothing", description="At the deadline nothing is done.")


class GuardPolicy(_Section):
    """The guards with knobs (configuration key ``guards``): circuit breaker and per-node limits."""

    breaker: BreakerPolicy = BreakerPolicy()
    node: NodePolicy = NodePolicy()


class Policy(_Section):
    """What pitcrew may do on its own, and when it must stop or ask."""

    mode: Mode = Field(default=Mode.OBSERVE, description="observe | approve | auto")
    playbook_modes: dict[str, Mode] = Field(default_factory=dict, description="Per-playbook mode overrides.")
    escalation: EscalationPolicy = EscalationPolicy()
    lemon: LemonPolicy = LemonPolicy()
    guards: GuardPolicy = GuardPolicy()
    approvals: ApprovalPolicy = ApprovalPolicy()

    @property
    def breaker(self) -> BreakerPolicy:
        return self.guards.breaker

    @property
    def node(self) -> NodePolicy:
        return self.guards.node

    def mode_for(self, playbook: str) -> Mode:
        return self.playbook_modes.get(playbook, self.mode)
