"""Buttons and ``/pitcrew`` from Slack, through slack-bolt's ``AsyncApp``, over HTTP or Socket Mode.

bolt acks within 3 s and routes actions; this module only says what
each action means. Every decision calls the engine's ``Commands`` with the actor
``slack:<user id>``, so Slack, the CLI and the HTTP API behave the same and every click lands in
the audit log. Authorisation (``Approvers``): anyone else is told politely, and the attempt is
audited (Commands audits refused approvals; refused rollbacks and switches are audited here), so
the thread shows it too. Answers to the clicker are ephemeral; the thread and the parent change
through the outbox, like every other message.

HTTP mode: ``handle_http`` is mounted at ``POST /slack/events`` by the composition root. Before
bolt sees a request it is checked here (``SlackSignature``): a timestamp that is not a whole
number of seconds or is older than 5 minutes, a signature that is not Slack's, a body that is not
UTF-8, or a signed request seen before (a replay within Slack's 5-minute window) is answered 401
and logged in one line, never a traceback; a body that is neither an interactive payload nor a
slash command 400, so nothing reaches the engine. Slack's unsigned ``ssl_check=1`` probe goes to
bolt, whose ssl-check middleware answers it 200 before any signature check, as for any bolt app.
A slash command answered after its 2 s budget is answered through its ``response_url`` (bolt's
``respond``): that reaches the user in a DM or a channel the bot is not in, where
``chat.postEphemeral`` cannot. Socket Mode
is ``bot.integrations.slack.socket``.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable
from datetime import datetime
from typing import Any
from urllib.parse import parse_qs

from aiohttp import web
from slack_bolt.adapter.aiohttp import to_aiohttp_response
from slack_bolt.app.async_app import AsyncApp
from slack_bolt.request.async_request import AsyncBoltRequest
from slack_sdk.web.async_client import AsyncWebClient

from bot import logger
from bot.engine.commands import CommandResult, Commands
from bot.engine.errors import PitcrewError
from bot.integrations.slack.approvers import SLACK, Approvers
from bot.integrations.slack.errors import call
from bot.integrations.slack.messages import APPROVE, REJECT, ROLLBACK, Mrkdwn, escape, mention
from bot.integrations.slack.signature import SlackSignature
from bot.store.base import NewEvent, Store, StoreUnavailable

log = logger(__name__)

#: mrkdwn: ``&lt;id&gt;`` shows as ``<id>`` (a bare ``<id>`` is a link to nowhere, labelled "id").
HELP = (
    "*/pitcrew* — answers only you see.\n"
    "• `status` — mode, pause, breaker, whether you may decide · `status &lt;node|incident&gt;` — one incident\n"
    "• `approve &lt;id&gt;` · `reject &lt;id&gt;` · `rollback &lt;id&gt;` — decide on an incident (approvers only)\n"
    "• `pause [reason]` · `resume` — the kill switch (approvers only)\n"
    "• `breaker reset` — close the circuit breaker (approvers only)\n"
    "• `help` — this text"
)
#: How long a slash command may work before its ack, from the request's arrival (over HTTP; from
#: the listener's start over Socket Mode); the rest is answered later, ephemerally. Slack's 3 s
#: count from its sending, and bolt's from the dispatch: its middleware (``auth.test`` on the
#: first request) comes out of the same 3 s.
_ACK_BUDGET = 2.0
#: The Bolt request context's key for when an HTTP request arrived (``time.monotonic``).
_ARRIVED = "pitcrew_arrived"
#: The largest request taken from Slack. A click carries the whole message it was made on, every
#: byte beyond ASCII's letters form-encoded as ``%XX``: a parent at ``messages.BLOCKS_TEXT`` in a
#: script of three- and four-byte characters is about 100 KB (64 KiB refused such clicks).
_MAX_BODY = 512 * 1024


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
        self._signature = SlackSignature(signing_secret) if signing_secret else None
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
        if self._signature is None:
            return web.json_response({"error": "Slack HTTP mode is not configured"}, status=404)
        if request.content_length is not None and request.content_length > _MAX_BODY:
            return web.json_response({"error": "body too large"}, status=413)
        body = await request.read()
        if _ssl_check(body):  # unsigned by design: bolt's ssl-check middleware answers it
            return await self._dispatch(request, body.decode())
        refused = self._signature.refusal(
            body,
            request.headers.get("X-Slack-Request-Timestamp", ""),
            request.headers.get("X-Slack-Signature", ""),
        )
        if refused is not None:
            log.info("Slack request refused: %s", refused, extra={"reason": "slack_signature"})
            return web.json_response({"error": f"not a request from Slack: {refused}"}, status=401)
        text = body.decode()
        problem = _malformed(text)
        if problem is not None:
            return web.json_response({"error": problem}, status=400)
        return await self._dispatch(request, text)

    async def _dispatch(self, request: web.Request, text: str) -> web.Response:
        bolt = AsyncBoltRequest(
            body=text,
            query=request.query_string,
            headers=dict(request.headers),
            context={_ARRIVED: time.monotonic()},
        )
        return await to_aiohttp_response(await self.app.async_dispatch(bolt))

    # ------------------------------------------------------------------ buttons
    def _button(self, verb: str) -> Callable[..., Any]:
        async def clicked(ack: Any, body: dict[str, Any], action: dict[str, Any], respond: Any) -> None:
            await ack()
            user = str((body.get("user") or {}).get("id", ""))
            incident_id = str(action.get("value", ""))
            channel = str((body.get("channel") or {}).get("id", self._channel))
            answer = await _or_away(self.decide(verb, incident_id, user))
            await self._tell(channel, user, answer, respond if body.get("response_url") else None)

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
            return (
                f"You already approved {escape(incident_id)}; a second, different approver must approve too."
            )
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
        return f"Your approval of {escape(incident_id)} is recorded; a second, different approver must approve too."

    async def _refused(self, incident_id: str | None, kind: str, actor: str) -> None:
        await self._store.record(
            incident_id,
            NewEvent(kind, actor=actor, outcome="refused", detail=f"{actor} is not a Slack approver"),
            self._clock(),
        )

    async def _tell(self, channel: str, user: str, text: str, respond: Any = None) -> None:
        """The clicker's answer, seen by them alone: through the click's ``response_url`` (it reaches
        a person reading a public channel they have not joined, where ``chat.postEphemeral``
        answers ``user_not_in_channel``), ephemeral and never replacing the message clicked (the
        incident's parent); else, or if that fails, ``chat.postEphemeral``."""
        if respond is not None:
            try:
                sent = await respond(text=text, response_type="ephemeral", replace_original=False)
            except Exception as exc:  # any failure falls back to the Web API below
                log.warning(
                    "click answer not delivered at its response_url", extra={"reason": type(exc).__name__}
                )
            else:
                if getattr(sent, "status_code", 200) == 200:
                    return
                log.warning(
                    "click answer refused at its response_url", extra={"reason": f"HTTP {sent.status_code}"}
                )
        try:
            await call(self._client.chat_postEphemeral(channel=channel, user=user, text=text))
        except PitcrewError as exc:  # the decision stands and is audited; only the echo is lost
            log.warning("ephemeral answer not delivered", extra={"reason": exc.reason})

    # ------------------------------------------------------------------ /pitcrew
    async def _slash(self, ack: Any, respond: Any, command: dict[str, Any], context: Any) -> None:
        user = str(command.get("user_id", ""))
        work = asyncio.ensure_future(_or_away(self.slash(str(command.get("text", "")), user)))
        arrived = context.get(_ARRIVED) if context is not None else None
        budget = _ACK_BUDGET if arrived is None else max(0.0, _ACK_BUDGET - (time.monotonic() - arrived))
        done, _ = await asyncio.wait({work}, timeout=budget)
        if done:
            await ack(text=work.result(), response_type="ephemeral")
            return
        await ack(text="Working on it; the answer follows here.", response_type="ephemeral")
        answer = await work
        # The command's response_url reaches the user wherever they typed it (a DM, a channel
        # without the bot), for 30 minutes; chat.postEphemeral would need the bot in the channel.
        try:
            sent = await respond(text=answer, response_type="ephemeral")
        except Exception as exc:  # the command was carried out and audited; only the answer is lost
            log.warning("slash command answer not delivered", extra={"reason": type(exc).__name__})
            return
        if getattr(sent, "status_code", 200) != 200:
            log.warning("slash command answer refused", extra={"reason": f"HTTP {sent.status_code}"})

    async def slash(self, text: str, user: str) -> str:
        words = text.split()
        verb = words[0].lower() if words else "help"
        rest = words[1:]
        if verb == "status":
            return await self._status(rest[0] if rest else None, user)
        if verb in {"approve", "reject", "rollback"}:
            if len(rest) != 1:
                return f"Usage: `/pitcrew {verb} &lt;incident id&gt;`"
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
            return escape(result.message)
        return HELP

    async def _status(self, target: str | None, user: str) -> str:
        if target is None:
            status = await self._commands.status()
            breaker = status["breaker"]
            paused = f"paused by {status['paused_by']}" if status["paused"] else "not paused"
            open_ = f"open: {breaker['reason']}" if breaker["open"] else "closed"
            # Whether the caller may decide: the one thing a person asking from Slack cannot see.
            may = "you may decide" if await self._approvers.allows(user) else "you are not an approver"
            return (
                f"mode *{escape(str(status['mode']))}* · {escape(paused)} · breaker {escape(open_)} · {may}"
            )
        incident = await self._store.incident(target)
        if incident is None:
            found = await self._store.incidents(node=target, limit=1)
            incident = found[0] if found else None
        if incident is None:
            return f"No incident or node called {escape(target[:100])}."
        plan = incident.plan
        step = plan.steps[incident.step_index] if plan and incident.step_index < len(plan.steps) else "-"
        return (
            f"*{escape(incident.id)}* on {escape(incident.node)}: {incident.state.value}"
            f" · playbook {escape(incident.playbook or '-')} · step {escape(step)}"
            f"{' · ' + escape(incident.outcome) if incident.outcome else ''}\n"
            f"Full timeline: `pitcrew incidents show {escape(incident.id)}`"
        )


#: The answer to a person whose click or command found the store away (Postgres restarting,
#: failing over, not reached yet): the click was acknowledged, so Slack shows nothing else.
STORE_AWAY = (
    "pitcrew cannot reach its store right now (a database restart or failover), so this was not "
    "confirmed. Try again in a minute: a decision already recorded is kept, and nothing is done twice."
)


async def _or_away(work: Awaitable[str]) -> str:
    """``work``'s answer for the person, or ``STORE_AWAY``: before, the click went unanswered and
    the slash command failed in Slack with its own error."""
    try:
        return await work
    except StoreUnavailable as exc:
        log.warning("a Slack request found the store away", extra={"reason": str(exc)})
        return STORE_AWAY


def _ssl_check(body: bytes) -> bool:
    """Slack's unsigned ``ssl_check=1`` probe of a slash command's URL (bolt's ``SslCheck``)."""
    try:
        fields = parse_qs(body.decode(), keep_blank_values=True)
    except UnicodeDecodeError:
        return False
    return fields.get("ssl_check") == ["1"] and "payload" not in fields and "command" not in fields


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


def _answer(result: CommandResult, user: str, verb: str, incident_id: str) -> Mrkdwn:
    if result.status == "refused":
        return _polite(user, verb, incident_id)
    return escape(result.message)


def _polite(user: str, verb: str, incident_id: str | None) -> Mrkdwn:
    what = f"{verb} {incident_id}" if incident_id else verb
    return Mrkdwn(
        f"Sorry {mention(user)}, only pitcrew's approvers may {escape(what)}, so nothing was done. "
        "Your attempt is recorded in the incident's audit log; please ask an approver."
    )
