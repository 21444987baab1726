"""The engine in process: real store, real engine, simulated far sides, fake time.

What it owns: ``FakeTime`` (the engine's ``Timer`` and clock: virtual seconds that pass only
when the harness says so), ``Scripted`` (a far side that fails, or takes virtual time, on
demand) and ``EngineHarness`` (store + far sides + engine + intake + commands, with helpers
to deliver captured Alertmanager bodies and to run until something holds). With ``lease=``,
the harness stands for a store that several pitcrew processes share (``Process``, made with
``process()``): each its own store connections, fence, engine, commands and leadership over the
same file, far sides and time; only the one holding the lease acts.

How time moves: every sleeper registers a virtual deadline. The driver lets the event loop
run until the system has settled (no store write in flight, a few loop turns in which
nothing happens), then
jumps to the earliest deadline and wakes those sleepers. Nothing really waits: an hour of
virtual time costs a few milliseconds.

What it must not do: reach into the engine's internals. The simulated far side
(``tests/simulator``) is imported here and nowhere else in ``tests/engine``.
"""

from __future__ import annotations

import asyncio
import functools
import heapq
import inspect
import itertools
import json
from collections import Counter, deque
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from types import TracebackType
from typing import Any, Protocol

import pytest

from bot.config import CapacitySettings, EngineSettings, Settings, load_catalog, load_playbooks
from bot.config_sections import ResumptionSettings
from bot.domain.catalog import Catalog, Override
from bot.domain.incident import State
from bot.domain.labels import LabelRules
from bot.domain.playbooks import Playbook, PlaybookSet
from bot.domain.policy import ApprovalPolicy, BreakerPolicy, GuardPolicy, Mode, NodePolicy, Policy
from bot.engine.commands import Commands
from bot.engine.context import Ports, StepSettings
from bot.engine.deps import EngineDeps
from bot.engine.engine import Engine
from bot.engine.errors import PermanentError, Reason, TransientError
from bot.engine.intake import Intake
from bot.engine.leadership import Leadership
from bot.engine.metrics import Metrics
from bot.engine.outbox import OutboxNotifier
from bot.engine.steps import REGISTRY
from bot.runtime import slurm_names_for
from bot.store.base import Event, Fence, IncidentRecord, IngestOutcome, StepRecord, Store, StoreUnavailable
from bot.store.sqlite import SqliteStore
from tests.harness.scenarios import delivery, destructive_calls, gpu_node
from tests.simulator.cluster import DaemonSetNodeSet as DaemonSetNodeSet  # for a test's cluster=
from tests.simulator.cluster import SimulatedCluster, SimulatedNotifier
from tests.simulator.cluster import StatefulSetNodeSet as StatefulSetNodeSet
from tests.simulator.world import Journal, SimulatedWorld  # the one import of the simulator

#: Virtual time starts here (fixed, so timelines read the same in every run).
EPOCH = datetime(2025, 3, 1, 12, 0, tzinfo=UTC)
#: Loop turns without activity that count as "settled": enough for a chain of wake-ups
#: (event set → waiter done → wait returns → the flow's next store call) to show itself.
_SETTLE_TURNS = 6
#: Store calls and sleeps within one virtual instant beyond which the engine is spinning (a
#: loop that never waits), not working: the busiest instant of this suite takes under 250.
_BUSY = 2_000
#: A run that needs more virtual-time jumps than this is stuck in a loop, not waiting.
_MAX_JUMPS = 50_000


class Livelock(AssertionError):
    """The engine keeps the loop busy without ever waiting: virtual time can never move."""


class FakeTime:
    """A ``Timer`` (``bot.engine.signals``) and a clock over virtual time."""

    def __init__(self, start: datetime = EPOCH) -> None:
        self.start = start
        self._now = start
        self._sleepers: list[tuple[datetime, int, asyncio.Future[None]]] = []
        self._order = itertools.count()
        #: Work in flight outside the event loop (store writes committing in the writer thread).
        self._outside = 0
        self._back: asyncio.Event | None = None
        #: Bumped by anything that happens (a sleeper, a store call); settling watches it.
        self._activity = 0

    def begin(self) -> None:
        """Work leaves the event loop (virtual time must not move until it is back)."""
        self._outside += 1
        self._activity += 1

    def end(self) -> None:
        self._outside -= 1
        self._activity += 1
        if self._outside == 0 and self._back is not None:
            self._back.set()

    def now(self) -> datetime:
        return self._now

    @property
    def elapsed(self) -> float:
        """Virtual seconds since the start."""
        return (self._now - self.start).total_seconds()

    def _register(self, seconds: float) -> asyncio.Future[None]:
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        deadline = self._now + timedelta(seconds=seconds)
        heapq.heappush(self._sleepers, (deadline, next(self._order), future))
        self._activity += 1
        return future

    async def sleep(self, seconds: float) -> None:
        if seconds <= 0:
            await asyncio.sleep(0)
            return
        future = self._register(seconds)
        try:
            await future
        finally:
            future.cancel()  # a cancelled sleeper is skipped by the driver

    async def wait(self, event: asyncio.Event, limit: float) -> bool:
        if event.is_set():
            return True
        timer = self._register(max(limit, 0.0))
        waiter = asyncio.ensure_future(event.wait())
        racing: set[asyncio.Future[Any]] = {timer, waiter}
        try:
            await asyncio.wait(racing, return_when=asyncio.FIRST_COMPLETED)
        finally:
            timer.cancel()
            waiter.cancel()
        return event.is_set()

    async def settle(self) -> None:
        """Let the loop run until nothing is in flight and a few turns pass in which nothing happens.

        Fails when that never comes: something spins without ever waiting on time.
        """
        idle, start = 0, self._activity
        seen = start
        while idle < _SETTLE_TURNS:
            if self._outside:
                self._back = self._back or asyncio.Event()
                self._back.clear()
                await self._back.wait()  # a write is committing in the writer thread
            await asyncio.sleep(0)
            if self._activity != seen:
                idle, seen = 0, self._activity
                if seen - start > _BUSY:
                    raise Livelock(
                        f"{_BUSY} store calls and sleeps at +{self.elapsed:g}s without time moving"
                    )
            else:
                idle += 1

    async def jump(self) -> bool:
        """Settle, then move to the earliest deadline and wake its sleepers; False if nobody sleeps."""
        await self.settle()
        while self._sleepers and self._sleepers[0][2].done():
            heapq.heappop(self._sleepers)
        if not self._sleepers:
            return False
        self._now = max(self._now, self._sleepers[0][0])
        while self._sleepers and self._sleepers[0][0] <= self._now:
            _, _, future = heapq.heappop(self._sleepers)
            if not future.done():
                future.set_result(None)
        return True

    async def advance(self, seconds: float) -> None:
        """Let ``seconds`` of virtual time pass, waking every sleeper on the way."""
        until = self._now + timedelta(seconds=seconds)
        for _ in range(_MAX_JUMPS):
            await self.settle()
            live = [s for s in self._sleepers if not s[2].done()]
            if not live or min(live)[0] > until:
                break
            await self.jump()
        self._now = max(self._now, until)
        await self.settle()


#: A store write: its method and whether this call is the one after which pitcrew dies.
Write = tuple[str, Callable[[tuple[Any, ...]], bool]]


class DiesAfter:
    """The store, except that the first ``write`` matching commits and then never answers.
    ``EngineHarness(store=dies.wrap)`` puts it in front of the engine's store."""

    def __init__(self, write: Write) -> None:
        self._method, self._matches = write
        #: The write committed and pitcrew hangs after it until the test restarts it.
        self.cut = False

    def wrap(self, store: Store, time: FakeTime) -> Store:
        self._store, self._time = store, time
        return self  # a Store in all but name (its __getattr__)

    def __getattr__(self, name: str) -> Any:
        real = getattr(self._store, name)
        if name != self._method:
            return real

        async def write(*args: Any, **kwargs: Any) -> Any:
            answer = await real(*args, **kwargs)
            if not self.cut and self._matches(args):
                self.cut = True
                await self._time.sleep(10**7)  # never answers: the restart cancels it
            return answer

        return write


class InFlight:
    """The store, with its calls reported to ``FakeTime``: a write waits for the writer thread,
    and virtual time must not move while one is committing."""

    def __init__(self, store: SqliteStore, time: FakeTime) -> None:
        self._store = store
        self._time = time

    def __getattr__(self, name: str) -> Any:
        target = getattr(self._store, name)
        if not inspect.iscoroutinefunction(target):
            return target

        async def counted(*args: Any, **kwargs: Any) -> Any:
            self._time.begin()
            try:
                return await target(*args, **kwargs)
            finally:
                self._time.end()

        return counted


class Process:
    """One pitcrew process of several on the harness's store: its own store connections (the
    unfenced one for webhooks, commands and the lease; the fenced one for its engine), fence,
    engine, commands and leadership; far sides of its own that count its calls (``calls``) and
    pass them to the harness's shared ones. ``cut_off`` makes its store refuse its renewals and
    freezes the clock its fence trusts (a process whose renewals stopped reaching the store while it
    believes it still leads); ``crash`` ends it as SIGKILL would (nothing released)."""

    def __init__(self, harness: EngineHarness, name: str, sqlite: SqliteStore) -> None:
        time = harness.time
        self.name = name
        self.sqlite = sqlite
        self._frozen: float | None = None
        self.fence = Fence(name, monotonic=self._monotonic)
        self._time = time
        self.store: Store = InFlight(sqlite, time)
        self.cut = False
        self.dead = False
        self.scheduler = Scripted(harness.scheduler, time)
        self.cluster = Scripted(harness.cluster, time)
        self.metrics = Metrics()
        deps = replace(
            harness.deps,
            store=InFlight(sqlite.fenced(self.fence), time),
            ports=replace(harness.deps.ports, scheduler=self.scheduler, cluster=self.cluster),
            metrics=self.metrics,
        )
        self.engine = Engine(deps, leading=lambda: self.fence.leading)
        self.commands = Commands(
            self.engine, self.store, self.metrics, time.now, harness.policy.mode, timer=time
        )
        self.intake = Intake(
            self.store,
            harness.catalog,
            LabelRules(),
            self.metrics,
            opened=self.engine.opened,
            look_again=self.engine.look_again,
        )
        assert harness.lease is not None
        self.leadership = Leadership(
            _Lease(self),
            self.fence,
            [self.engine],
            self.metrics,
            ttl=harness.lease,
            renew_every=harness.lease / 3,
            timer=time,
            monotonic=self._monotonic,
        )

    def _monotonic(self) -> float:
        return self._time.elapsed if self._frozen is None else self._frozen

    @property
    def calls(self) -> Counter[str]:
        """Calls this process made to the far sides, by method."""
        return self.scheduler.calls + self.cluster.calls

    def cut_off(self) -> None:
        self.cut, self._frozen = True, self._time.elapsed

    async def open(self) -> None:
        await self.sqlite.open()
        await self.leadership.start()

    async def crash(self) -> None:
        """SIGKILL: its engine ends at once, and the store hears nothing more from it (no renewal,
        no release: its lease lapses after the TTL)."""
        self.dead = True
        self.fence.revoke()
        await self.engine.stop()

    async def close(self) -> None:
        try:
            await self.leadership.stop()
        finally:
            await self.sqlite.close()


class _Lease:
    """The process's store for its leadership: renewals refused while it is ``cut_off``."""

    def __init__(self, process: Process) -> None:
        self._process = process

    def __getattr__(self, name: str) -> Any:
        target = getattr(self._process.store, name)
        if name not in {"lease", "acquire_lease", "renew_lease", "release_lease"}:
            return target

        async def call(*args: Any, **kwargs: Any) -> Any:
            if self._process.dead or (self._process.cut and name == "renew_lease"):
                raise StoreUnavailable("the store does not answer this process")
            return await target(*args, **kwargs)

        return call


# ------------------------------------------------------------ misbehaving far sides
Call = Callable[[], Awaitable[Any]]


@dataclass(frozen=True)
class Fail:
    """The call raises instead of reaching the far side."""

    error: Exception

    async def __call__(self, time: FakeTime, call: Call) -> Any:
        raise self.error


@dataclass(frozen=True)
class Slow:
    """The call reaches the far side after ``seconds`` of virtual time."""

    seconds: float

    async def __call__(self, time: FakeTime, call: Call) -> Any:
        await time.sleep(self.seconds)
        return await call()


@dataclass(frozen=True)
class Unconfirmed:
    """The call reaches the far side at once, but its answer takes ``seconds`` of virtual time to
    come back: a crash meanwhile leaves the change made and pitcrew not knowing it."""

    seconds: float

    async def __call__(self, time: FakeTime, call: Call) -> Any:
        answer = await call()
        await time.sleep(self.seconds)
        return answer


@dataclass(frozen=True)
class Answer:
    """The far side's answer, changed by ``change`` (e.g. a node reported not Ready)."""

    change: Callable[[Any], Any]

    async def __call__(self, time: FakeTime, call: Call) -> Any:
        return self.change(await call())


@dataclass(frozen=True)
class Through:
    """The call goes through unchanged (a placeholder in a script)."""

    async def __call__(self, time: FakeTime, call: Call) -> Any:
        return await call()


class Effect(Protocol):
    """What a script holds: ``Fail``, ``Slow``, ``Unconfirmed``, ``Answer``, ``Through`` or a test's own."""

    async def __call__(self, time: FakeTime, call: Call) -> Any: ...


def transient(times: int, reason: Reason = Reason.UNAVAILABLE) -> list[Effect]:
    return [Fail(TransientError(f"far side unavailable ({reason})", reason=reason)) for _ in range(times)]


def permanent(reason: Reason = Reason.REFUSED) -> list[Effect]:
    return [Fail(PermanentError(f"far side refused the call ({reason})", reason=reason))]


class Scripted:
    """A port that behaves like ``inner`` except where told otherwise: each call of a scripted
    method takes the next effect of its script; once that runs out, the method's standing
    effect (``always``), if any; else the call goes through."""

    def __init__(self, inner: Any, time: FakeTime) -> None:
        self._inner = inner
        self._time = time
        self._scripts: dict[str, deque[Effect]] = {}
        self._standing: dict[str, Effect] = {}
        self.calls: Counter[str] = Counter()

    def _check(self, method: str) -> None:
        if not inspect.iscoroutinefunction(getattr(self._inner, method)):
            raise AttributeError(f"{type(self._inner).__name__}.{method} is not a port call")

    def script(self, method: str, *effects: Effect) -> None:
        self._check(method)
        self._scripts.setdefault(method, deque()).extend(effects)

    def always(self, method: str, effect: Effect | None) -> None:
        """Every later call of ``method`` takes ``effect`` (``None``: back to normal)."""
        self._check(method)
        if effect is None:
            self._standing.pop(method, None)
        else:
            self._standing[method] = effect

    def __getattr__(self, name: str) -> Any:
        target = getattr(self._inner, name)
        if not inspect.iscoroutinefunction(target):
            return target

        async def call(*args: Any, **kwargs: Any) -> Any:
            self.calls[name] += 1
            script = self._scripts.get(name)
            effect = script.popleft() if script else self._standing.get(name, Through())
            return await effect(self._time, lambda: target(*args, **kwargs))

        return call


def resolved(body: bytes, at: datetime) -> bytes:
    """The same delivery as Alertmanager sends it once its alerts stop firing (ended ``at``)."""
    data = json.loads(body)
    ends = at.isoformat(timespec="milliseconds").replace("+00:00", "Z")
    for alert in data["alerts"]:
        alert.update(status="resolved", endsAt=ends)
    data["status"] = "resolved"
    return json.dumps(data).encode()


# ------------------------------------------------------------------ the harness
@functools.cache
def _shipped_catalog() -> Catalog:
    return load_catalog()  # parsed once per test run: the YAML costs more than a whole incident


@functools.cache
def _shipped_playbooks() -> PlaybookSet:
    return load_playbooks()


DEFAULT_NODES = tuple(f"gpu-node-0{n}" for n in range(1, 7))


def fleet(
    names: tuple[str, ...] | None = None,
    *,
    extra: Mapping[str, Mapping[str, Any]] | None = None,
    jobs: tuple[Mapping[str, Any], ...] = (),
) -> dict[str, Any]:
    """An inventory: healthy nodes ``names`` (one training pod each), ``extra`` nodes as given, ``jobs``."""
    nodes: dict[str, Any] = {name: gpu_node(f"ml-train/{name}-worker") for name in names or DEFAULT_NODES}
    nodes.update({name: dict(spec) for name, spec in (extra or {}).items()})
    return {"nodes": nodes, "jobs": [dict(job) for job in jobs]}


class EngineHarness:
    """pitcrew's engine with everything it talks to, in this process and in virtual time.

    ``async with EngineHarness(tmp_path, mode="auto") as h: ...`` opens a fresh SQLite store,
    builds the far sides from ``inventory`` and starts the engine; leaving stops both.
    """

    def __init__(
        self,
        tmp_path: Path,
        *,
        mode: str = "auto",
        inventory: Mapping[str, Any] | None = None,
        playbooks: Mapping[str, Mapping[str, Any]] | None = None,
        catalog: Mapping[str, Any] | None = None,
        breaker: Mapping[str, Any] | None = None,
        node: Mapping[str, Any] | None = None,
        approvals: Mapping[str, Any] | None = None,
        engine: Mapping[str, Any] | None = None,
        lease: timedelta | None = None,
        slurm: Any = None,
        capacity: Mapping[str, Any] | None = None,
        resumption: Mapping[str, Any] | None = None,
        cluster: Callable[[SimulatedWorld], Any] | None = None,
        outbox: Sequence[str] | None = None,
        store: Callable[[Store, FakeTime], Store] | None = None,
        mapping: Mapping[str, str] | None = None,
    ) -> None:
        """``slurm``: a Scheduler to use instead of the simulated world's (a test's own far side);
        ``capacity``: the ``capacity`` settings (pools); ``resumption``: those settings (queries);
        ``cluster``: builds a Cluster to use instead of the simulated one (a test's own far side,
        given the simulated world); ``outbox``: notices go through the outbox to these
        destinations, as ``pitcrew serve`` sends them (the simulated notifier is the log behind it;
        nothing delivers the rows); ``store``: wraps the store the engine writes through, given the
        virtual time (a test's own misbehaving store); ``mapping``: the ``slurm`` keys saying how a node
        names its Slurm nodes (``node_mapping``, ``node_mapping_key``; the composition root's rule,
        ``bot.runtime.slurm_names_for``)."""
        self.time = FakeTime()
        #: The lease's TTL when processes share the store (``process``); ``None``: one engine, no lease.
        self.lease = lease
        self.processes: list[Process] = []
        self._tmp = tmp_path
        self.metrics = Metrics()
        site = Settings.model_validate(
            {"slurm": dict(mapping or {}), "integrations": {"cluster": "kubernetes"}}
        )
        self.inventory = dict(inventory) if inventory is not None else fleet()
        self.world = SimulatedWorld(Journal(None), self.inventory)
        self.scheduler = Scripted(self.world if slurm is None else slurm, self.time)
        self.cluster = Scripted((cluster or SimulatedCluster)(self.world), self.time)
        self.notifier = Scripted(SimulatedNotifier(self.world), self.time)
        self._sqlite = SqliteStore(tmp_path / "pitcrew.db", synchronous="off", clock=self.time.now)
        self.store: Store = InFlight(self._sqlite, self.time)
        engine_store = store(self.store, self.time) if store is not None else self.store
        # As in pitcrew (bot.runtime): every notice through the outbox, with no destination unless
        # the test names some; the simulated notifier sees what pitcrew logs.
        notifier = OutboxNotifier(engine_store, self.time.now, self.notifier, outbox or [])
        self.policy = Policy(
            mode=Mode(mode),
            guards=GuardPolicy(
                breaker=BreakerPolicy(**{"max_nodes": 10, "max_fraction": 1.0, **(breaker or {})}),
                node=NodePolicy(**{"cooldown": timedelta(0), **(node or {})}),
            ),
            approvals=ApprovalPolicy(**{"approvers": ("alice", "slack:U0ALICE"), **(approvals or {})}),
        )
        overrides = {name: Playbook.model_validate(spec) for name, spec in (playbooks or {}).items()}
        self.catalog = _shipped_catalog().with_overrides(
            {key: Override.model_validate(value) for key, value in (catalog or {}).items()}
        )
        settings = {
            "poll_interval": timedelta(seconds=60),
            "retry_backoff": timedelta(seconds=1),
            "retry_backoff_max": timedelta(seconds=8),
            **(engine or {}),
        }
        self.deps = EngineDeps(
            store=engine_store,
            ports=Ports(
                scheduler=self.scheduler,
                cluster=self.cluster,
                notifier=notifier,
                slurm_names=slurm_names_for(site, self.cluster),
            ),
            metrics=self.metrics,
            clock=self.time.now,
            policy=self.policy,
            playbooks=_shipped_playbooks().merged(overrides),
            settings=EngineSettings(**settings),
            steps=StepSettings(
                poll_interval=2.0,
                node_mapping=site.slurm.node_mapping,
                capacity=CapacitySettings.model_validate(capacity or {}),
                resumption=ResumptionSettings.model_validate(resumption or {}),
            ),
            registry=REGISTRY,
            timer=self.time,
        )
        self.engine = Engine(self.deps)
        self.intake = Intake(
            self.store,
            self.catalog,
            LabelRules(),
            self.metrics,
            opened=lambda: self.engine.opened(),
            look_again=lambda outcome: self.engine.look_again(outcome),
        )
        self._bodies: dict[str, list[bytes]] = {}
        self.commands = Commands(
            self.engine,
            self.store,
            self.metrics,
            self.time.now,
            self.policy.mode,
        )

    async def __aenter__(self) -> EngineHarness:
        await self._sqlite.open()
        if self.lease is None:
            await self.engine.start()
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        try:
            await self.engine.stop()
            for process in self.processes:
                await process.close()
        finally:
            await self._sqlite.close()

    async def process(self, name: str) -> Process:
        """Start another pitcrew process on this store (``lease`` must be set); it leads if it can."""
        assert self.lease is not None, "processes share a store under a lease: EngineHarness(lease=...)"
        process = Process(
            self, name, SqliteStore(self._tmp / "pitcrew.db", synchronous="off", clock=self.time.now)
        )
        self.processes.append(process)
        await process.open()
        await self.time.settle()
        return process

    async def restart(self, *, new_process: bool = False, settle: bool = True) -> None:
        """pitcrew stops (every task cancelled, as a crash would leave the store) and starts again;
        ``new_process``: as another process, whose metrics start from nothing (a restarted pod, the
        replica that takes over); ``settle``: let the engine work (and fake time pass) before
        returning, else return as soon as it has started."""
        await self.engine.stop()
        if new_process:
            self.metrics = Metrics()
            self.deps = replace(self.deps, metrics=self.metrics)
        self.engine = Engine(self.deps)
        await self.engine.start()
        if settle:
            await self.time.settle()

    # ---------------------------------------------------------------- inputs
    async def deliver(self, body: bytes) -> IngestOutcome:
        """One Alertmanager delivery, as the webhook hands it to the intake."""
        outcome = await self.intake.accept(body, self.time.now())
        for incident_id in {*outcome.opened, *outcome.attached}:
            self._bodies.setdefault(incident_id, []).append(body)
        await self.time.settle()
        return outcome

    async def alert(
        self, node: str = "gpu-node-02", fixture: str = "xid79-firing.json", *, starts: datetime | None = None
    ) -> str:
        """Deliver a captured alert for ``node``, started now (or at ``starts``); the incident it opened."""
        return await self.opens(delivery(fixture, node=node, starts=starts or self.time.now()))

    async def opens(self, body: bytes) -> str:
        """Deliver ``body``, which must open an incident; its id."""
        outcome = await self.deliver(body)
        assert outcome.opened, f"no incident opened: {outcome}"
        return outcome.opened[0]

    async def resolve(self, incident_id: str) -> IngestOutcome:
        """Alertmanager says every alert delivered for the incident has resolved."""
        bodies = self._bodies.get(incident_id, [])
        assert bodies, f"nothing was delivered for {incident_id}"
        merged = IngestOutcome()
        for body in bodies:
            outcome = await self.intake.accept(resolved(body, self.time.now()), self.time.now())
            merged.resolved += outcome.resolved
            merged.resolved_in += outcome.resolved_in
        await self.time.settle()
        return merged

    # ----------------------------------------------------------------- driving
    async def run_until(
        self,
        predicate: Callable[[], Awaitable[bool] | bool],
        max_virtual_seconds: float = 3600.0,
        *,
        about: str | None = None,
    ) -> float:
        """Drive virtual time until ``predicate`` holds; the virtual seconds it took.

        Fails with the timeline of ``about`` (or of every incident) when it never holds.
        """
        began = self.time.elapsed
        for _ in range(_MAX_JUMPS):
            await self.time.settle()
            held = predicate()
            if inspect.isawaitable(held):
                held = await held
            if held:
                return self.time.elapsed - began
            if self.time.elapsed - began > max_virtual_seconds:
                break
            if not await self.time.jump():
                break
        pytest.fail(
            f"not reached within {max_virtual_seconds:g} virtual seconds "
            f"(at +{self.time.elapsed:g}s):\n{await self.timeline(about)}"
        )

    async def until_state(self, incident_id: str, *states: str, within: float = 7200.0) -> IncidentRecord:
        async def reached() -> bool:
            found = await self.store.incident(incident_id)
            return found is not None and found.state.value in states

        await self.run_until(reached, within, about=incident_id)
        return await self.incident(incident_id)

    async def until_ended(self, incident_id: str, within: float = 7200.0) -> IncidentRecord:
        """Until the incident is terminal."""
        return await self.until_state(incident_id, *(s.value for s in State if s.terminal), within=within)

    async def until_event(self, incident_id: str, kind: str, within: float = 3600.0) -> Event:
        async def seen() -> bool:
            return bool(await self.events(incident_id, kind))

        await self.run_until(seen, within, about=incident_id)
        return (await self.events(incident_id, kind))[0]

    async def until_call(self, op: str, target: str, within: float = 3600.0) -> None:
        await self.run_until(lambda: self.calls()[(op, target)] > 0, within)

    # ----------------------------------------------------------------- reading
    async def incident(self, incident_id: str) -> IncidentRecord:
        found = await self.store.incident(incident_id)
        assert found is not None, f"no incident {incident_id}"
        return found

    async def steps(self, incident_id: str) -> dict[str, StepRecord]:
        return await self.store.steps_of(incident_id)

    async def events(self, incident_id: str, kind: str | None = None, step: str | None = None) -> list[Event]:
        found = await self.store.events_of(incident_id)
        return [e for e in found if (kind is None or e.kind == kind) and (step is None or e.step == step)]

    async def states(self, incident_id: str) -> list[str]:
        """The states the incident went through, in order."""
        return ["open"] + [e.outcome or "" for e in await self.events(incident_id, "state")]

    def records(self) -> list[dict[str, Any]]:
        """Everything that reached the far side, in order (the simulator's journal)."""
        return list(self.world.journal.records())

    def changes_for(self, incident_id: str) -> list[dict[str, Any]]:
        """Changes that reached the far side for one incident (its id in the call or the Slurm reason)."""
        return [
            r
            for r in self.records()
            if r.get("op") != "notice"
            and (
                r.get("incident_id") == incident_id or f"pitcrew: {incident_id} " in str(r.get("reason", ""))
            )
        ]

    def calls(self) -> Counter[tuple[str, str]]:
        """Calls that changed the far side, by (op, target)."""
        return destructive_calls(self.records())

    def notices(self, kind: str | None = None, incident_id: str | None = None) -> list[dict[str, Any]]:
        return [
            r
            for r in self.records()
            if r.get("op") == "notice"
            and (kind is None or r.get("kind") == kind)
            and (incident_id is None or r.get("incident_id") == incident_id)
        ]

    async def told_once(self, incident_id: str, kind: str, destination: str = "slack") -> Event:
        """The incident's one notice of ``kind``: in the timeline once, in ``destination``'s
        outbox once (that event's), logged once; its timeline event."""
        timeline = await self.timeline(incident_id)
        events = [e for e in await self.events(incident_id, "notice") if e.outcome == kind]
        assert len(events) == 1, timeline
        outbox = [i for i in await self.store.outbox_pending(destination) if i.kind == kind]
        assert [i.event_seq for i in outbox] == [events[0].seq], timeline
        assert len(self.notices(kind, incident_id)) == 1, timeline
        return events[0]

    def sample(self, name: str, **labels: str) -> float:
        value = self.metrics.registry.get_sample_value(name, labels)
        return 0.0 if value is None else value

    async def timeline(self, incident_id: str | None = None) -> str:
        ids = (
            [incident_id]
            if incident_id
            else [i.id for i in reversed(await self.store.incidents(limit=20))]  # oldest first
        )
        lines = []
        for each in ids:
            record = await self.store.incident(each)
            state = record.state.value if record else "?"
            lines.append(f"{each} [{state}] {record.outcome if record else ''}")
            for e in await self.store.events_of(each):
                offset = (e.at - self.time.start).total_seconds()
                what = " ".join(x for x in (e.step or "", e.outcome or "", e.detail) if x)
                lines.append(f"  +{offset:8.1f}s {e.kind:<18} {what}")
        lines.append(f"far side: {dict(self.calls())}")
        return "\n".join(lines)
