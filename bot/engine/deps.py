"""What the engine is built from: one ``EngineDeps``, assembled by the composition root
(``bot.runtime``) or by a test harness — the slices of configuration the engine reads,
never the whole ``Config``."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime

from bot.config import EngineSettings
from bot.domain.playbooks import PlaybookSet
from bot.domain.policy import Policy
from bot.engine.context import Ports, StepDeps, StepSettings
from bot.engine.metrics import Metrics
from bot.engine.pause import gated
from bot.engine.registry import StepRegistry
from bot.engine.signals import RealTimer, Timer
from bot.engine.steps import REGISTRY
from bot.store.base import Store
from bot.store.lease import Fence


@dataclass(frozen=True)
class EngineDeps:
    store: Store
    ports: Ports
    metrics: Metrics
    clock: Callable[[], datetime]
    policy: Policy
    playbooks: PlaybookSet
    settings: EngineSettings = field(default_factory=EngineSettings)
    steps: StepSettings = field(default_factory=StepSettings)
    registry: StepRegistry = field(default_factory=lambda: REGISTRY)
    timer: Timer = field(default_factory=RealTimer)
    capacity_lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    lent_lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    #: The lease this process leads with: asked before every far-side write (``bot.engine.pause``).
    fence: Fence | None = None

    def __post_init__(self) -> None:
        problems = self.registry.problems(self.playbooks)
        if problems:
            raise ValueError("; ".join(problems))

    def step_deps(self, *, forced: bool = False) -> StepDeps:
        """What steps and undos use: the ports with every write held while paused
        (``bot.engine.pause``); ``forced``: not held, for a rollback forced while paused. Either
        way no write goes out once this process may have lost the lease."""
        ports = gated(self.ports, self.store, self.fence, hold=not forced)
        return StepDeps(
            ports,
            self.store,
            self.steps,
            self.metrics,
            self.clock,
            self.registry,
            self.capacity_lock,
            self.lent_lock,
        )
