"""The durable step executor: one step of one incident, within its budget.

Before a step runs, its start is written to the store; after, its outcome, result and
duration. Transient failures are retried with the one backoff policy (``bot.engine.backoff``:
doubling, jittered, the far side's ``retry_after`` honoured) through tenacity, inside the step's
attempt budget — once, here, since the client libraries already retry their own HTTP. ``Wait``
answers are polled until the step's deadline. A step that runs out of budget, or fails
permanently, escalates: the incident goes to humans, never silently.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Final, Literal, TypeVar

from tenacity import AsyncRetrying, RetryCallState, retry_if_exception_type, stop_after_attempt

from bot import logger
from bot.domain.durations import format_duration
from bot.domain.planner import Plan
from bot.domain.playbooks import Budget
from bot.engine.backoff import Backoff
from bot.engine.context import Done, StepContext, StepDeps, StepResult, Wait
from bot.engine.deps import EngineDeps
from bot.engine.errors import PermanentError, Reason, TransientError
from bot.engine.locks import IncidentLocks
from bot.engine.pause import Held
from bot.engine.registry import Handler, StepDef, Track
from bot.engine.tasks import cancel_and_wait
from bot.store import codec
from bot.store.base import (
    Deposed,
    IncidentRecord,
    JsonObject,
    NewEvent,
    SkippedStep,
    StepRecord,
    StoreUnavailable,
)

log = logger(__name__)
R = TypeVar("R", bound=StepResult)
T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class StepOutcome:
    """``ok`` (advance, also for a step skipped or already done), ``failed`` (escalated) or
    ``held`` (paused before its next change; run it again after resume)."""

    status: Literal["ok", "failed", "held"]
    detail: str = ""
    #: The node track's cursor was moved past the step with its end (``Executor.run``'s ``then``).
    advanced: bool = False


#: A step whose next change was held by a pause (``bot.engine.pause``): it runs again after resume.
HELD: Final = "held"
#: The event of a resumed step given its one last chance past its deadline (``Executor._last_chance``).
RESUMED_LATE: Final = "step_resumed_late"


class StepFailed(Exception):
    def __init__(self, detail: str, reason: str) -> None:
        super().__init__(detail)
        self.reason = reason


def _same_run(run: object, started_at: datetime) -> bool:
    """Whether ``run`` (an event's, written by ``codec.ts``) names the run of a step that started
    at ``started_at``: the same instant, whatever offset either was written with."""
    if not isinstance(run, str):
        return False
    try:
        return codec.dt(run) == started_at
    except ValueError:
        return False


class Executor:
    def __init__(self, deps: EngineDeps, slots: asyncio.Semaphore, locks: IncidentLocks) -> None:
        self._deps = deps
        self._locks = locks
        self._store = deps.store
        self._metrics = deps.metrics
        self._clock = deps.clock
        self._slots = slots

    @property
    def step_deps(self) -> StepDeps:
        # Built per use: the gated view (``bot.engine.pause``) of whatever the ports are now.
        return self._deps.step_deps()

    async def run(
        self,
        incident: IncidentRecord,
        step: str,
        records: Mapping[str, StepRecord] | None = None,
        *,
        then: int | None = None,
    ) -> StepOutcome:
        """Run ``step`` of ``incident``. ``records``: its steps as the caller read them since the
        step's own record last changed (only the step's track writes it), else read here;
        ``then``: the node track's cursor after the step, moved in the write that ends it ``ok``
        or ``skipped`` (``StepOutcome.advanced``), where the flow's own write came after it."""
        definition: StepDef[StepResult] = self._deps.registry[step]
        if records is None:
            records = await self._store.steps_of(incident.id)
        return await self._run(incident, definition, records, then)

    async def _run(
        self,
        incident: IncidentRecord,
        definition: StepDef[R],
        records: Mapping[str, StepRecord],
        then: int | None,
    ) -> StepOutcome:
        step = definition.name
        plan = incident.plan
        assert plan is not None, "a step runs only for a planned incident"
        record = records.get(step)
        if record is not None and record.status == "superseded":
            record = None  # a new plan runs this step afresh
        if record is not None and record.status in {"ok", "skipped"}:
            # Ended, and the cursor not moved with it: a job step the track runs again, or an end
            # an earlier release wrote before its own write of the cursor.
            return StepOutcome("ok", "already done")
        if record is not None and record.status == "failed":
            # Resumed between its end and what follows a failure (a climb, or the escalation and
            # the close): it failed, and runs no more — a far side that refused is not asked again.
            return StepOutcome("failed", await self.failure(incident.id, step))
        skip = self.skipped(plan, definition)
        if skip is not None:
            return await self._skip(incident.id, step, *skip, then)

        spec = self._deps.playbooks.get(incident.playbook or "ignore").spec(step)
        budget = spec.budget(definition)
        progress = (
            codec.decode_record(definition.result, record.result)
            if record is not None
            else definition.result()
        )
        ctx = StepContext(incident=incident, plan=plan, spec=spec, deps=self.step_deps, progress=progress)
        resumed = record is not None and record.started_at is not None and record.status != HELD
        started_at = (
            record.started_at if resumed and record is not None and record.started_at else self._clock()
        )
        deadline = started_at + budget.timeout
        used = record.attempts if record is not None else 0
        began = time.monotonic()
        try:
            if resumed and deadline <= self._clock():
                await self._last_chance(ctx, budget, started_at)
            # Resumed: its first call may take the step's whole timeout, however little of the
            # deadline is left (none: its last chance), so a restart never cuts that call short.
            at_least = budget.timeout.total_seconds() if resumed else 0.0
            done = await self._until_done(ctx, definition, deadline, used, budget.attempts, at_least)
        except Held as held:
            # Not a failure: the step waits for resume with its progress, and a fresh deadline then.
            await self._store.step_finished(
                incident.id,
                step,
                HELD,
                self._clock(),
                result=codec.encode_record(ctx.progress),
                event=NewEvent("held", step=step, detail=str(held)),
            )
            return StepOutcome(HELD, str(held))
        except StepFailed as failure:
            result = codec.encode_record(ctx.progress)
            return await self._finished(incident.id, step, "failed", result, str(failure), began, None)
        return await self._finished(
            incident.id, step, "ok", codec.encode_record(done.result), done.detail, began, then
        )

    async def failure(self, incident_id: str, step: str) -> str:
        """Why a step failed, as its last ``step_finished`` event says."""
        ends = [
            e
            for e in await self._store.events_of(incident_id)
            if e.kind == "step_finished" and e.step == step
        ]
        return ends[-1].detail if ends and ends[-1].outcome == "failed" else f"{step} failed"

    def skipped(self, plan: Plan, definition: StepDef[Any]) -> tuple[JsonObject, str] | None:
        """Whether the step is skipped under ``plan`` without being run, with its result and why:
        observe mode runs only the steps made for it; a step that needs the cluster is not
        applicable without one. ``None``: it runs."""
        if plan.mode.value == "observe" and not definition.in_observe:
            would = definition.would.format(action=plan.slurm_action.upper())
            return {"would": would}, f"observe mode: would {would}"
        if definition.needs_cluster and self._deps.ports.cluster is None:
            why = "no Kubernetes cluster (integrations.cluster: none)"
            return {"not_applicable": why}, f"not applicable: {why}"
        return None

    async def skip_ahead(
        self, incident: IncidentRecord, records: Mapping[str, StepRecord], *, jobs: bool
    ) -> bool:
        """Observe mode: the node track's next steps that are skipped (``skipped``) and not begun,
        recorded at once with its cursor past them, in one write; whether there were any. The
        node track passes the job track's steps among them; ``jobs``: it records those as skipped
        too, if they are (no job track runs them: none has started, or it has ended).

        Each skipped step was a move of its own: the incident and its steps read, the steps read
        again, the skip written, then the cursor: five round trips a step, eight steps of a
        playbook, for nothing but records; and then the job track's, a read and a write each
        (``records``: as the flow read them at the top of this move)."""
        plan = incident.plan
        if plan is None or plan.mode.value != "observe" or incident.mode != plan.mode.value:
            return False
        skips: dict[str, tuple[JsonObject, str]] = {}
        index = incident.step_index
        for step in plan.steps[index:]:
            definition = self._deps.registry.get(step)
            if definition is None:
                break  # approve: the flow's own
            record = records.get(step)
            fresh = record is None or record.status == "superseded"
            skip = self.skipped(plan, definition) if fresh else None
            if definition.track is Track.NODE:
                if skip is None:
                    break  # it runs, or it began or ended and was not gone past (a restart): its own move
                skips[step] = skip
            elif jobs and skip is not None:
                skips[step] = skip  # passed, and no job track will find it to run
            index += 1
        if not skips:
            return False
        await self._store.steps_skipped(
            incident.id,
            [
                SkippedStep(step, result, NewEvent("step_skipped", step=step, outcome="skipped", detail=why))
                for step, (result, why) in skips.items()
            ],
            index,
            self._clock(),
        )
        for step in skips:
            self._metrics.steps.labels(step, "skipped").inc()
        return True

    async def _skip(
        self, incident_id: str, step: str, result: JsonObject, detail: str, then: int | None
    ) -> StepOutcome:
        await self._store.step_finished(
            incident_id,
            step,
            "skipped",
            self._clock(),
            result=result,
            event=NewEvent("step_skipped", step=step, outcome="skipped", detail=detail),
            step_index=then,
        )
        self._metrics.steps.labels(step, "skipped").inc()
        return StepOutcome("ok", detail, advanced=then is not None)

    async def _finished(
        self,
        incident_id: str,
        step: str,
        status: Literal["ok", "failed"],
        result: JsonObject,
        detail: str,
        began: float,
        then: int | None,
    ) -> StepOutcome:
        """Record the step's end (outcome, result, duration) in the store and the metrics; ``then``:
        the node track's cursor, moved in the same write."""
        await self._store.step_finished(
            incident_id,
            step,
            status,
            self._clock(),
            result=result,
            event=NewEvent("step_finished", step=step, outcome=status, detail=detail),
            step_index=then,
        )
        self._metrics.steps.labels(step, status).inc()
        self._metrics.step_duration.labels(step).observe(time.monotonic() - began)
        return StepOutcome(status, detail, advanced=then is not None)

    async def _within(self, call: Awaitable[T], seconds: float) -> T:
        """The call's answer, or ``TimeoutError`` once ``seconds`` pass on the engine's timer
        (the step's deadline binds a slow far side too; a fake timer in tests sees it)."""
        task = asyncio.ensure_future(call)
        finished = asyncio.Event()
        task.add_done_callback(lambda _: finished.set())
        try:
            if not await self._deps.timer.wait(finished, seconds):
                raise TimeoutError
        finally:
            if not task.done():
                await cancel_and_wait(task)
        return task.result()

    async def _until_done(
        self,
        ctx: StepContext[R],
        definition: StepDef[R],
        deadline: datetime,
        used: int,
        attempts: int,
        at_least: float = 0.0,
    ) -> Done[R]:
        """Invocations (``_attempts``) and polls until the step is done or its deadline passes; the
        first call is made and may run for ``at_least`` seconds whatever is left of the deadline."""
        last_wait = ""
        fresh = True  # polls after a Wait continue the same attempt; a restart starts a new one
        while True:
            remaining = (deadline - self._clock()).total_seconds()
            if remaining <= 0 and not (fresh and at_least > 0):
                raise StepFailed(
                    f"{ctx.step} did not finish within its budget: {last_wait or 'timed out'}", "timeout"
                )
            answer, used = await self._attempts(
                ctx, definition, used, attempts, deadline, fresh, at_least if fresh else 0.0
            )
            fresh = False
            if isinstance(answer, Done):
                return answer
            if answer.detail != last_wait:
                await ctx.note("step_waiting", answer.detail)
                last_wait = answer.detail
            await self._deps.timer.sleep(min(answer.delay, max(remaining, 0.01)))

    async def _last_chance(self, ctx: StepContext[R], budget: Budget, started_at: datetime) -> None:
        """A resumed step whose deadline passed while no pitcrew ran it: pitcrew was down, or the
        replica running it died and another took the lease late. Its first call after the restart,
        which any resumed step's may take the step's whole timeout, is made all the same, and
        decides, as no retry or poll begins past the deadline: a step is not failed without being
        asked once more (a notice not yet posted, a node Ready by now). Once per run of the step
        (its ``step_resumed_late`` event, written here first, says it was given), so a crash loop
        still ends: given already, the step fails here. The event names the run by its start
        (``run``: the step's ``started_at``, which every replica reads from the store), not by when
        it was written: matched by time, a chance given to an earlier run of the step counted as
        this run's whenever it was written later than this run's start as read by the clock that
        started it (a run after a pause, started by a replica whose clock runs behind), and the
        step failed untried.
        """
        given = any(
            e.kind == RESUMED_LATE and e.step == ctx.step and _same_run(e.data.get("run"), started_at)
            for e in await self._store.events_of(ctx.incident.id)
        )
        if given:
            raise StepFailed(
                f"{ctx.step} did not finish within its budget: timed out, its last chance after a "
                "restart taken already",
                "timeout",
            )
        await ctx.note(
            RESUMED_LATE,
            f"its budget ({format_duration(budget.timeout)}) ran out while no pitcrew ran it: one last try",
            run=codec.ts(started_at),
        )

    async def _attempts(
        self,
        ctx: StepContext[R],
        definition: StepDef[R],
        current: int,
        attempts: int,
        deadline: datetime,
        fresh: bool,
        at_least: float = 0.0,
    ) -> tuple[Done[R] | Wait, int]:
        """One invocation of the step, retried on transient errors within the attempt budget, each
        call bounded by the deadline (the first by ``at_least`` seconds if that is longer).

        ``current`` is the attempt in progress (0: never started). A restart of pitcrew resumes
        the same attempt: only a failure of the far side uses up the budget, never a crash of
        pitcrew itself (the step's deadline, then its one last chance, bound a crash loop).
        """
        settings = self._deps.settings
        handler: Handler[R] = definition.handler
        counter = {"n": max(current, 1)}
        if counter["n"] > attempts:
            raise StepFailed(f"{ctx.step} used all {attempts} attempts", "attempts")

        system = definition.port or "other"

        async def before_sleep(state: RetryCallState) -> None:
            error = state.outcome.exception() if state.outcome else None
            self._metrics.steps.labels(ctx.step, "retried").inc()
            assert isinstance(error, TransientError), "tenacity retries only a TransientError"
            self._metrics.integration_error(system, error.reason)
            await ctx.note("step_retry", f"attempt {counter['n']} failed: {error}", reason=error.reason.value)

        exhausted = stop_after_attempt(attempts - counter["n"] + 1)

        def stop(state: RetryCallState) -> bool:
            """No attempt left, or the next would begin past the deadline (the backoff, or the far
            side's ``retry_after``, ends after it): escalate now, saying what failed, rather than
            sleep past the deadline for a call cut off at once."""
            late = self._clock() + timedelta(seconds=state.upcoming_sleep) >= deadline
            return exhausted(state) or late

        retrying = AsyncRetrying(
            stop=stop,
            wait=Backoff(
                settings.retry_backoff.total_seconds(), settings.retry_backoff_max.total_seconds()
            ).tenacity_wait(),
            retry=retry_if_exception_type(TransientError),
            before_sleep=before_sleep,
            sleep=self._deps.timer.sleep,
            reraise=True,
        )
        try:
            async for attempt in retrying:
                with attempt:
                    if attempt.retry_state.attempt_number > 1:
                        counter["n"] += 1
                    if fresh or attempt.retry_state.attempt_number > 1:
                        await self._store.step_started(
                            ctx.incident.id, ctx.step, counter["n"], self._clock(), acted=definition.mutating
                        )
                    remaining = max((deadline - self._clock()).total_seconds(), 0.001)
                    if attempt.retry_state.attempt_number == 1:
                        remaining = max(remaining, at_least)
                    async with self._locks.work(ctx.incident.id), self._slots:
                        answer = await self._within(handler(ctx), remaining)
                    return answer, counter["n"]
        except Held:
            raise
        except TransientError as exc:
            self._metrics.integration_error(system, exc.reason)
            failed = f"failed {counter['n']} times, last: {exc}"
            if counter["n"] < attempts:  # attempts were left: the deadline stopped the retries
                raise StepFailed(f"{ctx.step} did not finish within its budget: {failed}", "timeout") from exc
            raise StepFailed(f"{ctx.step} {failed}", exc.reason) from exc
        except TimeoutError as exc:  # the step's deadline passed during a call to the far side
            self._metrics.integration_error(system, Reason.TIMEOUT)
            raise StepFailed(
                f"{ctx.step} did not finish within its budget: a call to the far side was still running",
                "timeout",
            ) from exc
        except PermanentError as exc:
            self._metrics.integration_error(system, exc.reason)
            raise StepFailed(f"{ctx.step} cannot succeed: {exc}", exc.reason) from exc
        except Deposed:
            raise  # another process leads now: stop here, record nothing, call nothing
        except StoreUnavailable:
            raise  # not the step's failure: the worker ends, and resumes the step once the store answers
        except Exception as exc:  # a defect must escalate to humans, not kill the incident's worker
            log.exception("step crashed", extra={"incident": ctx.incident.id, "step": ctx.step})
            raise StepFailed(f"{ctx.step} hit an internal error: {exc!r}", "internal") from exc
        raise AssertionError("unreachable")  # pragma: no cover
