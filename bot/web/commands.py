"""The command API: the same engine commands Slack and the CLI use, behind the admin token.

``POST /api/v1/incidents/{id}/approve|reject|rollback``, ``POST /api/v1/pause``,
``/api/v1/resume``, ``/api/v1/breaker/reset`` with a JSON body ``{"actor": "...", "reason":
"..."}`` (a rollback while paused needs ``"force": true``, and is audited as forced); ``GET
/api/v1/status``. Without ``server.auth.admin_token_file`` the API is off.

The actor audited is ``http:<actor>``, or ``cli:<actor>`` when pitcrew's own CLI says it is the
caller (header ``Pitcrew-Client: cli``): the channel is pitcrew's to record, so a body's actor is a
bare name, and no HTTP caller can pass itself off as a Slack user. Bodies are bounded: at most
``BODY_MAX`` bytes, ``REASON_MAX`` characters of reason, and nesting as deep as the JSON parser's
recursion limit (a 400, as the webhook answers).
"""

from __future__ import annotations

from typing import Any, Protocol

import pydantic_core
from aiohttp import web

from bot.engine.commands import CommandResult, actor_of, actor_problem, reason_problem
from bot.web import auth

#: Largest command body: an actor, a reason and a flag fit many times over.
BODY_MAX = 16 * 1024
#: The header pitcrew's CLI sends; both channels need the admin token, this only says which tool.
CLIENT_HEADER = "Pitcrew-Client"
_STATUS = {"ok": 200, "accepted": 202, "refused": 403, "not_found": 404, "conflict": 409, "invalid": 400}


class CommandSurface(Protocol):
    async def approve(self, incident_id: str, actor: str) -> CommandResult: ...
    async def reject(self, incident_id: str, actor: str) -> CommandResult: ...
    async def rollback(self, incident_id: str, actor: str, *, force: bool = False) -> CommandResult: ...
    async def pause(self, actor: str, reason: str = "") -> CommandResult: ...
    async def resume(self, actor: str) -> CommandResult: ...
    async def reset_breaker(self, actor: str) -> CommandResult: ...
    async def status(self) -> dict[str, Any]: ...


def add_command_routes(app: web.Application, key: Any) -> None:
    async def surface(
        request: web.Request,
    ) -> tuple[CommandSurface | None, dict[str, Any], web.Response | None]:
        deps = request.app[key]
        if deps.commands is None or not deps.admin_credentials.required:
            return (
                None,
                {},
                web.json_response(
                    {"error": "command API disabled: set server.auth.admin_token_file"}, status=403
                ),
            )
        denied = auth.check(request, deps.admin_credentials)
        if denied is not None:
            return None, {}, denied
        body: dict[str, Any] = {}
        too_large = _error(413, f"command body above {BODY_MAX} bytes")
        if request.content_length is not None and request.content_length > BODY_MAX:
            return None, {}, too_large
        if request.can_read_body:
            try:
                raw = await request.read()
            except web.HTTPRequestEntityTooLarge:
                return None, {}, too_large
            if len(raw) > BODY_MAX:
                return None, {}, too_large
            try:
                # pydantic-core bounds nesting (the webhook's parser too); json.loads would recurse
                # until RecursionError, a 500.
                parsed = pydantic_core.from_json(raw or b"{}")
            except ValueError as exc:
                return None, {}, _error(400, f"body must be JSON: {str(exc)[:120]}")
            if not isinstance(parsed, dict):
                return None, {}, _error(400, "body must be a JSON object")
            body = parsed
        problem = actor_problem(body.get("actor"))
        if request.method == "POST" and problem is not None:
            return None, {}, _error(400, problem)
        if "force" in body and not isinstance(body["force"], bool):
            return None, {}, _error(400, "force must be true or false")
        problem = reason_problem(body.get("reason", ""))
        if problem is not None:
            return None, {}, _error(400, problem)
        if request.method == "POST":
            channel = "cli" if request.headers.get(CLIENT_HEADER, "").strip().lower() == "cli" else "http"
            body["actor"] = actor_of(channel, body["actor"])
        return deps.commands, body, None

    def answer(result: CommandResult) -> web.Response:
        return web.json_response(
            {"status": result.status, "message": result.message, **(result.data or {})},
            status=_STATUS.get(result.status, 400),
        )

    async def incident_command(request: web.Request) -> web.Response:
        commands, body, error = await surface(request)
        if error is not None or commands is None:
            return error or web.json_response({"error": "unavailable"}, status=503)
        incident_id, verb, actor = (
            request.match_info["incident_id"],
            request.match_info["verb"],
            body["actor"],
        )
        if verb == "rollback":
            return answer(await commands.rollback(incident_id, actor, force=bool(body.get("force", False))))
        action = commands.approve if verb == "approve" else commands.reject
        return answer(await action(incident_id, actor))

    async def switch_command(request: web.Request) -> web.Response:
        commands, body, error = await surface(request)
        if error is not None or commands is None:
            return error or web.json_response({"error": "unavailable"}, status=503)
        actor, verb = body["actor"], request.match_info["verb"]
        if verb == "pause":
            return answer(await commands.pause(actor, body.get("reason", "")))
        if verb == "resume":
            return answer(await commands.resume(actor))
        return answer(await commands.reset_breaker(actor))

    async def status(request: web.Request) -> web.Response:
        commands, _, error = await surface(request)
        if error is not None or commands is None:
            return error or web.json_response({"error": "unavailable"}, status=503)
        return web.json_response(await commands.status())

    app.router.add_post(r"/api/v1/incidents/{incident_id}/{verb:approve|reject|rollback}", incident_command)
    app.router.add_post(r"/api/v1/{verb:pause|resume}", switch_command)
    app.router.add_post(r"/api/v1/breaker/{verb:reset}", switch_command)
    app.router.add_get("/api/v1/status", status)


def _error(status: int, message: str) -> web.Response:
    return web.json_response({"error": message}, status=status)
