"""The command API: the same engine commands Slack and the CLI use, behind the admin token.

``POST /api/v1/incidents/{id}/approve|reject|rollback``, ``POST /api/v1/pause``,
``/api/v1/resume``, ``/api/v1/breaker/reset`` with a JSON body ``{"actor": "...", "reason":
"..."}`` (a rollback while paused needs ``"force": true``, and is audited as forced); ``GET /api/v1/status``. Without ``server.auth.admin_token_file`` the API is off.
"""

from __future__ import annotations

import json
from typing import Any, Protocol

from aiohttp import web

from bot.engine.commands import CommandResult, actor_problem
from bot.web import auth

_STATUS = {"ok": 200, "accepted": 202, "refused": 403, "not_found": 404, "conflict": 409}


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
        if request.can_read_body:
            try:
                parsed = json.loads(await request.read() or b"{}")
            except (ValueError, UnicodeDecodeError):
                return None, {}, web.json_response({"error": "body must be JSON"}, status=400)
            if not isinstance(parsed, dict):
                return None, {}, web.json_response({"error": "body must be a JSON object"}, status=400)
            body = parsed
        problem = actor_problem(body.get("actor"))
        if request.method == "POST" and problem is not None:
            return None, {}, web.json_response({"error": problem}, status=400)
        if "force" in body and not isinstance(body["force"], bool):
            return None, {}, web.json_response({"error": "force must be true or false"}, status=400)
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
            body["actor"].strip(),
        )
        if verb == "rollback":
            return answer(await commands.rollback(incident_id, actor, force=bool(body.get("force", False))))
        action = commands.approve if verb == "approve" else commands.reject
        return answer(await action(incident_id, actor))

    async def switch_command(request: web.Request) -> web.Response:
        commands, body, error = await surface(request)
        if error is not None or commands is None:
            return error or web.json_response({"error": "unavailable"}, status=503)
        actor, verb = body["actor"].strip(), request.match_info["verb"]
        if verb == "pause":
            return answer(await commands.pause(actor, str(body.get("reason", ""))))
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
