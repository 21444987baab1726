"""Buttons and ``/pitcrew`` from Slack, through slack-bolt's ``AsyncApp``, over HTTP or Socket Mode.

bolt verifies signatures (HTTP), acks within 3 s and routes actions; this module only says what
each action means. Every decision calls the engine's ``Commands`` with the actor
``slack:<user id>``, so Slack, the CLI and the HTTP API behave the same and every click lands in
the audit log. Authorisation (``Approvers``): anyone else is told politely, and the attempt is
audited (Commands audits refused approvals; refused rollbacks and switches are audited here), so
the thread shows it too. Answers to the clicker are ephemeral; the thread and the parent change
through the outbox, like every other message.

HTTP mode: ``handle_http`` is mounted at ``POST /slack/events`` by the composition root. Before
bolt sees a request, a bad or stale signature is answered 401 and a body that is neither an
interactive payload nor a slash command 400, so nothing reaches the engine. Socket Mode:
``SocketMode`` runs bolt's aiohttp Socket Mode handler (``apps.connections.open`` with the
app-level token, reconnects on ``disconnect``), as a background worker.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Callable
from datetime import datetime
from typing import Any
from urllib.parse import parse_qs

from aiohttp import web
from slack_bolt.adapter.aiohttp import to_aiohttp_response
from slack_bolt.adapter.socket_mode.aiohttp import AsyncSocketModeHandler
from slack_bolt.app.async_app import AsyncApp
from slack_bolt.request.async_request import AsyncBoltRequest
from slack_sdk.signature import SignatureVerifier
from slack_sdk.web.async_client import AsyncWebClient

from bot import logger
from bot.engine.backoff import Backoff
from bot.engine.commands import CommandResult, Commands
from bot.engine.errors import PitcrewError
from bot.integrations.slack.approvers import SLACK, Approvers
from bot.integrations.slack.errors import call
from bot.integrations.slack.messages import APPROVE, REJECT, ROLLBACK
from bot.store.base import NewEvent, Store

log = logger(__name__)

HELP = (
    "*/pitcrew* — answers only you see.\n"
    "• `status` — mode, pause, breaker · `status <node|incident>` — one incident\n"
    "• `approve <id>` · `reject <id>` · `rollback <id>` — decide on an incident (approvers only)\n"
    "• `pause [reason]` · `resume` — the kill switch (approvers only)\n"
    "• `breaker reset` — close the circuit breaker (approvers only)\n"
    "• `help` — this text"
)
#: How long a slash command may work before its ack; the rest is answered later, ephemerally.
_ACK_BUDGET = 2.0
_MAX_BODY = 64 * 1024


class SlackInbound:
    def __init__(
        self,
        client: AsyncWebClient,
        commands: Commands,
        store: Store,
        approvers: Approvers,
        clock: Callable[[], datetime],
        *,
        channel: str,
        signing_secret: str | None,
    ) -> None:
        self._client = client
        self._commands = commands
        self._store = store
        self._approvers = approvers
        self._clock = clock
        self._channel = channel
        self._verifier = SignatureVerifier(signing_secret) if signing_secret else None
        self.app = AsyncApp(
            client=client,
            signing_secret=signing_secret or "socket-mode-requests-are-not-signed",
            request_verification_enabled=signing_secret is not None,
            process_before_response=False,
        )
        for action_id, verb in ((APPROVE, "approve"), (REJECT, "reject"), (ROLLBACK, "rollback")):
            self.app.action(action_id)(self._button(verb))
        self.app.command("/pitcrew")(self._slash)

    # ------------------------------------------------------------------ HTTP mode
    async def handle_http(self, request: web.Request) -> web.Response:
        if self._verifier is None:
            return web.json_response({"error": "Slack HTTP mode is not configured"}, status=404)
        if request.content_length is not None and request.content_length > _MAX_BODY:
            return web.json_response({"error": "body too large"}, status=413)
        body = await request.read()
        if not self._verifier.is_valid_request(body, dict(request.headers)):
            return web.json_response({"error": "invalid or stale Slack signature"}, status=401)
        try:
            text = body.decode()
            problem = _malformed(text)
        except UnicodeDecodeError:
            problem = "body is not UTF-8"
        if problem is not None:
            return web.json_response({"error": problem}, status=400)
        bolt = AsyncBoltRequest(body=text, query=request.query_string, headers=dict(request.headers))
        return await to_aiohttp_response(await self.app.async_dispatch(bolt))

    # ------------------------------------------------------------------ buttons
    def _button(self, verb: str) -> Callable[..., Any]:
        async def clicked(ack: Any, body: dict[str, Any], action: dict[str, Any]) -> None:
            await ack()
            user = str((body.get("user") or {}).get("id", ""))
            incident_id = str(action.get("value", ""))
            channel = str((body.get("channel") or {}).get("id", self._channel))
            answer = await self.decide(verb, incident_id, user)
            await self._tell(channel, user, answer)

        return clicked

    async def decide(self, verb: str, incident_id: str, user: str) -> str:
        """One decision by a Slack user, as the engine's commands carry it out; the answer for them."""
        actor = f"{SLACK}{user}"
        if not user or not incident_id:
            return "That click did not say who or which incident; nothing was done."
        allowed = await self._approvers.allows(user)
        if verb == "approve":
            if allowed:
                waiting = await self._second_vote(incident_id, actor)
                if waiting is not None:
                    return waiting
            return _answer(await self._commands.approve(incident_id, actor), user, verb, incident_id)
        if verb == "reject":
            return _answer(await self._commands.reject(incident_id, actor), user, verb, incident_id)
        if not allowed:
            await self._refused(incident_id, f"{verb}_refused", actor)
            return _polite(user, verb, incident_id)
        return _answer(await self._commands.rollback(incident_id, actor), user, verb, incident_id)

    async def _second_vote(self, incident_id: str, actor: str) -> str | None:
        """Under the two-approver rule, the first approval is a vote; ``None`` once it may go ahead."""
        incident = await self._store.incident(incident_id)
        approval = await self._store.approval(incident_id)
        if incident is None or approval is None or approval.status != "pending":
            return None  # Commands says why not
        if not await self._approvers.second_needed(incident):
            return None
        votes = await self._approvers.earlier_votes(incident, approval.requested_at)
        if votes - {actor}:
            return None  # a different approver already voted: this is the second
        if actor in votes:
            return f"You already approved {incident_id}; a second, different approver must approve too."
        await self._store.record(
            incident_id,
            NewEvent(
                "approval_vote",
                actor=actor,
                outcome="ok",
                detail="first of two approvals: the fleet would pass the two-approver threshold",
            ),
            self._clock(),
        )
        return f"Your approval of {incident_id} is recorded; a second, different approver must approve too."

    async def _refused(self, incident_id: str | None, kind: str, actor: str) -> None:
        await self._store.record(
            incident_id,
            NewEvent(kind, actor=actor, outcome="refused", detail=f"{actor} is not a Slack approver"),
            self._clock(),
        )

    async def _tell(self, channel: str, user: str, text: str) -> None:
        try:
            await call(self._client.chat_postEphemeral(channel=channel, user=user, text=text))
        except PitcrewError as exc:  # the decision stands and is audited; only the echo is lost
            log.warning("ephemeral answer not delivered", extra={"reason": exc.reason})

    # ------------------------------------------------------------------ /pitcrew
    async def _slash(self, ack: Any, command: dict[str, Any]) -> None:
        user = str(command.get("user_id", ""))
        channel = str(command.get("channel_id", self._channel))
        work = asyncio.ensure_future(self.slash(str(command.get("text", "")), user))
        done, _ = await asyncio.wait({work}, timeout=_ACK_BUDGET)
        if done:
            await ack(text=work.result(), response_type="ephemeral")
            return
        await ack(text="Working on it; the answer follows here.", response_type="ephemeral")
        await self._tell(channel, user, await work)

    async def slash(self, text: str, user: str) -> str:
        words = text.split()
        verb = words[0].lower() if words else "help"
        rest = words[1:]
        if verb == "status":
            return await self._status(rest[0] if rest else None)
        if verb in {"approve", "reject", "rollback"}:
            if len(rest) != 1:
                return f"Usage: `/pitcrew {verb} <incident id>`"
            return await self.decide(verb, rest[0], user)
        if verb in {"pause", "resume"} or (verb == "breaker" and rest[:1] == ["reset"]):
            actor = f"{SLACK}{user}"
            name = "breaker_reset" if verb == "breaker" else verb
            if not await self._approvers.allows(user):
                await self._refused(None, f"{name}_refused", actor)
                return _polite(user, name.replace("_", " "), None)
            if verb == "pause":
                result = await self._commands.pause(actor, " ".join(rest))
            elif verb == "resume":
                result = await self._commands.resume(actor)
            else:
                result = await self._commands.reset_breaker(actor)
            return result.message
        return HELP

    async def _status(self, target: str | None) -> str:
        if target is None:
            status = await self._commands.status()
            breaker = status["breaker"]
            paused = f"paused by {status['paused_by']}" if status["paused"] else "not paused"
            open_ = f"open: {breaker['reason']}" if breaker["open"] else "closed"
            return f"mode *{status['mode']}* · {paused} · breaker {open_}"
        incident = await self._store.incident(target)
        if incident is None:
            found = await self._store.incidents(node=target, limit=1)
            incident = found[0] if found else None
        if incident is None:
            return f"No incident or node called {target[:100]}."
        plan = incident.plan
        step = plan.steps[incident.step_index] if plan and incident.step_index < len(plan.steps) else "-"
        return (
            f"*{incident.id}* on {incident.node}: {incident.state.value}"
            f" · playbook {incident.playbook or '-'} · step {step}"
            f"{' · ' + incident.outcome if incident.outcome else ''}\n"
            f"Full timeline: `pitcrew incidents show {incident.id}`"
        )


class SocketMode:
    """bolt's Socket Mode handler as a background worker (``start``/``stop``).

    Connecting must never hold up pitcrew's start: Slack being down cannot stop remediation. The
    first connection is made in the background (slack_sdk's client retries it every ping interval
    until it succeeds, and reconnects by itself later, also on ``disconnect`` frames); should it
    give up with an error, it is tried again here with the one backoff policy (``bot.engine.backoff``)."""

    def __init__(self, inbound: SlackInbound, app_token: str, *, backoff_max: float = 60.0) -> None:
        self._app = inbound.app
        self._app_token = app_token
        self._backoff_max = backoff_max
        self._handler: AsyncSocketModeHandler | None = None
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        # Built here, on the running loop: its aiohttp session cannot be made outside one (and
        # ``pitcrew serve`` builds the app before the loop runs).
        self._handler = AsyncSocketModeHandler(self._app, self._app_token)
        self._task = asyncio.create_task(self._connect(self._handler), name="pitcrew-slack-socket-mode")

    async def _connect(self, handler: AsyncSocketModeHandler) -> None:
        backoff = Backoff(1.0, max(self._backoff_max, 1.0))
        failures = 0
        while True:
            try:
                await handler.connect_async()  # type: ignore[no-untyped-call]
            except Exception as exc:
                failures += 1
                delay = backoff.delay(failures)
                log.warning(
                    "Slack Socket Mode not connected; will retry",
                    extra={"reason": type(exc).__name__, "retry_in": delay},
                )
                await asyncio.sleep(delay)
            else:
                log.info("Slack Socket Mode connected")
                return

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        if self._handler is not None:
            await self._handler.close_async()  # type: ignore[no-untyped-call]
            self._handler = None


def _malformed(text: str) -> str | None:
    """Why a signed body is neither an interactive payload nor a slash command, or ``None``."""
    fields = parse_qs(text, keep_blank_values=True)
    if "payload" in fields:
        try:
            payload = json.loads(fields["payload"][0])
        except ValueError:
            return "payload is not JSON"
        if not isinstance(payload, dict) or not isinstance(payload.get("type"), str):
            return "payload is not an interactive payload (no type)"
        if payload["type"] == "block_actions" and not (
            isinstance(payload.get("user"), dict) and isinstance(payload.get("actions"), list)
        ):
            return "block_actions payload without user or actions"
        return None
    if "command" in fields and "user_id" in fields:
        return None
    return "neither an interactive payload nor a slash command"


def _answer(result: CommandResult, user: str, verb: str, incident_id: str) -> str:
    if result.status == "refused":
        return _polite(user, verb, incident_id)
    return result.message


def _polite(user: str, verb: str, incident_id: str | None) -> str:
    what = f"{verb} {incident_id}" if incident_id else verb
    return (
        f"Sorry <@{user}>, only pitcrew's approvers may {what}, so nothing was done. "
        "Your attempt is recorded in the incident's audit log; please ask an approver."
    )
