"""Storms: when many incidents open within a short window, one channel message for all of them.

Slack allows about one message per second per channel; two hundred threads for two hundred nodes
would take minutes and bury the channel. Once ``digest_threshold`` incidents have opened within
``digest_window``, the next ones join one **digest** message instead of opening a thread each:
nodes, faults, states, and what the circuit breaker held back. The digest is rebuilt from the
store and updated in place (``chat.update``) at most once a second and within the method's rate
tier (``updates.ChatUpdates``), so a notice committed before the last update read the store is
already shown and needs no call of its own: one whose outbox id is at most the newest of the
items waiting when that update began to read (``_SEEN``). Outbox ids are taken in commit order
(the store's writes run one at a time, under its write lock), and every change of an incident's
state commits a ``state`` item of its own. A timestamp would not do: an item is stamped with the
engine's time before its transaction commits, so a read between the two saw it "before" and
missed the change it carries (a node the breaker held stayed "open" in the digest, as no later
notice came for it).

What the digest remembers lives in the outbox's references: ``digest`` names the current one,
``digest:<ts>`` holds each one's span (first and last incident opening); a member incident's
thread reference is ``digest:<ts>``, so a late notice of an old storm updates that storm's message.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable
from datetime import datetime, timedelta
from typing import Any

from bot.domain.durations import format_duration
from bot.engine.errors import PermanentError
from bot.integrations.slack import messages
from bot.integrations.slack.errors import MessageClosed
from bot.integrations.slack.messages import DigestEntry, Message
from bot.integrations.slack.updates import ChatUpdates
from bot.store.base import IncidentRecord, OutboxItem, Store

NAME = "slack"
PREFIX = "digest:"
_EVERY = 1.0  # seconds between two writes of one digest
#: How many waiting items a write reads to learn the newest committed before it reads the
#: incidents (a storm's backlog; more only makes the next write's skip shorter, never wrong).
_SEEN = 5000
Post = Callable[[OutboxItem, Message], Awaitable[str]]


class StormDigest:
    def __init__(
        self,
        updates: ChatUpdates,
        store: Store,
        channel: str,
        window: timedelta,
        threshold: int,
        clock: Callable[[], datetime],
    ) -> None:
        self._updates = updates
        self._store = store
        self._channel = channel
        self._window = window
        self._threshold = threshold
        self._clock = clock
        self._lock = asyncio.Lock()
        self._covered: dict[str, int] = {}  # digest ts → outbox items up to this id are shown
        self._written: dict[str, float] = {}  # digest ts → monotonic time of its last write

    async def joins(self, incident: IncidentRecord) -> bool:
        """Whether this incident (with no thread yet) belongs in a digest rather than a thread."""
        current = await self._current()
        if current is not None and incident.opened_at - _at(current["last"]) <= self._window:
            return True
        # Incidents opened in the window up to this one (later ones may exist already: the outbox
        # can lag behind a storm).
        recent = await self._store.incidents(limit=1000)
        near = [i for i in recent if timedelta(0) <= incident.opened_at - i.opened_at <= self._window]
        return len(near) >= self._threshold

    async def show(self, item: OutboxItem, incident: IncidentRecord, thread: str | None, post: Post) -> str:
        """Bring the incident's digest up to date (starting one if it has none); its thread reference."""
        async with self._lock:
            doc = await self._document(thread) if thread else None
            if doc is None:
                doc = await self._current()
                if doc is not None and incident.opened_at - _at(doc["last"]) > self._window:
                    doc = None  # that storm is over: this is a new one
            ts: str | None = str(doc["ts"]) if doc else None
            covered = self._covered.get(ts) if ts is not None else None
            if ts is not None and covered is not None and item.id <= covered:
                return PREFIX + ts  # a write that read the store after this item committed shows it
            if ts is not None:
                wait = self._written.get(ts, 0.0) + _EVERY - time.monotonic()
                if wait > 0:
                    await asyncio.sleep(wait)
            # Everything committed before the incidents are read is shown by this write: the items
            # waiting now, read first, and the one being delivered.
            waiting = await self._store.outbox_pending(NAME, limit=_SEEN)
            seen = max((i.id for i in waiting), default=0)
            incidents = await self._store.incidents(limit=1000)
            since = (
                _at(doc["since"])
                if doc
                else min(
                    (
                        i.opened_at
                        for i in incidents
                        if timedelta(0) <= incident.opened_at - i.opened_at <= self._window
                    ),
                    default=incident.opened_at,
                )
            )
            members = self._storm(incidents, since)
            last = max(members[-1].opened_at if members else since, incident.opened_at)
            message = self._message(members)
            gone: str | None = None
            if ts is None:
                ts = await post(item, message)
            else:
                try:
                    await self._updates.update(ts, message)
                except PermanentError as exc:
                    if not isinstance(exc, MessageClosed):
                        raise
                    # Deleted in Slack, or no longer editable (its edit window closed): post it again.
                    gone, ts = ts, await post(item, message)
            document = {"ts": ts, "since": since.isoformat(), "last": last.isoformat()}
            now = self._clock()
            await self._store.set_outbox_ref(NAME, PREFIX + ts, json.dumps(document), now)
            if gone is not None:  # its members' thread references name the old one: point it here
                await self._store.set_outbox_ref(NAME, PREFIX + gone, json.dumps(document), now)
            current = await self._current()
            if current is None or _at(current["last"]) <= last:
                await self._store.set_outbox_ref(NAME, "digest", ts, now)
            # This item too: it may lie past the first _SEEN waiting. An earlier cover is below it.
            self._covered[ts], self._written[ts] = max(seen, item.id), time.monotonic()
            return PREFIX + ts

    async def active(self) -> bool:
        return await self._current() is not None

    def _storm(self, incidents: list[IncidentRecord], since: datetime) -> list[IncidentRecord]:
        """The storm that began at ``since``: incidents opened from then on, each within the window
        of the one before (a quiet gap longer than the window ends it)."""
        members: list[IncidentRecord] = []
        for incident in sorted((i for i in incidents if i.opened_at >= since), key=lambda i: i.opened_at):
            if members and incident.opened_at - members[-1].opened_at > self._window:
                break
            members.append(incident)
        return members

    def _message(self, members: list[IncidentRecord]) -> Message:
        entries = [
            DigestEntry(
                i.id,
                i.node,
                i.faults[0].short if i.faults else "GPU fault",
                i.state.value,
                "breaker" in i.outcome.lower(),
            )
            for i in members
        ]
        mode = members[-1].mode if members and members[-1].mode else "-"
        return messages.digest(entries, format_duration(self._window), mode)

    async def _current(self) -> dict[str, Any] | None:
        ts = await self._store.outbox_ref(NAME, "digest")
        return await self._document(PREFIX + ts) if ts else None

    async def _document(self, thread: str) -> dict[str, Any] | None:
        raw = await self._store.outbox_ref(NAME, thread)
        return dict(json.loads(raw)) if raw else None


def _at(value: str) -> datetime:
    return datetime.fromisoformat(value)
