"""Rollback: undo, in reverse, only what pitcrew itself did for one incident.

Each step says in the registry how it is undone (its ``undo`` function) or why it is not;
the undo functions check ownership on the far side first (``bot.domain.ownership``), so a
node someone else has taken meanwhile is left alone. Safe to run twice: an undone step is
marked ``undone`` and never undone again.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from bot.engine.context import StepDeps, StepResult, UndoContext
from bot.engine.registry import StepDef, StepRegistry
from bot.store import codec
from bot.store.base import IncidentRecord, NewEvent, StepRecord

#: The pseudo-step recording a rollback request: an incident that has it is being undone.
ROLLBACK = "rollback"


@dataclass(frozen=True, slots=True)
class RollbackRecord:
    """Who asked for the rollback, and what it did (set when done)."""

    actor: str = "unknown"
    report: tuple[str, ...] = ()


async def undo(
    incident: IncidentRecord,
    steps: Mapping[str, StepRecord],
    deps: StepDeps,
    registry: StepRegistry,
    actor: str,
) -> list[str]:
    """Undo completed (or half-done) steps in reverse order; return the report lines."""
    report: list[str] = []
    order = list(incident.plan.steps) if incident.plan else []
    ctx = UndoContext(incident, deps, actor)
    for step in reversed(order):
        record = steps.get(step)
        definition = registry.get(step)
        if record is None or definition is None or record.status in {"skipped", "undone", "superseded"}:
            continue
        line = await _undo_one(ctx, definition, record)
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


async def _undo_one(ctx: UndoContext, definition: StepDef[StepResult], record: StepRecord) -> str | None:
    if isinstance(definition.undo, str):
        # Only what changed something is worth a line: "irreversible" for mutating steps.
        return f"{definition.name}: irreversible — {definition.undo}" if definition.destructive else None
    return await definition.undo(ctx, codec.decode_record(definition.result, record.result))
