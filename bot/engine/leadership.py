"""Leader or standby: only the process holding the store's lease runs playbooks and delivers notices.

Every pitcrew process takes webhooks and commands and writes them to the store; only one of
them acts on them. ``Leadership`` is the background worker that decides which: it tries to
acquire the store's lease (``bot.store.lease``); while it holds it, it runs the leader-only
workers (the engine, the outbox senders) and renews the lease every ``renew_every``; when the
lease is lost — a renewal refused, renewals failing for longer than it may lead on, or a fenced
write refused (``Deposed``) — it stops them at once (every task cancelled) and stands by again.
A standby says who leads and since when, looks again every ``renew_every`` (a cheap read), and
takes the lease as soon as it is free: at once after the leader's graceful shutdown released it,
within the TTL after a leader died.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Sequence
from datetime import timedelta
from typing import Any, Protocol

from bot import logger
from bot.engine.metrics import Metrics
from bot.engine.signals import RealTimer, Timer
from bot.engine.tasks import await_chain, cancel_and_wait
from bot.store.base import Lease, Store
from bot.store.lease import Fence

log = logger(__name__)


#: Seconds a leader-only worker may take to stop before the log says where it is stuck.
STOP_NOTICED = 5.0


def _where_tasks_stand() -> dict[str, str]:
    """Each of pitcrew's named tasks and where it stands: its await chain, outermost first (for a
    stop that does not end)."""
    return {
        task.get_name(): " -> ".join(
            f"{frame.f_code.co_filename.rsplit('/', 2)[-1]}:{frame.f_lineno} {frame.f_code.co_name}"
            for frame in await_chain(task.get_coro())
        )
        for task in asyncio.all_tasks()
        if task.get_name().startswith(("pitcrew-", "pc-"))
    }


class Worker(Protocol):
    async def start(self) -> None: ...
    async def stop(self) -> None: ...


class Leadership:
    """Runs ``workers`` while this process leads the store; ``start``/``stop`` for ``cleanup_ctx``."""

    def __init__(
        self,
        store: Store,
        fence: Fence,
        workers: Sequence[Worker],
        metrics: Metrics,
        *,
        ttl: timedelta,
        renew_every: timedelta,
        timer: Timer | None = None,
        monotonic: Callable[[], float] = time.monotonic,
        stop_noticed: float = STOP_NOTICED,
    ) -> None:
        if renew_every * 2 > ttl:
            raise ValueError(f"renew_every ({renew_every}) must be at most half the ttl ({ttl})")
        self._store = store
        self.fence = fence
        self._workers = tuple(workers)
        self._metrics = metrics
        self._ttl = ttl
        self._renew = renew_every.total_seconds()
        #: How long after a renewal began this process may act without another one.
        self._valid_for = (ttl - renew_every).total_seconds()
        self._timer = timer or RealTimer()
        self._monotonic = monotonic
        self._stop_noticed = stop_noticed
        self._task: asyncio.Task[None] | None = None
        self._lost = asyncio.Event()
        self._running: list[Worker] = []
        #: The row as last seen (for /readyz and the standby's log line).
        self.last: Lease | None = None
        self._told: tuple[str, int] | None = None  # the holder the standby last logged
        self._why = ""  # why the term ended, as the fence was told
        #: The epoch this process last led with: released at shutdown even if the loop, cancelled
        #: first (``asyncio.run`` cancels every task at SIGTERM), has already revoked the fence.
        self._term: int | None = None
        fence.on_deposed(self._deposed)
        metrics.leader.set(0)

    @property
    def holder(self) -> str:
        return self.fence.holder

    @property
    def leading(self) -> bool:
        return self.fence.leading

    @property
    def running(self) -> bool:
        return self._task is not None and not self._task.done()

    def describe(self) -> dict[str, Any]:
        """Role and lease, for ``/readyz`` and ``/api/v1/status``."""
        last = self.last
        role = "leader" if self.leading else "standby"
        found: dict[str, Any] = {"role": role, "holder_id": self.holder}
        if last is not None:
            found.update(
                leader=last.holder if not last.expired or last.holder == self.holder else None,
                epoch=last.epoch,
                since=last.acquired_at.isoformat(timespec="seconds"),
                expires_at=last.expires_at.isoformat(timespec="seconds"),
            )
        return found

    @property
    def workers(self) -> tuple[Worker, ...]:
        """What runs only while this process leads (the engine, the outbox senders)."""
        return self._workers

    async def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="pitcrew-leadership")

    async def stop(self) -> None:
        """Stop acting and release the lease, so a standby takes over at once (SIGTERM)."""
        epoch, self._term = self._term, None
        await cancel_and_wait(self._task)
        self._task = None
        await self._step_down()
        if epoch is not None:
            try:
                await self._store.release_lease(self.holder, epoch)
            except Exception:  # shutting down: the lease then lapses after its TTL instead
                log.warning("could not release the lease; a standby takes over when it lapses", exc_info=True)
            else:
                log.info("lease released", extra={"holder": self.holder, "epoch": epoch})

    # ------------------------------------------------------------------ the loop
    async def _run(self) -> None:
        while True:
            try:
                lease = await self._look()
            except asyncio.CancelledError:
                raise
            except Exception:  # a store hiccup: look again at the next beat
                log.warning("could not read or take the lease; will retry", exc_info=True)
                await self._timer.sleep(self._renew)
                continue
            if lease is not None and lease.holder == self.holder:
                try:
                    await self._lead(lease)
                except asyncio.CancelledError:
                    raise
                except Exception:  # a worker would not start: stand by, try again at the next beat
                    log.exception("could not lead; standing by")
                    await self._timer.sleep(self._renew)
                continue
            await self._timer.sleep(self._renew)

    async def _look(self) -> Lease | None:
        """Take the lease if it is free; else say (once per holder) who holds it."""
        lease = await self._store.lease()
        if lease is None or lease.expired or lease.holder == self.holder:
            started = self._monotonic()
            lease = await self._store.acquire_lease(self.holder, self._ttl)
            if lease.holder == self.holder and self._monotonic() - started >= self._valid_for:
                # The take waited (on Postgres: behind a frozen session's lock on the row, up to
                # its idle limit). The term it wrote starts when its transaction began, so it may
                # have lapsed already, in the store and by the fence's clock: leading on it, the
                # first fenced write is refused and the process steps down again. Renewed at once,
                # from now, instead (refused if another process took the row meanwhile).
                started = self._monotonic()
                lease = (
                    await self._store.renew_lease(self.holder, lease.epoch, self._ttl)
                    or await self._store.lease()
                )
            if lease is not None and lease.holder == self.holder:
                self.fence.grant(lease.epoch, started + self._valid_for)
        self.last = lease
        if lease is not None and lease.holder != self.holder and self._told != (lease.holder, lease.epoch):
            self._told = (lease.holder, lease.epoch)
            log.info(
                "standing by: another pitcrew leads this store",
                extra={
                    "leader": lease.holder,
                    "since": lease.acquired_at.isoformat(timespec="seconds"),
                    "epoch": lease.epoch,
                    "expires_at": lease.expires_at.isoformat(timespec="seconds"),
                    "holder": self.holder,
                },
            )
        return lease

    async def _lead(self, lease: Lease) -> None:
        self._lost.clear()
        self._term = lease.epoch
        self._metrics.leader.set(1)
        self._metrics.leader_epoch.set(lease.epoch)
        log.info(
            "leading: this pitcrew acts for the store",
            extra={"holder": self.holder, "epoch": lease.epoch, "ttl": self._ttl.total_seconds()},
        )
        why = "stopped"
        try:
            for worker in self._workers:
                await worker.start()
                self._running.append(worker)
            why = await self._keep(lease.epoch)
        finally:
            await self._step_down()
            level = logging.INFO if why == "stopped" else logging.WARNING
            log.log(level, "stepped down: standing by", extra={"holder": self.holder, "why": why})

    async def _keep(self, epoch: int) -> str:
        """Renew until the lease is lost; why it was."""
        while True:
            if await self._timer.wait(self._lost, self._renew):
                return self._why
            started = self._monotonic()
            try:
                async with asyncio.timeout(self._renew):
                    lease = await self._store.renew_lease(self.holder, epoch, self._ttl)
            except Exception as exc:  # StoreUnavailable, a timeout: the store may answer next time
                if not self.fence.leading:
                    return f"renewals failed for {self._valid_for:g}s (last: {exc})"
                log.warning("lease renewal failed; will retry", extra={"reason": str(exc)})
                continue
            if lease is None:
                return f"epoch {epoch} was taken over by another process"
            self.last = lease
            self.fence.extend(started + self._valid_for)

    def _deposed(self, why: str) -> None:
        self._why = why
        self._lost.set()

    async def _step_down(self) -> None:
        self.fence.revoke()  # first: no write of this term commits from now on
        self._metrics.leader.set(0)
        while self._running:
            worker = self._running.pop()
            stopping = asyncio.create_task(worker.stop(), name=f"pitcrew-stop-{type(worker).__name__}")
            try:
                # A worker that does not end soon is named with where every task of pitcrew's
                # stands, and still waited for: abandoning it could leave two of it running
                # after the next term starts. (Its writes are refused meanwhile: the fence is revoked.)
                done, _ = await asyncio.wait({stopping}, timeout=self._stop_noticed)
                if not done:
                    log.warning(
                        "a leader-only worker has not stopped yet; still waiting",
                        extra={"worker": type(worker).__name__, "tasks": _where_tasks_stand()},
                    )
                await stopping
            except asyncio.CancelledError:
                stopping.cancel()
                raise
            except Exception:
                log.exception("a leader-only worker failed to stop")
