"""Rollback: undo, in reverse, only what pitcrew itself did for one incident.

Each step says in the registry how it is undone (its ``undo`` function) or why it is not;
the undo functions check ownership on the far side first (``bot.domain.ownership``), so a
node someone else has taken meanwhile is left alone. Safe to run twice: an undone step is
marked ``undone`` and never undone again. An undo may also keep the change for now (``Kept``:
a job runs on the node a take lent it): the step stays as it was, the rollback's record names it,
and the incident ends ``rolled_back`` all the same; a rollback asked again of it (``again``)
undoes what was kept, and only that. Held by a pause like any change (``bot.engine.pause``):
a rollback under way stops before its next call while paused and goes on after resume.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from bot.domain.incident import State
from bot.engine.context import Kept, StepDeps, StepResult, UndoContext
from bot.engine.pause import Held
from bot.engine.registry import StepDef, StepRegistry
from bot.store import codec
from bot.store.base import NOT_STANDING, Event, IncidentRecord, NewEvent, StepRecord

#: The pseudo-step recording a rollback request: an incident that has it is being undone.
ROLLBACK = "rollback"


@dataclass(frozen=True, slots=True)
class RollbackRecord:
    """Who asked for the rollback, and what it did (set when done; so far, while held)."""

    actor: str = "unknown"
    report: tuple[str, ...] = ()
    #: Forced while paused (``--force``, audited): its calls are not held.
    forced: bool = False
    #: The steps whose change an undo kept for now (``Kept``), in the order it was tried.
    kept: tuple[str, ...] = ()


@dataclass(slots=True)
class Undid:
    """What one pass of ``undo`` did: the report lines, and the steps it kept (``Kept``)."""

    report: list[str] = field(default_factory=list)
    kept: list[str] = field(default_factory=list)


def again(state: State, record: StepRecord | None) -> bool:
    """Whether a rollback asked now of an incident in ``state``, whose rollback step is ``record``,
    is one asked again of a rolled-back incident: its rollback done and some change kept."""
    if state is not State.ROLLED_BACK or record is None or record.status != "ok":
        return False
    return bool(codec.decode_record(RollbackRecord, record.result).kept)


class RollbackHeld(Exception):
    """A pause held the rollback's next change (``bot.engine.pause``); ``undid`` is what was
    undone (and kept) before it. The rollback stays under way and goes on after resume."""

    def __init__(self, undid: Undid, held: Held) -> None:
        super().__init__(str(held))
        self.undid = undid
        self.held = held


async def undo(
    incident: IncidentRecord,
    steps: Mapping[str, StepRecord],
    deps: StepDeps,
    registry: StepRegistry,
    actor: str,
    *,
    tried: Sequence[str] = (),
) -> Undid:
    """Undo completed (or half-done) steps in reverse order, but those this rollback ``tried``
    and kept already (a pass held by a pause, carried on); what it did."""
    undid = Undid()
    ctx = UndoContext(incident, deps, actor)
    events = await deps.store.events_of(incident.id)
    for step in _newest_first(incident, steps, events):
        record = steps.get(step)
        definition = registry.get(step)
        if record is None or definition is None or record.status in NOT_STANDING or step in tried:
            continue
        try:
            line = await _undo_one(ctx, definition, record)
        except Held as held:
            raise RollbackHeld(undid, held) from held
        if line is None:
            continue
        if isinstance(line, Kept):  # stands for now: the step is left as it was, to be tried again
            undid.report.append(line.line)
            undid.kept.append(step)
            await deps.store.record(
                incident.id, NewEvent("step_kept", step=step, actor=actor, detail=line.line), deps.clock()
            )
            continue
        undid.report.append(line)
        await deps.store.step_finished(
            incident.id,
            step,
            "undone",
            deps.clock(),
            result={**record.result, "undo": line},
            event=NewEvent("step_undone", step=step, actor=actor, detail=line),
        )
    return undid


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


async def _undo_one(
    ctx: UndoContext, definition: StepDef[StepResult], record: StepRecord
) -> str | Kept | None:
    if isinstance(definition.undo, str):
        # Only what changed something is worth a line: "irreversible" for mutating steps.
        return f"{definition.name}: irreversible — {definition.undo}" if definition.destructive else None
    return await definition.undo(ctx, codec.decode_record(definition.result, record.result))
