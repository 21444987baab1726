"""Playbooks as data: ordered steps from one shared vocabulary, each with its budget.

Shipped defaults live in ``bot/data/playbooks.yaml``; operators override or add playbooks in
their configuration. The ``approve`` step is never written in a playbook: the planner
inserts it before the first step that needs approval when the mode asks for approvals.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from bot.domain.durations import Duration

StepName = Literal[
    "notify",
    "approve",
    "slurm_down",
    "cordon",
    "drain",
    "reset_gpu",
    "reboot",
    "replace",
    "wait_ready",
    "slurm_resume",
    "confirm_resumed",
    "close",
]
STEP_NAMES: tuple[str, ...] = StepName.__args__  # type: ignore[attr-defined]

#: Steps that change a far side; observe mode records them and skips them.
MUTATING = frozenset({"slurm_down", "cordon", "drain", "reset_gpu", "reboot", "replace", "slurm_resume"})
#: Mutating steps that take something away (counted, audited, never run twice).
DESTRUCTIVE = frozenset({"slurm_down", "cordon", "drain", "reset_gpu", "reboot", "replace"})
#: What rollback can undo, and how. Other completed steps are reported as irreversible.
REVERSIBLE = {
    "slurm_down": "RESUME the Slurm node if its reason is still pitcrew's",
    "cordon": "uncordon and untaint the node if it still carries pitcrew's annotation",
    "replace": "cancel the replacement if it has not started",
}
IRREVERSIBLE = {
    "drain": "evicted pods are not brought back; they reschedule once the node is uncordoned",
    "reset_gpu": "a GPU reset cannot be undone",
    "reboot": "a reboot cannot be undone",
}

_DEFAULT_BUDGET: dict[str, tuple[float, int]] = {
    # step: (timeout seconds, attempts)
    "notify": (30, 5),
    "approve": (1800, 1),
    "slurm_down": (60, 5),
    "cordon": (60, 5),
    "drain": (900, 50),
    "reset_gpu": (600, 3),
    "reboot": (1200, 3),
    "replace": (300, 5),
    "wait_ready": (2700, 1),
    "slurm_resume": (120, 5),
    "confirm_resumed": (1200, 1),
    "close": (30, 5),
}


class StepSpec(BaseModel):
    """One step of a playbook and its budget: a timeout per attempt and a number of attempts."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    step: StepName
    timeout: Duration | None = None
    attempts: int | None = Field(default=None, ge=1, le=1000)
    approval: bool | None = Field(
        default=None, description="Needs approval in approve mode (default: destructive)."
    )
    options: dict[str, str | int | float | bool] = Field(default_factory=dict)

    @model_validator(mode="before")
    @classmethod
    def _bare_name(cls, value: Any) -> Any:
        return {"step": value} if isinstance(value, str) else value

    @property
    def name(self) -> str:
        return self.step

    @property
    def needs_approval(self) -> bool:
        return self.approval if self.approval is not None else self.step in DESTRUCTIVE

    @property
    def budget(self) -> tuple[timedelta, int]:
        seconds, attempts = _DEFAULT_BUDGET[self.step]
        return (self.timeout or timedelta(seconds=seconds), self.attempts or attempts)


class Playbook(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    description: str = ""
    slurm_action: Literal["auto", "down", "drain"] = Field(
        default="auto", description="auto: DOWN when the fault kills the job, else DRAIN."
    )
    steps: tuple[StepSpec, ...]

    @field_validator("steps")
    @classmethod
    def _valid_order(cls, steps: tuple[StepSpec, ...]) -> tuple[StepSpec, ...]:
        names = [s.step for s in steps]
        if "approve" in names:
            raise ValueError("'approve' is inserted by the planner from the mode; do not list it")
        if len(set(names)) != len(names):
            raise ValueError(f"a step appears twice: {names}")
        if not names or names[-1] != "close":
            raise ValueError("a playbook ends with 'close'")
        if "slurm_resume" in names and "slurm_down" not in names:
            raise ValueError("'slurm_resume' without 'slurm_down' would resume a node pitcrew never took")
        return steps

    def spec(self, step: str) -> StepSpec:
        for spec in self.steps:
            if spec.step == step:
                return spec
        return StepSpec.model_validate({"step": step})

    @property
    def acts(self) -> bool:
        return any(s.step in MUTATING for s in self.steps)


class PlaybookSet(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    version: int = 1
    playbooks: dict[str, Playbook]

    def merged(self, overrides: dict[str, Playbook]) -> PlaybookSet:
        return self.model_copy(update={"playbooks": {**self.playbooks, **overrides}})

    def get(self, name: str) -> Playbook:
        try:
            return self.playbooks[name]
        except KeyError:
            raise KeyError(f"no playbook named {name!r}") from None
