"""The node a replacement took away, still going when its incident closed: looked at for a while after.

Karpenter's termination of the replaced node can stall where pitcrew tells it only minutes after the
NodeClaim's delete (its volumes still attached six minutes into the wait for them to detach; a
budget's refusal a minute into a drain that began late), while the successor may have come at once,
so the incident can close first (``close`` looks once more, ``_old_node_held_at_close``). ``close``
hands an old node it did not see gone to this watch (``steps.notify.watch_after_close``: the store's
``remember``, fenced like every engine write, so a new leader goes on with it). The engine's scan
(the leading process only) looks at each every ``LOOK_AGAIN`` seconds, one read of the adapter's
``termination_held``, until the node is gone, a hang is told (once, as ``close`` would have: in the
closed incident's timeline and a warning notice, the notice posted once per key by the outbox), or
``AFTER_CLOSE`` has passed; a node still there then, nothing seen holding it, is told once too (an
info notice: its instance may still run, billed, and nobody looks at it after). A look that fails
is logged and tried again at the next.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime

from bot import logger
from bot.engine.deps import EngineDeps
from bot.engine.errors import PitcrewError
from bot.engine.steps.notify import AFTER_CLOSE, WATCH_AFTER_CLOSE, Leaving
from bot.engine.steps.put_back import LOOK_AGAIN
from bot.engine.steps.repair import (
    OLD_NODE_STAYED,
    TERMINATION_HELD,
    old_node_held_notice,
    old_node_stayed,
    old_node_stayed_notice,
)
from bot.store import codec
from bot.store.base import JsonObject, NewEvent

log = logger(__name__)


class OldNodeWatch:
    """The engine's side: one look at the watched old nodes per ``LOOK_AGAIN`` at most."""

    def __init__(self, deps: EngineDeps) -> None:
        self._deps = deps
        self._last: datetime | None = None

    async def poll(self) -> None:
        now = self._deps.clock()
        if self._deps.ports.cluster is None:
            return
        if self._last is not None and (now - self._last).total_seconds() < LOOK_AGAIN:
            return
        self._last = now
        store = self._deps.store
        watched = await store.memory(WATCH_AFTER_CLOSE)
        if not watched:
            return
        ports = self._deps.step_deps().ports  # reads and notices pass the pause; the fence holds
        cluster = ports.cluster
        if cluster is None:
            return
        done: dict[str, JsonObject | None] = {}
        for incident_id, value in watched.items():
            leaving = codec.decode_record(Leaving, value)
            if now > leaving.until:
                log.info(
                    "the replaced node was not seen gone in the watch after close; looking no more",
                    extra={"incident": incident_id, "node": leaving.node},
                )
                await self._stayed(incident_id, leaving, now)
                done[incident_id] = None
                continue
            try:
                look = await cluster.termination_held(leaving.node, handle=leaving.handle)
            except PitcrewError as exc:
                log.info(
                    "could not look whether the replaced node is held",
                    extra={"incident": incident_id, "reason": str(exc)},
                )
                continue
            # Told once even across a crash between the note and the forgetting: the notice is the mark.
            if look.held is not None and await store.told(incident_id, "close", TERMINATION_HELD) is None:
                await store.record(
                    incident_id, NewEvent(TERMINATION_HELD, step="close", detail=look.held), now
                )
                notice = old_node_held_notice(incident_id, leaving.node, look.held)
                await ports.notifier.post(replace(notice, step="close", key=TERMINATION_HELD))
            if look.gone or look.held is not None:
                done[incident_id] = None
        if done:
            await store.remember(WATCH_AFTER_CLOSE, done, now)

    async def _stayed(self, incident_id: str, leaving: Leaving, now: datetime) -> None:
        """An old node still there at the end of the watch, nothing seen holding it (a hang told ends
        the watch before): told once, as a hang is, so nobody forgets an instance maybe still billed."""
        store = self._deps.store
        if await store.told(incident_id, "close", OLD_NODE_STAYED) is not None:
            return
        detail = old_node_stayed(leaving.node, AFTER_CLOSE)
        await store.record(incident_id, NewEvent(OLD_NODE_STAYED, step="close", detail=detail), now)
        notice = old_node_stayed_notice(incident_id, leaving.node, AFTER_CLOSE)
        await self._deps.step_deps().ports.notifier.post(replace(notice, step="close", key=OLD_NODE_STAYED))
