"""Rollback: undo, in reverse, only what pitcrew itself did for one incident.

Slurm RESUME only where the reason is still ``pitcrew: <incident>``; uncordon/untaint only
where the node still carries this incident's annotation; cancel a replacement only if it
has not started. Everything else is reported as left alone or irreversible. Safe to run
twice: every undo checks the far side first.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from datetime import datetime
from typing import Any

from bot.domain.playbooks import IRREVERSIBLE
from bot.engine.context import Ports
from bot.engine.metrics import Metrics
from bot.engine.steps_cluster import release_cordon
from bot.engine.steps_slurm import owns
from bot.store.base import IncidentRecord, NewEvent, StepRecord, Store


async def undo(
    incident: IncidentRecord,
    steps: Mapping[str, StepRecord],
    ports: Ports,
    store: Store,
    metrics: Metrics,
    clock: Callable[[], datetime],
    actor: str,
) -> list[str]:
    """Undo completed (or half-done) reversible steps in reverse order; return the report lines."""
    report: list[str] = []
    order = list((incident.plan or {}).get("steps", []))
    for step in reversed(order):
        record = steps.get(step)
        if record is None or record.status in {"skipped", "undone"}:
            continue
        line = await _undo_one(step, record.result, incident, ports, metrics)
        if line is None:
            continue
        report.append(line)
        await store.step_finished(
            incident.id,
            step,
            "undone",
            clock(),
            result={**record.result, "undo": line},
            event=NewEvent("step_undone", step=step, actor=actor, detail=line),
        )
    return report


async def _undo_one(
    step: str, result: Mapping[str, Any], incident: IncidentRecord, ports: Ports, metrics: Metrics
) -> str | None:
    if step == "slurm_down":
        return await _resume_ours(result, incident, ports, metrics)
    if step == "cordon":
        if not result.get("owned") and not result.get("cordoning"):
            return "cordon: the node was cordoned by someone else; left as is"
        if await release_cordon(ports.cluster, incident.node, incident.id):
            metrics.actions.labels("uncordon").inc()
            return f"cordon: {incident.node} uncordoned and untainted"
        return "cordon: the node no longer carries pitcrew's annotation; left as is"
    if step == "replace":
        if await ports.cluster.replacement_started(incident.node, incident_id=incident.id):
            return "replace: the replacement has already started and cannot be cancelled"
        if await ports.cluster.cancel_replacement(incident.node, incident_id=incident.id):
            metrics.actions.labels("cancel_replacement").inc()
            return "replace: replacement cancelled before it started"
        return "replace: no replacement to cancel"
    if step in IRREVERSIBLE:
        return f"{step}: irreversible — {IRREVERSIBLE[step]}"
    return None


async def _resume_ours(
    result: Mapping[str, Any], incident: IncidentRecord, ports: Ports, metrics: Metrics
) -> str:
    names = list(result.get("slurm_nodes", [])) or list(result.get("owned", {}))
    if not names and result.get("pending"):
        names = [result["pending"]]
    lines = []
    for name in names:
        state = await ports.scheduler.node(name)
        if not (state.down or state.drained):
            lines.append(f"{name} already in service")
        elif owns(state.reason, incident.id):
            await ports.scheduler.resume(name)
            metrics.actions.labels("slurm_resume").inc()
            lines.append(f"{name} resumed")
        else:
            lines.append(
                f"{name} left {'/'.join(sorted(state.states))} (reason {state.reason!r} is not pitcrew's)"
            )
    return "slurm_down: " + "; ".join(lines or ["no Slurm node was taken"])
