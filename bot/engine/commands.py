"""Commands humans give pitcrew: approve, reject, rollback, pause, resume, breaker reset.

Slack, the CLI and the HTTP API all call these, with an ``actor`` naming who asked; every
command, accepted or refused, is written to the audit log. Approvals are checked against
the allowlist: an approval from anyone else is refused, audited and counted.

Every process takes commands, leader or standby (``bot.engine.leadership``): they are written
to the store, which is how the leader hears of them. A rollback given to a standby is recorded
as a request (once, however many processes are asked) and carried out by the leader, whose
report the standby waits for, up to ``rollback_wait`` (under the CLI's 30 s); past that it
answers ``accepted``.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal, Protocol

from bot.domain.incident import State
from bot.domain.policy import Mode
from bot.engine.admission import BREAKER, PAUSE, breaker_state
from bot.engine.locks import IncidentLocks
from bot.engine.metrics import Metrics
from bot.engine.rollback import ROLLBACK, RollbackRecord, again
from bot.engine.signals import RealTimer, Timer
from bot.store import codec
from bot.store.base import ApprovalStatus, Deposed, IncidentRecord, NewEvent, Store


class EngineControl(Protocol):
    """What commands ask of the running engine."""

    @property
    def locks(self) -> IncidentLocks: ...

    @property
    def leading(self) -> bool:
        """Whether this process leads the store (runs playbooks) right now."""
        ...

    def signal(self, incident_id: str) -> None: ...
    def signal_all(self) -> None: ...
    def wake(self) -> None:
        """Scan now (the leader shows the switches as the store holds them)."""
        ...

    async def request_rollback(
        self, incident: IncidentRecord, actor: str, *, forced: bool = False
    ) -> list[str] | None: ...


#: Where a command may come from. pitcrew records it, never the caller: an actor is
#: ``<channel>:<name>`` (``http:alice``, ``cli:alice``, ``slack:U0ALICE``), matched by an allowlist
#: entry naming the whole actor, or by the bare name for these channels only.
CHANNELS = frozenset({"slack", "cli", "http"})
ACTOR_MAX = 128
#: Longest free text a command carries (a pause's reason): it is stored, audited and posted to Slack.
REASON_MAX = 500
#: What a decision on an approval is called in the audit log.
_DECIDED: dict[bool, ApprovalStatus] = {True: "approved", False: "rejected"}


@dataclass(frozen=True, slots=True)
class CommandResult:
    """``status``: ``ok``, ``accepted`` (recorded; the leader carries it out), ``refused`` (not
    allowed), ``not_found``, ``conflict`` (wrong state) or ``invalid`` (a malformed argument, e.g.
    a reason above ``REASON_MAX``)."""

    status: Literal["ok", "accepted", "refused", "not_found", "conflict", "invalid"]
    message: str
    data: dict[str, Any] | None = None

    @property
    def ok(self) -> bool:
        return self.status == "ok"


def allowed(actor: str, approvers: tuple[str, ...]) -> bool:
    """The whole actor is on the allowlist (``slack:U123``, ``alice``), or the actor is
    ``<channel>:<name>`` for a known channel and ``<name>`` is (``cli:alice`` for ``alice``).
    ``mallory:alice`` is not ``alice``."""
    if actor in approvers:
        return True
    channel, sep, name = actor.partition(":")
    return bool(sep) and channel in CHANNELS and ":" not in name and name in approvers


def actor_problem(actor: object) -> str | None:
    """Why ``actor`` cannot name who gave a command, or ``None``. It is a bare name: the channel
    it came through is pitcrew's to record (``actor_of``), so a name holding ``:`` — ``slack:U0ALICE``
    sent over HTTP — is refused rather than passed off as a Slack user."""
    if not isinstance(actor, str) or not actor.strip():
        return 'say who you are: {"actor": "name"}'
    if len(actor) > ACTOR_MAX:
        return f"actor is longer than {ACTOR_MAX} characters"
    if not actor.isprintable():
        return "actor holds control or other unprintable characters"
    if ":" in actor:
        return (
            f"actor {actor.strip()[:40]!r} holds a ':': give the bare name; pitcrew records the channel "
            "the command came through (http:NAME, cli:NAME, slack:USER)"
        )
    return None


def actor_of(channel: str, name: str) -> str:
    """The actor pitcrew records: the channel it saw the command arrive on, and the bare name."""
    assert channel in CHANNELS, channel
    return f"{channel}:{name.strip()}"


def reason_problem(reason: object) -> str | None:
    """Why ``reason`` cannot be a command's free text (stored, audited, posted), or ``None``."""
    if not isinstance(reason, str):
        return "reason must be a string"
    if len(reason) > REASON_MAX:
        return f"reason is {len(reason)} characters; at most {REASON_MAX}"
    return None


class Commands:
    def __init__(
        self,
        engine: EngineControl,
        store: Store,
        metrics: Metrics,
        clock: Callable[[], datetime],
        mode: Mode,
        *,
        vouch: Callable[[str], Awaitable[bool]] | None = None,
        timer: Timer | None = None,
        rollback_wait: float = 20.0,
        leadership: Callable[[], dict[str, Any]] | None = None,
    ) -> None:
        #: Who leads the store and this process's role (``Leadership.describe``), for ``status``.
        self._leadership = leadership
        self._engine = engine
        self._timer = timer or RealTimer()
        #: How long a standby waits for the leader to carry out a rollback it recorded.
        self._rollback_wait = rollback_wait
        #: Approvers a channel knows beyond the allowlist (Slack's approver user group), asked only
        #: when the allowlist says no.
        self._vouch = vouch
        self._store = store
        self._metrics = metrics
        self._clock = clock
        self._mode = mode

    async def _audit(self, incident_id: str | None, kind: str, actor: str, detail: str, outcome: str) -> None:
        await self._store.record(
            incident_id, NewEvent(kind, actor=actor, outcome=outcome, detail=detail), self._clock()
        )

    async def decide(self, incident_id: str, actor: str, approve: bool) -> CommandResult:
        with self._engine.locks.command(incident_id) as mine:
            if not mine:
                return await self._busy(incident_id, "approve" if approve else "reject", actor)
            return await self._decide(incident_id, actor, approve)

    async def _busy(self, incident_id: str, verb: str, actor: str) -> CommandResult:
        detail = "another command on this incident is being carried out"
        await self._audit(incident_id, f"{verb}_refused", actor, detail, "conflict")
        return CommandResult("conflict", f"{incident_id}: {detail}; look again and retry if still needed")

    async def _decide(self, incident_id: str, actor: str, approve: bool) -> CommandResult:
        verb, decided_as = ("approve" if approve else "reject"), _DECIDED[approve]
        incident = await self._store.incident(incident_id)
        if incident is None:
            return CommandResult("not_found", f"no incident {incident_id}")
        if incident.state.terminal:
            await self._audit(
                incident_id, f"{verb}_refused", actor, f"incident is {incident.state}", "conflict"
            )
            return CommandResult("conflict", f"{incident_id} is {incident.state}; nothing to {verb}")
        approval = await self._store.approval(incident_id)
        if approval is None or approval.status != "pending":
            state = approval.status if approval else "none requested"
            await self._audit(
                incident_id, f"{verb}_refused", actor, f"no pending approval ({state})", "conflict"
            )
            return CommandResult("conflict", f"{incident_id} has no pending approval ({state})")
        if not allowed(actor, approval.approvers) and not (
            self._vouch is not None and await self._vouch(actor)
        ):
            self._metrics.approvals.labels("refused").inc()
            await self._audit(incident_id, f"{verb}_refused", actor, f"{actor} is not an approver", "refused")
            return CommandResult("refused", f"{actor} may not {verb} {incident_id}")
        decided = await self._store.decide_approval(incident_id, decided_as, actor, self._clock())
        if decided is None:  # another replica decided between our read and our write
            latest = await self._store.approval(incident_id)
            how = f"{latest.status} by {latest.decided_by}" if latest is not None else "gone"
            await self._audit(incident_id, f"{verb}_refused", actor, f"decided meanwhile ({how})", "conflict")
            return CommandResult("conflict", f"{incident_id} was decided meanwhile ({how})")
        self._metrics.approvals.labels(decided_as).inc()
        await self._audit(
            incident_id, decided_as, actor, f"{incident.playbook} {decided_as} by {actor}", "ok"
        )
        self._engine.signal(incident_id)
        return CommandResult("ok", f"{incident_id} {decided_as} by {actor}")

    async def approve(self, incident_id: str, actor: str) -> CommandResult:
        return await self.decide(incident_id, actor, approve=True)

    async def reject(self, incident_id: str, actor: str) -> CommandResult:
        return await self.decide(incident_id, actor, approve=False)

    async def rollback(self, incident_id: str, actor: str, *, force: bool = False) -> CommandResult:
        """Undo what pitcrew did. Held while paused (a rollback changes nodes too) unless ``force``,
        which is audited."""
        with self._engine.locks.command(incident_id) as mine:
            if not mine:
                return await self._busy(incident_id, "rollback", actor)
            return await self._rollback(incident_id, actor, force)

    async def _rollback(self, incident_id: str, actor: str, force: bool) -> CommandResult:
        incident = await self._store.incident(incident_id)
        if incident is None:
            return CommandResult("not_found", f"no incident {incident_id}")
        refusal = None
        record = (await self._store.steps_of(incident_id)).get(ROLLBACK)
        asked_again = again(incident.state, record)  # it kept a change: this one tries it again
        if incident.state in {State.ROLLED_BACK, State.SUPPRESSED} and not asked_again:
            refusal = f"incident is {incident.state}; nothing to roll back"
        elif record is not None and not asked_again:
            refusal = "a rollback of this incident is already under way"
        if refusal is not None:
            await self._audit(incident_id, "rollback_refused", actor, refusal, "conflict")
            return CommandResult("conflict", f"{incident_id}: {refusal}")
        pause = await self._store.switch(PAUSE)
        if pause is not None:
            why = f"pitcrew is paused by {pause.get('set_by')}: a rollback changes nodes too"
            if not force:
                await self._audit(incident_id, "rollback_refused", actor, why, "conflict")
                return CommandResult("conflict", f"{incident_id}: {why}; resume first, or force it")
            await self._audit(incident_id, "rollback_forced", actor, f"{why}; forced", "ok")
        if self._engine.leading:
            try:
                report = await self._engine.request_rollback(incident, actor, forced=pause is not None)
            except Deposed:  # another process took over meanwhile: it carries out the request
                return await self._rollback_by_leader(incident_id, actor, asked_again)
            if report is None:  # paused after it started: it goes on after resume
                return CommandResult(
                    "ok",
                    f"{incident_id}: rollback under way, held while pitcrew is paused; it goes on after resume",
                    {"report": [], "held": True},
                )
            return CommandResult("ok", f"{incident_id} rolled back by {actor}", {"report": report})
        return await self._rollback_by_leader(incident_id, actor, asked_again)

    async def _rollback_by_leader(self, incident_id: str, actor: str, asked_again: bool) -> CommandResult:
        """Record the request for the leader (once), then wait for its report."""
        await self._store.request_rollback(
            incident_id,
            codec.encode_record(RollbackRecord(actor)),
            NewEvent("rollback_requested", actor=actor, detail="recorded by a standby; the leader undoes"),
            self._clock(),
            again=asked_again,
        )
        waited, beat = 0.0, 0.2
        while True:
            record = (await self._store.steps_of(incident_id)).get(ROLLBACK)
            if record is not None and record.status == "ok":
                done = codec.decode_record(RollbackRecord, record.result)
                return CommandResult(
                    "ok", f"{incident_id} rolled back by {done.actor}", {"report": list(done.report)}
                )
            if waited >= self._rollback_wait:
                return CommandResult(
                    "accepted",
                    f"{incident_id}: rollback recorded; the leading pitcrew carries it out",
                    {"report": []},
                )
            await self._timer.sleep(beat)
            waited += beat

    async def pause(self, actor: str, reason: str = "") -> CommandResult:
        problem = reason_problem(reason)
        if problem is not None:
            return CommandResult("invalid", f"not paused: {problem}")
        now = self._clock()
        await self._store.set_switch(PAUSE, {"reason": reason}, actor, now)
        self._engine.wake()  # the leader's scan shows it (``pitcrew_paused``): here, if it leads
        await self._audit(None, "paused", actor, reason or "kill switch on", "ok")
        return CommandResult("ok", f"paused by {actor}: no node will be touched until resume")

    async def resume(self, actor: str) -> CommandResult:
        now = self._clock()
        await self._store.set_switch(PAUSE, None, actor, now)
        await self._audit(None, "resumed", actor, "kill switch off", "ok")
        self._engine.signal_all()
        return CommandResult("ok", f"resumed by {actor}")

    async def reset_breaker(self, actor: str) -> CommandResult:
        now = self._clock()
        state = await breaker_state(self._store)
        await self._store.set_switch(
            BREAKER, {"open": False, "reset_at": now.isoformat(), "reset_by": actor}, actor, now
        )
        self._engine.wake()  # the leader's scan shows it (``pitcrew_breaker_open``)
        detail = f"breaker reset (was {'open: ' + state.reason if state.open else 'closed'})"
        await self._audit(None, "breaker_reset", actor, detail, "ok")
        return CommandResult("ok", f"{detail} by {actor}; alerts older than the stale cutoff are skipped")

    async def status(self) -> dict[str, Any]:
        breaker = await breaker_state(self._store)
        pause = await self._store.switch(PAUSE)
        found = {
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
        if self._leadership is not None:
            found["leadership"] = self._leadership()
        return found
