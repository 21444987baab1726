"""Commands humans give pitcrew: approve, reject, rollback, pause, resume, breaker reset.

Slack, the CLI and the HTTP API all call these, with an ``actor`` naming who asked; every
command, accepted or refused, is written to the audit log. Approvals are checked against
the allowlist: an approval from anyone else is refused, audited and counted.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol

from bot.domain.incident import State
from bot.domain.policy import Mode
from bot.engine.admission import BREAKER, PAUSE, breaker_state
from bot.engine.metrics import Metrics
from bot.engine.rollback import ROLLBACK, RollbackRecord
from bot.store import codec
from bot.store.base import IncidentRecord, NewEvent, Store


class EngineControl(Protocol):
    """What commands ask of the running engine."""

    def signal(self, incident_id: str) -> None: ...
    def signal_all(self) -> None: ...
    async def request_rollback(self, incident: IncidentRecord, actor: str) -> None: ...


@dataclass(frozen=True, slots=True)
class CommandResult:
    """``status``: ``ok``, ``refused`` (not allowed), ``not_found`` or ``conflict`` (wrong state)."""

    status: str
    message: str
    data: dict[str, Any] | None = None

    @property
    def ok(self) -> bool:
        return self.status == "ok"


def allowed(actor: str, approvers: tuple[str, ...]) -> bool:
    """``slack:U123`` matches an allowlist entry ``slack:U123`` or ``U123``; ``alice`` matches ``alice``."""
    bare = actor.split(":", 1)[-1]
    return actor in approvers or bare in approvers


class Commands:
    def __init__(
        self,
        engine: EngineControl,
        store: Store,
        metrics: Metrics,
        clock: Callable[[], datetime],
        mode: Mode,
    ) -> None:
        self._engine = engine
        self._store = store
        self._metrics = metrics
        self._clock = clock
        self._mode = mode

    async def _audit(self, incident_id: str | None, kind: str, actor: str, detail: str, outcome: str) -> None:
        await self._store.record(
            incident_id, NewEvent(kind, actor=actor, outcome=outcome, detail=detail), self._clock()
        )

    async def decide(self, incident_id: str, actor: str, approve: bool) -> CommandResult:
        verb = "approve" if approve else "reject"
        incident = await self._store.incident(incident_id)
        if incident is None:
            return CommandResult("not_found", f"no incident {incident_id}")
        approval = await self._store.approval(incident_id)
        if approval is None or approval.status != "pending":
            state = approval.status if approval else "none requested"
            await self._audit(
                incident_id, f"{verb}_refused", actor, f"no pending approval ({state})", "conflict"
            )
            return CommandResult("conflict", f"{incident_id} has no pending approval ({state})")
        if not allowed(actor, approval.approvers):
            self._metrics.approvals.labels("refused").inc()
            await self._audit(incident_id, f"{verb}_refused", actor, f"{actor} is not an approver", "refused")
            return CommandResult("refused", f"{actor} may not {verb} {incident_id}")
        decided = await self._store.decide_approval(
            incident_id, "approved" if approve else "rejected", actor, self._clock()
        )
        if decided is None:
            return CommandResult("conflict", f"{incident_id} was decided meanwhile")
        self._metrics.approvals.labels("approved" if approve else "rejected").inc()
        await self._audit(incident_id, f"{verb}d", actor, f"{incident.playbook} {verb}d by {actor}", "ok")
        self._engine.signal(incident_id)
        return CommandResult("ok", f"{incident_id} {verb}d by {actor}")

    async def approve(self, incident_id: str, actor: str) -> CommandResult:
        return await self.decide(incident_id, actor, approve=True)

    async def reject(self, incident_id: str, actor: str) -> CommandResult:
        return await self.decide(incident_id, actor, approve=False)

    async def rollback(self, incident_id: str, actor: str) -> CommandResult:
        incident = await self._store.incident(incident_id)
        if incident is None:
            return CommandResult("not_found", f"no incident {incident_id}")
        if incident.state in {State.ROLLED_BACK, State.SUPPRESSED}:
            await self._audit(
                incident_id, "rollback_refused", actor, f"incident is {incident.state}", "conflict"
            )
            return CommandResult("conflict", f"{incident_id} is {incident.state}; nothing to roll back")
        await self._engine.request_rollback(incident, actor)
        steps = await self._store.steps_of(incident_id)
        record = steps.get(ROLLBACK)
        report = list(codec.decode_record(RollbackRecord, record.result).report) if record else []
        return CommandResult("ok", f"{incident_id} rolled back by {actor}", {"report": report})

    async def pause(self, actor: str, reason: str = "") -> CommandResult:
        now = self._clock()
        await self._store.set_switch(PAUSE, {"reason": reason}, actor, now)
        self._metrics.paused.set(1)
        await self._audit(None, "paused", actor, reason or "kill switch on", "ok")
        return CommandResult("ok", f"paused by {actor}: no node will be touched until resume")

    async def resume(self, actor: str) -> CommandResult:
        now = self._clock()
        await self._store.set_switch(PAUSE, None, actor, now)
        self._metrics.paused.set(0)
        await self._audit(None, "resumed", actor, "kill switch off", "ok")
        self._engine.signal_all()
        return CommandResult("ok", f"resumed by {actor}")

    async def reset_breaker(self, actor: str) -> CommandResult:
        now = self._clock()
        state = await breaker_state(self._store)
        await self._store.set_switch(
            BREAKER, {"open": False, "reset_at": now.isoformat(), "reset_by": actor}, actor, now
        )
        self._metrics.breaker_open.set(0)
        detail = f"breaker reset (was {'open: ' + state.reason if state.open else 'closed'})"
        await self._audit(None, "breaker_reset", actor, detail, "ok")
        return CommandResult("ok", f"{detail} by {actor}; alerts older than the stale cutoff are skipped")

    async def status(self) -> dict[str, Any]:
        breaker = await breaker_state(self._store)
        pause = await self._store.switch(PAUSE)
        return {
            "mode": self._mode.value,
            "paused": pause is not None,
            "paused_by": (pause or {}).get("set_by"),
            "breaker": {
                "open": breaker.open,
                "reason": breaker.reason,
                "opened_at": breaker.opened_at.isoformat() if breaker.opened_at else None,
                "reset_at": breaker.reset_at.isoformat() if breaker.reset_at else None,
            },
        }
