"""The incident state machine: one incident per node, from first alert to its end.

```
open ─▶ guarded ─▶ awaiting_approval ─▶ running ─▶ verifying ─▶ resolved
  │        │              │                │            │          │
  └────────┴──────────────┴────────────────┴────────────┴──────────┴─▶ failed | rolled_back | suppressed
```

``open``: alerts recorded, not yet planned. ``guarded``: planned and let through by the
guards. ``awaiting_approval``: an approval request is pending. ``running``: mutating steps.
``verifying``: waiting for the node and the job to come back. Terminal: ``resolved``,
``failed`` (escalated to humans), ``rolled_back``, ``suppressed`` (a guard or the mode
said no, with the reason recorded).
"""

from __future__ import annotations

from enum import StrEnum


class State(StrEnum):
    OPEN = "open"
    GUARDED = "guarded"
    AWAITING_APPROVAL = "awaiting_approval"
    RUNNING = "running"
    VERIFYING = "verifying"
    RESOLVED = "resolved"
    FAILED = "failed"
    ROLLED_BACK = "rolled_back"
    SUPPRESSED = "suppressed"

    @property
    def terminal(self) -> bool:
        return self in TERMINAL


TERMINAL = frozenset({State.RESOLVED, State.FAILED, State.ROLLED_BACK, State.SUPPRESSED})
ACTIVE = frozenset(State) - TERMINAL

_ALLOWED: dict[State, frozenset[State]] = {
    # A rollback may end an incident before anything was done: there is nothing to undo.
    State.OPEN: frozenset({State.GUARDED, State.SUPPRESSED, State.FAILED, State.RESOLVED, State.ROLLED_BACK}),
    State.GUARDED: frozenset(
        {
            State.AWAITING_APPROVAL,
            State.RUNNING,
            State.VERIFYING,
            State.RESOLVED,
            State.SUPPRESSED,
            State.FAILED,
            State.ROLLED_BACK,
        }
    ),
    State.AWAITING_APPROVAL: frozenset({State.RUNNING, State.SUPPRESSED, State.FAILED, State.ROLLED_BACK}),
    State.RUNNING: frozenset(
        {State.AWAITING_APPROVAL, State.VERIFYING, State.RESOLVED, State.FAILED, State.ROLLED_BACK}
    ),
    # A climb of the repair ladder from a node's return or its validation asks again in approve mode.
    State.VERIFYING: frozenset(
        {State.RUNNING, State.AWAITING_APPROVAL, State.RESOLVED, State.FAILED, State.ROLLED_BACK}
    ),
    # A failed or resolved incident may still be rolled back by a human: it undoes what pitcrew did.
    State.FAILED: frozenset({State.ROLLED_BACK}),
    State.RESOLVED: frozenset({State.ROLLED_BACK}),
    State.ROLLED_BACK: frozenset(),
    State.SUPPRESSED: frozenset(),
}


class TransitionError(ValueError):
    pass


def can_move(current: State, target: State) -> bool:
    return current == target or target in _ALLOWED[current]


def move(current: State, target: State) -> State:
    """The new state, or ``TransitionError`` when the move is not allowed."""
    if not can_move(current, target):
        raise TransitionError(f"an incident cannot go from {current} to {target}")
    return target
