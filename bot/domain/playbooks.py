"""Playbooks as data: ordered steps from one shared vocabulary, each with its budget.

Shipped defaults live in ``bot/data/playbooks.yaml``; operators override or add playbooks in
their configuration. Step names, flags and default budgets come from the engine's step
registry, passed in as a ``Vocabulary``: this module knows the shape of a playbook, not the
steps. The ``approve`` step is never written in a playbook: the planner
inserts it before the first step that needs approval when the mode asks for approvals.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Literal, Protocol

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from bot.domain.durations import Duration


@dataclass(frozen=True, slots=True)
class Budget:
    """How long one attempt of a step may take, and how many attempts it gets."""

    timeout: timedelta
    attempts: int


class StepTraits(Protocol):
    """What playbook validation and the planner know of a step. The engine's step registry
    (``bot.engine.registry``) is the one vocabulary; the domain reads it through this view."""

    @property
    def mutating(self) -> bool: ...

    @property
    def destructive(self) -> bool: ...

    @property
    def budget(self) -> Budget: ...

    @property
    def needs(self) -> tuple[str, ...]: ...


#: Step name → its traits: the step vocabulary as the domain sees it.
Vocabulary = Mapping[str, StepTraits]

#: Inserted by the planner in approve mode; never written in a playbook.
APPROVE = "approve"
#: Every playbook ends with it.
CLOSE = "close"


class StepSpec(BaseModel):
    """One step of a playbook and its budget: a timeout per attempt and a number of attempts."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    step: str = Field(min_length=1, max_length=64)
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

    def needs_approval(self, traits: StepTraits) -> bool:
        return self.approval if self.approval is not None else traits.destructive

    def budget(self, traits: StepTraits) -> Budget:
        """This playbook's budget for the step, the step's default where the playbook sets none."""
        return Budget(self.timeout or traits.budget.timeout, self.attempts or traits.budget.attempts)


#: Steps whose failure means the repair did not clear the fault (the GPU reset, the reboot, the
#: node's return and its validation): a playbook with a ``next`` rung climbs to it on one of these
#: instead of escalating to humans. Any other failure still goes to humans.
CLIMBS_ON: frozenset[str] = frozenset({"reset_gpu", "reboot", "wait_ready"})


#: The steps that repair the machine where it stands, restarting what runs on it.
IN_PLACE_REPAIRS: frozenset[str] = frozenset({"reset_gpu", "reboot"})


def repairs_in_place(steps: Iterable[str]) -> bool:
    """Whether a plan repairs the machine where it stands (``reset_gpu``, ``reboot``) and does not
    replace it (``replace``), nor leave it to humans with neither. Only such a plan's ``drain``
    leaves the slurmd pods of a Slinky NodeSet (``PodRef.nodeset_pod``) on the node, for the repair
    to restart there: slurm-operator makes an evicted one again, but not on the cordoned node. In
    StatefulSet mode under the same name, its Slurm node's, unbound (``NewNodeSetStatefulSetPod``),
    and kube-scheduler places it on another node (or it pends and Karpenter launches one for it):
    the demand a replacement needs, and the Slurm node moved away from a machine repaired in place.
    In DaemonSet mode only once the node is uncordoned (``PodShouldRunOnNode``): none serves the
    Slurm node meanwhile. A drain that empties the node for a replacement or for humans evicts them.
    A drain done for a plan that repairs in place does not carry over into one that does not
    (``bot.engine.admission``)."""
    listed = set(steps)
    return bool(listed & IN_PLACE_REPAIRS) and "replace" not in listed


class Playbook(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    description: str = ""
    next: str | None = Field(
        default=None,
        description="The repair ladder's next rung inside one incident: the playbook to climb to when "
        "this one's repair fails (a step of CLIMBS_ON) or its fault comes back after the node's return, "
        "under the same approval rules; unset: humans.",
    )
    fault_returns_within: Duration | None = Field(
        default=None,
        description="With next: how long the incident stays open after the node's return; the same "
        "fault firing again inside it climbs to next (bot.domain.returns). Unset: only while the "
        "incident's own steps still run.",
    )
    slurm_action: Literal["auto", "down", "drain"] = Field(
        default="auto", description="auto: DOWN when the fault kills the job, else DRAIN."
    )
    steps: tuple[StepSpec, ...]

    @field_validator("steps")
    @classmethod
    def _valid_order(cls, steps: tuple[StepSpec, ...]) -> tuple[StepSpec, ...]:
        names = [s.step for s in steps]
        if APPROVE in names:
            raise ValueError("'approve' is inserted by the planner from the mode; do not list it")
        if len(set(names)) != len(names):
            raise ValueError(f"a step appears twice: {names}")
        if not names or names[-1] != CLOSE:
            raise ValueError("a playbook ends with 'close'")
        return steps

    def problems(self, vocabulary: Vocabulary) -> list[str]:
        """What the step vocabulary says is wrong with this playbook (unknown steps, missing prerequisites)."""
        names = [s.step for s in self.steps]
        found = []
        for index, name in enumerate(names):
            traits = vocabulary.get(name)
            if traits is None:
                known = ", ".join(sorted(n for n in vocabulary if n != APPROVE))
                found.append(f"unknown step {name!r} (steps: {known})")
                continue
            for needed in traits.needs:
                if needed not in names[:index]:
                    found.append(f"{name!r} needs {needed!r} before it")
        return found

    def spec(self, step: str) -> StepSpec:
        for spec in self.steps:
            if spec.step == step:
                return spec
        return StepSpec.model_validate({"step": step})

    def acts(self, vocabulary: Vocabulary) -> bool:
        """Whether any step changes a far side."""
        return any(vocabulary[s.step].mutating for s in self.steps if s.step in vocabulary)


class PlaybookOverride(BaseModel):
    """A playbook as the configuration gives it (``playbooks:``): a new one, whole, or a change to
    a shipped one, whose fields left out keep their shipped values (``{slurm_action: down}``
    alone keeps its steps, so the configuration does not copy them)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    description: str = ""
    next: str | None = None
    fault_returns_within: Duration | None = None
    slurm_action: Literal["auto", "down", "drain"] = "auto"
    steps: tuple[StepSpec, ...] | None = None

    def over(self, shipped: Playbook | None) -> Playbook:
        """The playbook this makes of ``shipped`` (``None``: a new playbook, which needs its steps)."""
        given = self.model_dump(exclude_unset=True)
        if shipped is None:
            if self.steps is None:
                raise ValueError("a new playbook needs its steps")
            return Playbook.model_validate(given)
        return Playbook.model_validate({**shipped.model_dump(), **given})


def _has_step(playbook: Playbook, step: str) -> bool:
    return any(spec.step == step for spec in playbook.steps)


class PlaybookSet(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    version: int = 1
    playbooks: dict[str, Playbook]

    def merged(self, overrides: dict[str, Playbook]) -> PlaybookSet:
        return self.model_copy(update={"playbooks": {**self.playbooks, **overrides}})

    def changed(self, overrides: dict[str, PlaybookOverride]) -> PlaybookSet:
        """These playbooks with the configuration's changes and additions (``PlaybookOverride``)."""
        return self.merged({name: o.over(self.playbooks.get(name)) for name, o in overrides.items()})

    def problems(self, vocabulary: Vocabulary) -> list[str]:
        found = [
            f"playbooks.{name}: {problem}"
            for name, playbook in sorted(self.playbooks.items())
            for problem in playbook.problems(vocabulary)
        ]
        for name in sorted(self.playbooks):
            if self.playbooks[name].fault_returns_within is not None and self.playbooks[name].next is None:
                found.append(f"playbooks.{name}: fault_returns_within needs a next rung to climb to")
            taker = self.playbooks[name]
            if (
                taker.next in self.playbooks
                and _has_step(taker, "capacity")
                and not _has_step(self.playbooks[taker.next], "give_back")
            ):
                found.append(
                    f"playbooks.{name}: takes a node from a pool (capacity) and climbs to {taker.next!r},"
                    " which has no give_back: after a climb the node taken would stay lent until a rollback"
                )
            seen = [name]
            rung = self.playbooks[name].next
            while rung is not None:
                if rung not in self.playbooks:
                    found.append(f"playbooks.{seen[-1]}: next rung {rung!r} is not a playbook")
                    break
                if rung in seen:
                    found.append(
                        f"playbooks.{name}: the ladder climbs in a circle ({' → '.join([*seen, rung])})"
                    )
                    break
                seen.append(rung)
                rung = self.playbooks[rung].next
        return found

    def get(self, name: str) -> Playbook:
        try:
            return self.playbooks[name]
        except KeyError:
            raise KeyError(f"no playbook named {name!r}") from None
