"""What a Postgres replica expects its batch's lookups to answer, so a batch can skip them.

A batch of deliveries with alerts it was not handed as known (``bot.store.group_commit``) looks
up, with the write lock held, whether those alerts are stored and each of their nodes' active
incident with the faults it has (``bot.store.ingest``), then writes: two messages to the
database, and the event loop comes round twice for their answers. In a steady fleet the lookup
answers what this replica already knows: an alert it remembers (``bot.store.repeats``) is stored
as it remembers it, any other is new, and a node's incident is the one the last batch for that
node left, under way or not, with the faults it had. So the store keeps, for the nodes its
batches saw, the view they left (``NodeView``), brought up to date by the incidents this process
moves (``moved``), and a batch whose every node is known goes without the lookup: it is worked
out from what is expected, and the same transaction first confirms in the server that the lookup
would have answered exactly that (``bot.store.ingest._confirm``: the alerts stored, their status
and incident, each node's active incident, whether it is open, and its faults). The batch is then
one message, its ``COMMIT`` included.

What is expected is never trusted: the confirmation runs under the write lock, before any write,
and the transaction commits only if it holds, so the writes are exactly those the lookup would
have led to. If it does not hold (the other replica of a pair stored or resolved an alert or moved
an incident, a process restarted), nothing is kept and the batch runs again with its lookup
(``Mispredicted``), at the cost of a round trip and a rollback; after such a miss the store
expects nothing for a few batches (``BACKOFF_MAX`` at most, doubling while misses come in a row),
so a replica whose views keep going stale (a standby beside the leader's engine) pays for a miss
rarely. A batch with an alert one of the last few batches did not know either (``RECENT``: the
same group sent twice at once, the second in the next batch, which begins while the first
commits) looks up. Only whether an incident is open is confirmed, not its state: the batch asks
nothing more of it (a new fault on an incident under way is a change of plan).
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import TypeVar

from bot.domain.alerts import AlertStatus
from bot.domain.incident import State

#: A node's active incident as a batch left it: its id, its state and the faults of its alerts;
#: ``None``: the node had no active incident.
NodeView = tuple[str, str, frozenset[str]] | None

#: Nodes whose view is kept at most (the least recently seen go first).
NODES_MAX = 100_000
#: Batches whose new keys a batch never expects to be absent (``Expecting.recent``).
RECENT = 8

Key = tuple[str, str]
#: An alert key's status and incident id, as stored.
KeyState = tuple[AlertStatus, str | None]
#: Batches that expect nothing after a miss, at most (the count doubles with each miss in a row).
BACKOFF_MAX = 64


K = TypeVar("K")
V = TypeVar("V")


def keep_latest(held: OrderedDict[K, V], new: Mapping[K, V], most: int) -> None:
    """``new`` into ``held`` as its most recent entries; the least recent beyond ``most`` go (the
    nodes' views here, the keys remembered in ``bot.store.repeats.RepeatMemory``)."""
    for key, value in new.items():
        held[key] = value
        held.move_to_end(key)
    while len(held) > most:
        held.popitem(last=False)


class Mispredicted(Exception):
    """The database did not hold what a batch expected: nothing of it was kept; run it again with
    its lookup."""


@dataclass(slots=True)
class Expecting:
    """One transaction's use of the expectations (``Expectations.turn``)."""

    #: The views a batch may expect (``None``: it looks everything up).
    nodes: Mapping[str, NodeView] | None
    #: The keys the last ``RECENT`` batches did not remember when they began (each batch adds its
    #: own): one may be committed and not remembered yet (a delivery sent twice at once, the
    #: second in the next batch, which begins while the first commits), so a batch with one of
    #: them looks up.
    recent: deque[frozenset[Key]] = field(default_factory=lambda: deque(maxlen=RECENT))
    #: Keys known committed, and their state: a batch expects the lookup to find them so.
    keys: Mapping[Key, KeyState] = field(default_factory=dict)
    #: The batch went without its lookup (its transaction confirms what it expected).
    used: bool = False
    #: The nodes the batch looked up or expected, as it left them (learnt once it commits).
    seen: dict[str, NodeView] = field(default_factory=dict)


class Expectations:
    """The views a replica's batches left of their nodes, and when to expect them."""

    def __init__(
        self,
        nodes_max: int = NODES_MAX,
        *,
        keys: Callable[[datetime], Mapping[Key, KeyState]] | None = None,
    ) -> None:
        """``keys``: the keys known committed at a time (the store's memory of them,
        ``bot.store.repeats.RepeatMemory.trusted``)."""
        self._keys = keys
        self._nodes: OrderedDict[str, NodeView] = OrderedDict()
        self._nodes_max = nodes_max
        self._recent: deque[frozenset[Key]] = deque(maxlen=RECENT)
        self._skip = 0  # batches left that expect nothing
        self._backoff = 0  # how many the next miss skips (doubled from 1)
        self.hits = 0
        self.misses = 0

    def turn(self, now: datetime) -> Expecting:
        """For a batch about to begin at ``now``: what it may expect."""
        if self._skip > 0:
            self._skip -= 1
            return self.lookup()
        keys = {} if self._keys is None else self._keys(now)
        return Expecting(self._nodes, self._recent, keys)

    def lookup(self) -> Expecting:
        """For a batch that looks everything up (what it finds is expected next)."""
        return Expecting(None, self._recent)

    def committed(self, expecting: Expecting) -> None:
        """The batch committed: what it expected held, and what it left is expected next."""
        if expecting.used:
            self.hits += 1
            self._backoff = 0
        self.learn(expecting.seen)

    def missed(self) -> None:
        """A batch's expectation did not hold: the next few expect nothing."""
        self.misses += 1
        self._backoff = min(BACKOFF_MAX, max(1, 2 * self._backoff))
        self._skip = self._backoff

    def learn(self, seen: Mapping[str, NodeView]) -> None:
        keep_latest(self._nodes, seen, self._nodes_max)

    def moved(self, incident_id: str, node: str, state: State) -> None:
        """This process moved an incident (committed): a node whose view is that incident now
        expects its new state, or no active incident once it ended."""
        view = self._nodes.get(node)
        if view is not None and view[0] == incident_id:
            self._nodes[node] = None if state.terminal else (incident_id, state.value, view[2])
