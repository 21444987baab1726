"""Rollback: undo, in reverse, only what pitcrew itself did for one incident.

Each step says in the registry how it is undone (its ``undo`` function) or why it is not;
the undo functions check ownership on the far side first (``bot.domain.ownership``), so a
node someone else has taken meanwhile is left alone. Safe to run twice: an undone step is
marked ``undone`` and never undone again. Held by a pause like any change (``bot.engine.pause``):
a rollback under way stops before its next call while paused and goes on after resume.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from bot.engine.context import StepDeps, StepResult, UndoContext
from bot.engine.pause import Held
from bot.engine.registry import StepDef, StepRegistry
from bot.store import codec
from bot.store.base import Event, IncidentRecord, NewEvent, StepRecord

#: The pseudo-step recording a rollback request: an incident that has it is being undone.
ROLLBACK = "rollback"


@dataclass(frozen=True, slots=True)
class RollbackRecord:
    """Who asked for the rollback, and what it did (set when done; so far, while held)."""

    actor: str = "unknown"
    report: tuple[str, ...] = ()
    #: Forced while paused (``--force``, audited): its calls are not held.
    forced: bool = False


class RollbackHeld(Exception):
    """A pause held the rollback's next change (``bot.engine.pause``); ``report`` is what was
    undone before it. The rollback stays under way and goes on after resume."""

    def __init__(self, report: list[str], held: Held) -> None:
        super().__init__(str(held))
        self.report = report
        self.held = held


async def undo(
    incident: IncidentRecord,
    steps: Mapping[str, StepRecord],
    deps: StepDeps,
    registry: StepRegistry,
    actor: str,
) -> list[str]:
    """Undo completed (or half-done) steps in reverse order; return the report lines."""
    report: list[str] = []
    ctx = UndoContext(incident, deps, actor)
    events = await deps.store.events_of(incident.id)
    for step in _newest_first(incident, steps, events):
        record = steps.get(step)
        definition = registry.get(step)
        if record is None or definition is None or record.status in {"skipped", "undone", "superseded"}:
            continue
        try:
            line = await _undo_one(ctx, definition, record)
        except Held as held:
            raise RollbackHeld(report, held) from held
        if line is None:
            continue
        report.append(line)
        await deps.store.step_finished(
            incident.id,
            step,
            "undone",
            deps.clock(),
            result={**record.result, "undo": line},
            event=NewEvent("step_undone", step=step, actor=actor, detail=line),
        )
    return report


def _newest_first(
    incident: IncidentRecord, steps: Mapping[str, StepRecord], events: Sequence[Event]
) -> list[str]:
    """The steps to undo, the reverse of the order they ran in: the plan's, last first, then those
    an earlier rung of the repair ladder did and carried over that this rung does not have
    (``Admission.climb``), last started first. A step one rung did and the next superseded is not
    among them: the next rung did it again (its record is the new one), or the node's return undid it."""
    order = list(incident.plan.steps) if incident.plan else []
    started = {e.step: index for index, e in enumerate(events) if e.kind == "step_started" and e.step}
    earlier = sorted((name for name in steps if name not in order), key=lambda name: started.get(name, -1))
    return [*reversed(order), *reversed(earlier)]


async def _undo_one(ctx: UndoContext, definition: StepDef[StepResult], record: StepRecord) -> str | None:
    if isinstance(definition.undo, str):
        # Only what changed something is worth a line: "irreversible" for mutating steps.
        return f"{definition.name}: irreversible — {definition.undo}" if definition.destructive else None
    return await definition.undo(ctx, codec.decode_record(definition.result, record.result))
