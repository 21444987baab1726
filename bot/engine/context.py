"""What a step sees while it runs, and what it may answer.

A step is a reconcile function (as in kopf): it reads the far side, acts only if the far
side is not yet as wanted, verifies, and answers ``Done`` or ``Wait`` ("not yet, ask me
again in a while"). Its progress is one frozen record of the step's own result type; it
saves the record with ``ctx.save`` *before* any destructive call, so a step resumed after a
crash knows what it may already have done. Steps read each other's results through
``ctx.result(SomeResult)``, typed, never by string keys.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import TYPE_CHECKING, Generic, Literal, TypeVar

from bot.config import CapacitySettings, GoodputSettings, ResumptionSettings
from bot.domain.nodemap import MappingMode
from bot.domain.ownership import slurm_reason
from bot.domain.planner import Plan
from bot.domain.playbooks import StepSpec
from bot.domain.policy import LemonPolicy
from bot.engine.metrics import Metrics
from bot.engine.ports import Cluster, MetricsQuery, Notice, Notifier, Scheduler
from bot.store import codec
from bot.store.base import ACTION, IncidentRecord, Json, NewEvent, StepRecord, Store

if TYPE_CHECKING:
    from bot.engine.registry import StepRegistry

SlurmNames = Callable[[str], Awaitable[Sequence[str]]]


async def identity_names(node: str) -> Sequence[str]:
    return (node,)


@dataclass
class Ports:
    """The far sides, injected by the composition root. ``cluster`` is ``None`` on Slurm-only sites."""

    scheduler: Scheduler
    cluster: Cluster | None
    notifier: Notifier
    query: MetricsQuery | None = None
    slurm_names: SlurmNames = identity_names


@dataclass(frozen=True, slots=True)
class StepSettings:
    """The slice of the configuration steps read."""

    poll_interval: float = 2.0
    resumption: ResumptionSettings = field(default_factory=ResumptionSettings)
    #: ``slurm.node_mapping``: Slinky's (``slinky``), and whether a replacement's Slurm nodes are
    #: read from it (``read_from_node``).
    node_mapping: MappingMode = "identity"
    goodput: GoodputSettings = field(default_factory=GoodputSettings)
    capacity: CapacitySettings = field(default_factory=CapacitySettings)
    lemon: LemonPolicy = field(default_factory=LemonPolicy)

    @property
    def slinky(self) -> bool:
        """Slinky's slurm-operator runs slurmd (``slurm.node_mapping: slinky``)."""
        return self.node_mapping == "slinky"


@dataclass(frozen=True, slots=True)
class StepResult:
    """Base of every step's result record (a frozen dataclass with defaults: progress and outcome)."""


R = TypeVar("R", bound=StepResult)
S = TypeVar("S", bound=StepResult)


@dataclass(frozen=True, slots=True)
class Done(Generic[R]):
    result: R
    detail: str = ""


@dataclass(frozen=True, slots=True)
class Wait:
    """Not finished: run the step again after ``delay`` seconds (until the step deadline)."""

    delay: float
    detail: str


@dataclass(frozen=True)
class StepDeps:
    """Everything a step may use besides its incident: ports, store, settings, metrics, clock."""

    ports: Ports
    store: Store
    settings: StepSettings
    metrics: Metrics
    clock: Callable[[], datetime]
    registry: StepRegistry
    #: Held from a capacity choice until its intent is stored: two incidents never take one node.
    capacity_lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    #: Held while the lent gauge is read from the store and set (``capacity.show_lent``).
    lent_lock: asyncio.Lock = field(default_factory=asyncio.Lock)


class Results:
    """The results the steps of one incident stored, as one read of them found them: what reads
    several (``close``'s summary) sees one moment, and reads the store once."""

    def __init__(self, registry: StepRegistry, records: Mapping[str, StepRecord]) -> None:
        self._registry = registry
        self.records = records

    def of(self, kind: type[S]) -> S | None:
        """The result of the step whose record type is ``kind``; ``None`` if none, or superseded."""
        record = self.records.get(self._registry.step_of(kind))
        if record is None or record.status == "superseded":
            return None
        return codec.decode_record(kind, record.result)


class Facts:
    """Typed reads of the results other steps stored for one incident."""

    def __init__(self, deps: StepDeps, incident_id: str) -> None:
        self._deps = deps
        self._incident_id = incident_id

    async def results(self) -> Results:
        """Every step's stored result, in one read (fresh from the store)."""
        return Results(self._deps.registry, await self._deps.store.steps_of(self._incident_id))

    async def result(self, kind: type[S]) -> S | None:
        """The stored result of the step whose record type is ``kind`` (fresh from the store)."""
        return (await self.results()).of(kind)


@dataclass
class StepContext(Generic[R]):
    incident: IncidentRecord
    plan: Plan
    spec: StepSpec
    deps: StepDeps
    progress: R

    @property
    def step(self) -> str:
        return self.spec.step

    @property
    def node(self) -> str:
        return self.incident.node

    @property
    def rung(self) -> str:
        """The rung of the repair ladder this run of the step is in: the incident's playbook. A
        climb runs a step again in the next rung; what the far side keeps of a run (a Job) is told
        apart by it (``Cluster.reboot``)."""
        return self.incident.playbook or ""

    @property
    def ports(self) -> Ports:
        return self.deps.ports

    @property
    def settings(self) -> StepSettings:
        return self.deps.settings

    @property
    def poll(self) -> float:
        return self.deps.settings.poll_interval

    def clock(self) -> datetime:
        return self.deps.clock()

    async def result(self, kind: type[S]) -> S | None:
        return await Facts(self.deps, self.incident.id).result(kind)

    async def results(self) -> Results:
        return await Facts(self.deps, self.incident.id).results()

    async def save(self, progress: R) -> None:
        """Persist progress (intent, or facts learned) before acting on it."""
        self.progress = progress
        await self.deps.store.step_progress(
            self.incident.id, self.step, codec.encode_record(progress), self.deps.clock()
        )

    async def note(self, kind: str, detail: str, **data: Json) -> None:
        await self.deps.store.record(
            self.incident.id, NewEvent(kind, step=self.step, detail=detail, data=data), self.deps.clock()
        )

    async def acted(self, action: str, detail: str, **data: Json) -> None:
        """Audit and count one change made to a far side."""
        self.deps.metrics.actions.labels(action).inc()
        await self.note(ACTION, detail, action=action, **data)

    async def tell(self, notice: Notice, *, key: str) -> str | None:
        """Tell humans, at most once per ``key`` in this run of the step: a step run again after a
        crash or a retry, telling with the same key, gets the reference of the notice posted then
        and posts nothing (``bot.engine.outbox``). ``key`` names what the notice is about, the same
        on every run until the step is superseded, and another for each notice the step means to
        post: the same kind and title said again for another reason needs another key."""
        return await self.deps.ports.notifier.post(replace(notice, step=self.step, key=key))

    def reason(self) -> str:
        """The Slurm reason pitcrew sets for this incident (``bot.domain.ownership``)."""
        return slurm_reason(self.incident.id, self.plan.summary)


@dataclass(frozen=True, slots=True)
class Kept:
    """An undo that leaves pitcrew's change standing for now, and says why in ``line`` (a job
    runs on the node a take lent it): the step keeps its status, the rollback's record names it
    (``RollbackRecord.kept``), and a rollback asked again of the rolled-back incident tries it
    again. Any other answer of an undo is final: the change was reversed, or there is nothing
    of pitcrew's left to reverse (someone else's, gone, irreversible)."""

    line: str


@dataclass(frozen=True)
class UndoContext:
    """What an undo sees: the incident, the far sides, and who asked."""

    incident: IncidentRecord
    deps: StepDeps
    actor: str

    @property
    def node(self) -> str:
        return self.incident.node

    def count(self, action: Literal["uncordon", "slurm_resume", "cancel_replacement"]) -> None:
        self.deps.metrics.actions.labels(action).inc()
