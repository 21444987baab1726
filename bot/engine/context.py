"""What a step sees while it runs, and what it may answer.

A step is a reconcile function (as in kopf): it reads the far side, acts only if the far
side is not yet as wanted, verifies, and answers ``Done`` or ``Wait`` ("not yet, ask me
again in a while"). It writes its intent with ``ctx.intend`` *before* any destructive call,
so a step resumed after a crash knows what it may already have done.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from bot.config import Config
from bot.domain.jobs import pitcrew_reason
from bot.domain.playbooks import StepSpec
from bot.engine.metrics import Metrics
from bot.engine.ports import Cluster, MetricsQuery, Notice, Notifier, Scheduler
from bot.store.base import IncidentRecord, NewEvent, StepRecord, Store

SlurmNames = Callable[[str], Awaitable[Sequence[str]]]


async def identity_names(node: str) -> Sequence[str]:
    return (node,)


@dataclass
class Ports:
    """The far sides, injected by the composition root."""

    scheduler: Scheduler
    cluster: Cluster
    notifier: Notifier
    query: MetricsQuery | None = None
    slurm_names: SlurmNames = identity_names


@dataclass(frozen=True, slots=True)
class Done:
    result: Mapping[str, Any] = field(default_factory=dict)
    detail: str = ""


@dataclass(frozen=True, slots=True)
class Wait:
    """Not finished: run the step again after ``delay`` seconds (until the step deadline)."""

    delay: float
    detail: str


@dataclass
class StepContext:
    incident: IncidentRecord
    plan: Mapping[str, Any]
    spec: StepSpec
    ports: Ports
    store: Store
    config: Config
    metrics: Metrics
    clock: Callable[[], datetime]
    steps: Mapping[str, StepRecord]
    progress: dict[str, Any] = field(default_factory=dict)

    @property
    def step(self) -> str:
        return self.spec.name

    @property
    def node(self) -> str:
        return self.incident.node

    def result_of(self, step: str) -> Mapping[str, Any]:
        record = self.steps.get(step)
        return record.result if record is not None else {}

    def done(self, step: str) -> bool:
        record = self.steps.get(step)
        return record is not None and record.status == "ok"

    async def intend(self, **progress: Any) -> None:
        """Persist intent (or facts learned) before acting on them."""
        self.progress.update(progress)
        await self.store.step_progress(self.incident.id, self.step, progress, self.clock())

    async def note(self, kind: str, detail: str, **data: Any) -> None:
        await self.store.record(
            self.incident.id, NewEvent(kind, step=self.step, detail=detail, data=data), self.clock()
        )

    async def acted(self, action: str, detail: str, **data: Any) -> None:
        """Audit and count one change made to a far side."""
        self.metrics.actions.labels(action).inc()
        await self.note("action", detail, action=action, **data)

    async def tell(self, notice: Notice) -> str | None:
        return await self.ports.notifier.post(notice)

    def reason(self) -> str:
        """The Slurm reason pitcrew sets: ``pitcrew: <incident> <fault>``, one bounded line."""
        decisive = self.plan.get("decisive") or {}
        return pitcrew_reason(self.incident.id, decisive.get("summary") or self.incident.playbook or "fault")
