"""Repeat deliveries answered from memory, counted there and committed a second later: both stores.

Most of what Alertmanager sends is a group it sent before (``repeat_interval``, retries, its
peers sending the same group): every alert of the delivery already stored, in the same status.
Such a delivery stores nothing new, so it needs no commit before its answer: the store remembers
the keys (fingerprint + startsAt) it committed or found committed, counts a repeat of them here,
and adds the counts to the stored ones at least every second (``take``, then ``flushed``). A
read of an alert adds what is counted here and not yet committed (``overlay``).

Whether a remembered key may answer a delivery is one rule (``repeat``): the delivery changes
nothing of what is stored. Statuses only go from firing to resolved, and a stale firing never
un-resolves an alert, so what another process stored since (the other replica of a pair) cannot
make a remembered key wrong: only a resolution of an alert remembered as firing goes to the
database.

A key removed from the database is the one thing memory can miss. Only retention removes keys
(``bot.store.retention``), and only the leader prunes: the other replica, and the leader itself
in a race (a delivery that looked its key up just before the prune's delete and remembers it just
after the prune forgot it), would still answer for an alert that is gone, and a firing alert
delivered again would be counted instead of stored. So memory never answers for a key retention
could have removed (``trusted``): an alert retention removes belongs to an incident closed before
the cut-off (now - ``store.retention``), or to none and was last delivered before it; either way
pitcrew stored it before the cut-off, and it started at most ``MAX_CLOCK_SKEW`` after that (what
the intake accepts). An alert that started later than ``PRUNE_SLACK`` after the cut-off is never
removed; an older one (an alert firing for months) is looked up in the database each time. The
keys a prune removed are also forgotten at once (``forget``), which frees the memory.

What this costs: a crash loses the repeat counts of its last second, never an alert. The store
decides when memory may answer at all (SQLite: the file it opened is still there; Postgres: the
database answered within the last second).
"""

from __future__ import annotations

import itertools
import math
from collections import OrderedDict
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

from bot.domain.alerts import MAX_CLOCK_SKEW, AlertStatus, dedupe_key
from bot.store import codec
from bot.store.base import AlertRecord
from bot.store.expect import keep_latest
from bot.store.ingest import KeyState

Key = tuple[str, str]
#: Counted in memory: key → (last seen, deliveries).
Counts = dict[Key, tuple[str, int]]
#: Keys remembered at most (the oldest remembered go first): about 60 MB at this size.
KEYS_MAX = 200_000
#: How much later than a prune's cut-off an alert it removed may have started: the intake's
#: ``MAX_CLOCK_SKEW``, plus an hour for the replicas' clocks (the leader's sets the cut-off).
PRUNE_SLACK = MAX_CLOCK_SKEW + timedelta(hours=1)
_SLACK = PRUNE_SLACK.total_seconds()


def repeat(state: KeyState | None, status: AlertStatus) -> bool:
    """Stored, and the delivery changes nothing of it (a stale firing never un-resolves an alert)."""
    return state is not None and not (state[0] == "firing" and status == "resolved")


class RepeatMemory:
    """Keys known to be committed, and repeat deliveries counted and not yet committed.
    ``retention``: ``store.retention`` (``None``: nothing is ever removed)."""

    def __init__(self, keys_max: int = KEYS_MAX, *, retention: timedelta | None = None) -> None:
        self.retention = retention
        self._minute: int | None = None  # what ``_since`` last worked out, and for which minute
        self._since_key: str | None = None
        self.keys: OrderedDict[Key, KeyState] = OrderedDict()
        self.keys_max = keys_max
        self.seen: Counts = {}
        #: Taken by a flush whose commit has not answered yet: reads keep counting them.
        self.flushing: Counts = {}

    def remember(self, cache: Mapping[Key, KeyState]) -> None:
        """Keys committed (by a delivery this process stored, or found stored)."""
        keep_latest(self.keys, cache, self.keys_max)

    def forget(self, keys: Iterable[Key]) -> None:
        """Keys removed from the database: delivered again, such an alert is new."""
        for key in keys:
            self.keys.pop(key, None)

    def trusted(self, now: datetime) -> Mapping[Key, KeyState]:
        """The remembered keys that may answer at ``now``: those of alerts that started after the
        earliest start retention could have removed (see the module's docstring)."""
        since = self._since(now)
        return self.keys if since is None else _Since(self.keys, since)

    def count(self, alerts: Sequence[tuple[str, datetime, AlertStatus]], now: datetime) -> int | None:
        """Count the delivery and return how many alerts it had, if every one is a remembered
        repeat; else ``None`` and nothing is counted (the store looks further)."""
        keys = []
        known = self.trusted(now)
        for fingerprint, starts_at, status in alerts:
            key = dedupe_key(fingerprint, starts_at)
            if not repeat(known.get(key), status):
                return None
            keys.append(key)
        add(self.seen, keys, codec.ts(now) or "")
        return len(keys)

    def _since(self, now: datetime) -> str | None:
        """The start (as ``dedupe_key`` writes it) at or before which retention could have removed
        an alert, rounded up to the minute (trusting a little less, worked out once a minute: it is
        asked at every delivery); ``None``: nothing is ever removed."""
        if self.retention is None:
            return None
        minute = math.ceil((now.timestamp() - self.retention.total_seconds() + _SLACK) / 60)
        if minute != self._minute:
            try:
                at: datetime | None = datetime.fromtimestamp(minute * 60, UTC)
            except (OverflowError, OSError, ValueError):  # before the calendar: nothing is that old
                at = None
            self._minute, self._since_key = minute, None if at is None else dedupe_key("", at)[1]
        return self._since_key

    def take(self, limit: int | None = None) -> list[tuple[str, int, str, str]]:
        """The counts to commit now (``rows``, in key order): all, or those of the ``limit`` keys
        counted first; held in ``flushing`` until ``flushed``.

        The keys counted first, not the smallest: a chunk is a transaction of its own, whose one
        statement locks its rows in key order, so no order among chunks is needed for two
        replicas' flushes never to wait on each other in a cycle. The ``limit`` smallest keys took
        a pass over every key counted (``heapq.nsmallest``) for each chunk, in one step of the event
        loop: ``take(250)`` timed in place (median of 30, a slow machine) 1.9 ms with 1,000 keys
        counted and 3.3 ms with 3,000; the first counted, 0.7 ms either way, most of it the chunk's
        own rows put in key order."""
        if limit is None or len(self.seen) <= limit:
            self.seen, self.flushing = {}, self.seen
        else:
            self.flushing = {key: self.seen.pop(key) for key in list(itertools.islice(self.seen, limit))}
        return rows(self.flushing)

    def flushed(self, committed: bool) -> None:
        """The flush's commit answered: done, or failed and counted again for the next flush."""
        taken, self.flushing = self.flushing, {}
        if committed:
            return
        for key, (stamp, count) in taken.items():
            _bump(self.seen, key, stamp, count)

    def overlay(self, alert: AlertRecord) -> AlertRecord:
        """``alert`` with the repeat deliveries counted here and not yet committed.

        A read landing while a flush commits may count that flush's deliveries twice or not at all,
        until the next read."""
        key = dedupe_key(alert.fingerprint, alert.starts_at)
        pending = [p for p in (self.seen.get(key), self.flushing.get(key)) if p is not None]
        if not pending:
            return alert
        last = max([alert.last_seen, *(codec.dt(stamp) or alert.last_seen for stamp, _ in pending)])
        return replace(alert, deliveries=alert.deliveries + sum(n for _, n in pending), last_seen=last)


class _Since(Mapping[Key, KeyState]):
    """The keys of ``keys`` whose startsAt is after ``since`` (``dedupe_key``'s UTC timestamps, all
    of one width, order as the instants do)."""

    def __init__(self, keys: Mapping[Key, KeyState], since: str) -> None:
        self._keys, self._since = keys, since

    def __getitem__(self, key: Key) -> KeyState:
        if key[1] <= self._since:
            raise KeyError(key)
        return self._keys[key]

    def get(self, key: Key, default: Any = None) -> Any:  # a miss without raising: the hot path
        return default if key[1] <= self._since else self._keys.get(key, default)

    def __iter__(self) -> Iterator[Key]:
        return (key for key in self._keys if key[1] > self._since)

    def __len__(self) -> int:
        return sum(1 for _ in self)


def add(counts: Counts, keys: Iterable[Key], stamp: str) -> None:
    """One more delivery of each key, seen at ``stamp``."""
    for key in keys:
        _bump(counts, key, stamp, 1)


def rows(counts: Counts) -> list[tuple[str, int, str, str]]:
    """``counts`` as ``bump_seen`` rows, in key order: two transactions counting the same alerts
    (two replicas' batches, under the write lock's shared mode, or flushes, under none) lock their
    rows in the same order, so neither waits on the other's."""
    return [(stamp, n, *key) for key, (stamp, n) in sorted(counts.items())]


def _bump(counts: Counts, key: Key, stamp: str, n: int) -> None:
    last, count = counts.get(key, (stamp, 0))
    counts[key] = (max(last, stamp), count + n)
