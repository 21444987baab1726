"""Grafana behind the ``Annotator`` port: incident region annotations over the HTTP API.

``POST /api/annotations`` opens a region at the fault (tags ``pitcrew``, node, fault class,
playbook), ``PATCH /api/annotations/{id}`` sets its ``timeEnd`` at the close. The
service-account token is read from its file on every call, so a rotated Secret is picked up
without a restart, and never logged. No retry here: the caller (the outbox) retries with
backoff, so Grafana being down never blocks remediation.

Errors: unreachable, timeouts, 5xx and 429 are ``TransientError``; 401/403 (token),
400/404/422 (a request Grafana will never take) are ``PermanentError``.
"""

from __future__ import annotations

from datetime import datetime
from pathlib import Path
from typing import Any

import aiohttp

from bot.engine.errors import PermanentError, PitcrewError, TransientError
from bot.engine.ports import Probe, Region

_PERMANENT = {400: "bad_request", 401: "unauthorized", 403: "forbidden", 404: "not_found", 422: "invalid"}


def _ms(moment: datetime) -> int:
    """Grafana's annotation times: epoch milliseconds."""
    return int(moment.timestamp() * 1000)


class GrafanaAnnotations:
    def __init__(
        self,
        url: str,
        token_file: Path,
        *,
        timeout: float = 10.0,
        dashboard_uid: str | None = None,
    ) -> None:
        self._url = url.rstrip("/")
        self._token_file = token_file
        self._timeout = aiohttp.ClientTimeout(total=timeout)
        self._dashboard_uid = dashboard_uid
        self._session: aiohttp.ClientSession | None = None

    async def open_region(self, region: Region) -> int:
        body: dict[str, Any] = {
            "time": _ms(region.start),
            "tags": list(region.tags),
            "text": f"pitcrew {region.incident_id}: {region.summary or region.playbook} on {region.node}",
        }
        if self._dashboard_uid:
            body["dashboardUID"] = self._dashboard_uid
        answer = await self._call("POST", "/api/annotations", body, op="open_region")
        annotation_id = answer.get("id")
        if not isinstance(annotation_id, int) or isinstance(annotation_id, bool):
            raise PermanentError("Grafana answered without an annotation id", reason="bad_response")
        return annotation_id

    async def close_region(self, annotation_id: int, end: datetime) -> None:
        await self._call(
            "PATCH", f"/api/annotations/{annotation_id}", {"timeEnd": _ms(end)}, op="close_region"
        )

    async def probe(self) -> Probe:
        """Reachable (``/api/health``), the token valid and allowed to read annotations."""
        try:
            health = await self._call("GET", "/api/health", None, op="health", auth=False)
            await self._call("GET", "/api/annotations?limit=1&tags=pitcrew", None, op="probe")
        except PitcrewError as exc:
            missing = {"unauthorized": ("a valid service-account token",), "forbidden": ("annotations:read",)}
            return Probe("grafana", False, str(exc), missing.get(exc.reason, ()))
        version = health.get("version", "?")
        return Probe("grafana", True, f"Grafana {version} at {self._url}: token accepted")

    async def aclose(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    def _token(self) -> str:
        try:
            token = self._token_file.read_text().strip()
        except OSError as exc:
            raise PermanentError(
                f"cannot read grafana.token_file: {exc.strerror}", reason="no_token"
            ) from exc
        if not token:
            raise PermanentError("grafana.token_file is empty", reason="no_token")
        return token

    async def _call(
        self, method: str, path: str, body: dict[str, Any] | None, *, op: str, auth: bool = True
    ) -> dict[str, Any]:
        headers = {"Accept": "application/json"}
        if auth:
            headers["Authorization"] = f"Bearer {self._token()}"
        if self._session is None:
            self._session = aiohttp.ClientSession(timeout=self._timeout)
        try:
            async with self._session.request(
                method, self._url + path, json=body, headers=headers
            ) as response:
                status = response.status
                try:
                    payload = await response.json(content_type=None)
                except (ValueError, aiohttp.ContentTypeError):
                    payload = None
        except TimeoutError as exc:
            raise TransientError(f"Grafana {op} timed out", reason="timeout") from exc
        except aiohttp.ClientError as exc:
            raise TransientError(
                f"Grafana unreachable ({op}): {type(exc).__name__}", reason="unreachable"
            ) from exc
        message = payload.get("message", "") if isinstance(payload, dict) else ""
        if status in _PERMANENT:
            raise PermanentError(
                f"Grafana refused {op}: HTTP {status} {message}".strip(), reason=_PERMANENT[status]
            )
        if status == 429 or status >= 500:
            reason = "rate_limited" if status == 429 else "unavailable"
            raise TransientError(f"Grafana {op}: HTTP {status} {message}".strip(), reason=reason)
        if not 200 <= status < 300:
            raise PermanentError(f"Grafana {op}: unexpected HTTP {status}", reason="unexpected")
        return payload if isinstance(payload, dict) else {}
