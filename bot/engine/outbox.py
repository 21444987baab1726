"""Notices through the durable outbox: written with their timeline event, delivered in the background.

``OutboxNotifier`` is the ``Notifier`` every step and flow talks to. ``post`` never reaches a far
side: it logs the notice (the inner notifier: the structured log, the journal), then writes one
timeline event and one outbox row per configured destination in one transaction, and returns.
Slack being down or rate limiting therefore never blocks or fails remediation.

``OutboxSender`` is the background worker that delivers the rows: per destination, oldest first,
one at a time per incident (a later notice of an incident waits for the earlier one, so a
thread reads in order). A failure of the far side defers only that incident's notices, by the
executor's backoff policy (``bot.engine.backoff``: doubling, jittered, at least the far side's
``Retry-After`` when it gave one); other incidents go on. A permanent refusal is logged, audited
in the incident's timeline and counted (under its ``Reason``), and the next notice goes on: one
unpostable message must not silence an incident. The begun delivery is marked in the store
before it starts, so after a crash the destination knows to look for what it already posted.

A step's notice (``StepContext.tell``: its step and key) is posted at most once per run of the step:
the step commits its result after the notice, so a crash in between runs it again. ``post`` looks
in the timeline first (``Store.told``) and answers with the notice already there, logging nothing;
the enqueue looks again in its own transaction (``once``), so the outbox never holds the notice
twice even if something posted it between the look and the write.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import replace
from datetime import datetime, timedelta
from typing import TypeVar

from bot import logger
from bot.engine.backoff import Backoff
from bot.engine.errors import PermanentError, Reason, TransientError
from bot.engine.metrics import Metrics
from bot.engine.ports import Destination, Notice, Notifier
from bot.engine.signals import RealTimer, Timer
from bot.engine.tasks import cancel_and_wait
from bot.store.base import NOTICE, Deposed, Json, NewEvent, OutboxItem, Store

log = logger(__name__)

T = TypeVar("T")


async def create_once(
    item: OutboxItem, find: Callable[[], Awaitable[T | None]], create: Callable[[], Awaitable[T]], what: str
) -> T:
    """The one rule for a delivery that makes something at a far side (a Slack message, a Grafana
    annotation): a redelivered item may have made it before a crash cut the answer off, so it
    first ``find``s what it made and creates only when nothing is there; a first attempt creates."""
    if item.attempts > 1:
        found = await find()
        if found is not None:
            log.info("%s already there; not creating it again", what, extra={"outbox_id": item.id})
            return found
    return await create()


class OutboxNotifier:
    """The ``Notifier`` port over the outbox: log now, deliver later, lose nothing."""

    def __init__(
        self,
        store: Store,
        clock: Callable[[], datetime],
        inner: Notifier,
        destinations: Sequence[str],
        wake: Callable[[], None] = lambda: None,
    ) -> None:
        self._store = store
        self._clock = clock
        self._inner = inner
        self.destinations = tuple(destinations)
        self._wake = wake
        #: What stands behind the port for ``bot.safety``: the inner notifier's far side.
        self.far_side = getattr(inner, "far_side", "log")

    async def post(self, notice: Notice) -> str | None:
        incident_id, step, once = notice.incident_id, notice.step, notice.key
        if step is None:
            once = None  # only a step's notice is posted once
        elif once is not None:
            posted = await self._store.told(incident_id, step, once)
            if posted is not None:
                log.info(
                    "notice already posted in this run of its step; not posting it again",
                    extra={"incident": incident_id, "step": step, "kind": notice.kind},
                )
                return f"notice-{posted}"
        await self._inner.post(notice)
        event = NewEvent(
            NOTICE,
            step=notice.step,
            detail=notice.title,
            outcome=notice.kind,
            data={"severity": notice.severity, "destinations": list(self.destinations)},
        )
        payload: dict[str, Json] = {**notice.record(), "node": notice.node}  # ``Notice.from_record``'s
        seq = await self._store.enqueue(
            incident_id, event, notice.kind, payload, self.destinations, self._clock(), once=once
        )
        if self.destinations:
            self._wake()
        return f"notice-{seq}"


class OutboxSender:
    """Delivers the outbox to its destinations until stopped (``start``/``stop`` for ``cleanup_ctx``)."""

    def __init__(
        self,
        store: Store,
        destinations: Sequence[Destination],
        metrics: Metrics,
        clock: Callable[[], datetime],
        *,
        timer: Timer | None = None,
        backoff: Backoff | None = None,
        idle: float = 5.0,
        system: str | None = None,
    ) -> None:
        self._store = store
        #: The ``system`` label its far side's errors are counted under
        #: (``pitcrew_integration_errors_total``); ``None``: not counted there.
        self._system = system
        self._destinations = tuple(destinations)
        self._metrics = metrics
        self._clock = clock
        self._timer = timer or RealTimer()
        self._backoff = backoff or Backoff()
        self._idle = idle
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        #: Failures in a row per item: the backoff grows with them (attempts also count crashes).
        self._failures: dict[int, int] = {}

    def wake(self) -> None:
        self._wake.set()

    async def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="pitcrew-outbox")

    async def stop(self) -> None:
        await cancel_and_wait(self._task)
        self._task = None
        self._forget()

    def _forget(self) -> None:
        """``pitcrew_outbox_pending`` is the leader's last look: a sender that stops (or whose
        process no longer leads) shows none beside the new leader's, or ``PitcrewNoticesStuck``
        (the max over replicas) fired on its stale count once the new one had delivered it all."""
        for destination in self._destinations:
            self._metrics.outbox_pending.labels(destination.name).set(0)

    async def _run(self) -> None:
        while True:
            self._wake.clear()
            delay = self._idle
            for destination in self._destinations:
                try:
                    delay = min(delay, await self.drain(destination))
                except asyncio.CancelledError:
                    raise
                except Deposed:  # another process leads: it delivers from now on
                    log.warning("outbox sender stops: this process no longer leads")
                    self._forget()
                    return
                except Exception:  # the sender must outlive a bad round; the rows stay pending
                    log.exception("outbox round failed", extra={"destination": destination.name})
                    delay = min(delay, self._backoff.initial)
            delay = max(delay, 0.0)
            if delay > 0:
                await self._timer.wait(self._wake, delay)

    async def drain(self, destination: Destination) -> float:
        """Deliver what is due now; seconds until the next deferred item is due (or the idle beat)."""
        items = await self._store.outbox_pending(destination.name, limit=500)
        self._metrics.outbox_pending.labels(destination.name).set(len(items))
        blocked: set[str] = set()
        next_due = self._idle
        delivered = 0
        last = {item.incident_id or "": item.id for item in items}  # each incident's newest pending item
        for item in items:
            key = item.incident_id or ""
            if key in blocked:
                continue
            now = self._clock()
            if item.not_before is not None and item.not_before > now:
                blocked.add(key)
                next_due = min(next_due, (item.not_before - now).total_seconds())
                continue
            if await self._deliver(destination, item, more=last[key] != item.id):
                delivered += 1
            else:
                blocked.add(key)
                next_due = min(next_due, self._backoff.initial)
        # A full page delivered: more may be waiting behind it, look again at once.
        return 0.0 if delivered and len(items) == 500 else next_due

    async def _deliver(self, destination: Destination, item: OutboxItem, *, more: bool) -> bool:
        await self._store.outbox_attempt(item.id, self._clock())
        fresh = replace(item, attempts=item.attempts + 1)
        try:
            ref = await destination.deliver(fresh, more=more)
        except TransientError as exc:
            self._count(exc.reason)
            failures = self._failures.get(item.id, 0) + 1
            self._failures[item.id] = failures
            wait = self._backoff.delay(failures, exc.retry_after)
            await self._store.outbox_defer(item.id, self._clock() + timedelta(seconds=wait), str(exc))
            self._metrics.notices.labels(destination.name, "retried").inc()
            log.warning(
                "notice not delivered yet; will retry",
                extra={"destination": destination.name, "incident": item.incident_id, "retry_in": wait},
            )
            return False
        except PermanentError as exc:
            self._count(exc.reason)
            self._failures.pop(item.id, None)
            await self._store.outbox_delivered(item.id, None, self._clock())
            await self._store.record(
                item.incident_id,
                NewEvent("notice_failed", outcome=item.kind, detail=f"{destination.name}: {exc}"),
                self._clock(),
            )
            self._metrics.notices.labels(destination.name, "failed").inc()
            log.error(
                "notice refused by its destination",
                extra={"destination": destination.name, "incident": item.incident_id, "reason": exc.reason},
            )
            return True
        self._failures.pop(item.id, None)
        await self._store.outbox_delivered(item.id, ref, self._clock())
        self._metrics.notices.labels(destination.name, "delivered").inc()
        return True

    def _count(self, reason: Reason) -> None:
        if self._system is not None:
            self._metrics.integration_error(self._system, reason)
