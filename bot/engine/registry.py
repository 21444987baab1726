"""The step registry: one frozen ``StepDef`` per step, registered once, read by everyone.

In the spirit of kopf's handler registries: a step module defines its result record and
its reconcile function and registers both, with everything the engine needs to know about
the step — the incident state it runs in, whether it changes a far side (and takes
something away), what observe mode says instead of running it, its default budget, which
track it runs on, which steps must precede it, and how rollback undoes it (or why it
cannot). Playbook validation, the planner, observe mode, metric labels and rollback read
this registry; adding a step is one module and one ``@REGISTRY.step(...)``.

``approve`` is not a step here: the planner inserts it from the mode and the flow waits on
humans for it.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterator, Mapping
from dataclasses import dataclass
from datetime import timedelta
from enum import StrEnum
from typing import Any, Generic, Literal

from bot.domain.incident import State
from bot.domain.playbooks import Budget, PlaybookSet
from bot.engine.context import Done, Kept, R, StepContext, StepResult, UndoContext, Wait

Handler = Callable[[StepContext[R]], Awaitable[Done[R] | Wait]]
#: Undo one completed step: returns the report line, ``Kept`` when the change must stand for now
#: (tried again by a later rollback), or ``None`` when there was nothing to say.
Undo = Callable[[UndoContext, R], Awaitable[str | Kept | None]]
Port = Literal["scheduler", "cluster", "notifier"]


class Track(StrEnum):
    """``node``: take the node out, repair it, return it. ``job``: prove the training job
    runs again — concurrently with the node track, once the Slurm node is out."""

    NODE = "node"
    JOB = "job"


@dataclass(frozen=True, slots=True)
class StepDef(Generic[R]):
    name: str
    handler: Handler[R]
    result: type[R]
    state: State
    budget: Budget
    #: What observe mode records instead of running the step (``{action}``: DOWN or DRAIN).
    would: str
    #: How rollback undoes the step, or why it does not.
    undo: Undo[R] | str
    mutating: bool = False
    destructive: bool = False
    #: Runs in observe mode too (it only tells humans).
    in_observe: bool = False
    track: Track = Track.NODE
    needs: tuple[str, ...] = ()
    #: The far side the step acts through (configurations are checked against it).
    port: Port | None = None
    #: Without a Kubernetes cluster (``integrations.cluster: none``) the step is not applicable.
    needs_cluster: bool = False

    def __post_init__(self) -> None:
        problems = []
        if not self.name or not self.name.isidentifier():
            problems.append("a step name is an identifier")
        if self.budget.timeout <= timedelta(0) or self.budget.attempts < 1:
            problems.append("a budget has a positive timeout and at least one attempt")
        if not self.would.strip():
            problems.append("observe mode must say what the step would do")
        if isinstance(self.undo, str) and not self.undo.strip():
            problems.append("say how the step is undone, or why it is not")
        if self.destructive and not self.mutating:
            problems.append("a destructive step is mutating")
        if self.mutating and self.in_observe:
            problems.append("observe mode never runs a mutating step")
        if self.mutating and self.port is None:
            problems.append("a mutating step names the port it acts through")
        if problems:
            raise ValueError(f"step {self.name!r}: " + "; ".join(problems))

    @property
    def reversible(self) -> bool:
        return not isinstance(self.undo, str)


class StepRegistry(Mapping[str, StepDef[Any]]):
    def __init__(self, steps: Mapping[str, StepDef[Any]] | None = None) -> None:
        self._steps: dict[str, StepDef[Any]] = dict(steps or {})
        self._by_result: dict[type[StepResult], str] = {d.result: n for n, d in self._steps.items()}

    def register(self, definition: StepDef[Any]) -> None:
        if definition.name in self._steps:
            raise ValueError(f"step {definition.name!r} is registered twice")
        if definition.result in self._by_result:
            raise ValueError(
                f"result type {definition.result.__name__} already belongs to {self._by_result[definition.result]!r}"
            )
        self._steps[definition.name] = definition
        self._by_result[definition.result] = definition.name

    def step(
        self,
        result: type[R],
        *,
        state: State,
        timeout: timedelta,
        attempts: int,
        would: str,
        undo: Undo[R] | str,
        mutating: bool = False,
        destructive: bool = False,
        in_observe: bool = False,
        track: Track = Track.NODE,
        needs: tuple[str, ...] = (),
        port: Port | None = None,
        needs_cluster: bool = False,
        name: str | None = None,
    ) -> Callable[[Handler[R]], Handler[R]]:
        """Register the decorated reconcile function as a step (named after it unless ``name``)."""

        def register(handler: Handler[R]) -> Handler[R]:
            self.register(
                StepDef(
                    name=name or handler.__name__,
                    handler=handler,
                    result=result,
                    state=state,
                    budget=Budget(timeout, attempts),
                    would=would,
                    undo=undo,
                    mutating=mutating,
                    destructive=destructive,
                    in_observe=in_observe,
                    track=track,
                    needs=needs,
                    port=port,
                    needs_cluster=needs_cluster,
                )
            )
            return handler

        return register

    def copy(self) -> StepRegistry:
        return StepRegistry(self._steps)

    def step_of(self, result: type[StepResult]) -> str:
        """The step whose result record is ``result``."""
        return self._by_result[result]

    def problems(self, playbooks: PlaybookSet) -> list[str]:
        """Every way the playbooks disagree with the registered steps (checked at start)."""
        return playbooks.problems(self)

    def __getitem__(self, name: str) -> StepDef[Any]:
        return self._steps[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._steps)

    def __len__(self) -> int:
        return len(self._steps)


#: The registry of pitcrew's own steps; ``bot.engine.steps`` fills it on import.
REGISTRY = StepRegistry()
