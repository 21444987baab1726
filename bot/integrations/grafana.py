"""Grafana behind the ``Annotator`` port: incident region annotations over the HTTP API.

``POST /api/annotations`` opens a region at the fault (tags ``pitcrew``, node, fault class,
playbook, ``incident:<id>``), ``PATCH /api/annotations/{id}`` sets its ``timeEnd`` (and the
outcome in its text) at the close. The service-account token is read from its file on every
call, so a rotated Secret is picked up without a restart, and never logged. No retry here: the
outbox (``GrafanaDestination``, delivered by ``bot.engine.outbox.OutboxSender``) retries with
backoff, so Grafana being down never blocks remediation.

Errors: unreachable, timeouts, 5xx and 429 are ``TransientError``; 401/403 (token),
400/404/422 (a request Grafana will never take) are ``PermanentError``.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import aiohttp

from bot.engine.errors import PermanentError, PitcrewError, Reason, TransientError
from bot.engine.outbox import create_once
from bot.engine.ports import Annotator, Probe, Region, incident_tag
from bot.integrations.fenced import READS, traces
from bot.store.base import IncidentRecord, OutboxItem, Store, incident_ref
from bot.store.lease import Fence

#: The outbox destination's name; its rows are the incidents' ``state`` events (``EVENTS``).
NAME = "grafana"
#: Timeline events routed to Grafana (``SqliteStore.route_events``): the first opens the region,
#: the one into a terminal state closes it.
EVENTS = frozenset({"state"})

_PERMANENT = {
    400: Reason.INVALID_REQUEST,
    401: Reason.UNAUTHORIZED,
    403: Reason.FORBIDDEN,
    404: Reason.NOT_FOUND,
    422: Reason.INVALID_REQUEST,
}


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
        fence: Fence | None = None,
    ) -> None:
        self._url = url.rstrip("/")
        #: The outbox's adapter asks it before every call that changes Grafana, as the Slack
        #: outbox's client does (``bot.integrations.slack.FencedWebClient``): a leader woken past its
        #: lease in the middle of a delivery sends no more of it; asked again once the connection
        #: is held, just before the request is written (``bot.integrations.fenced``).
        #: (``check-config --live`` has none.)
        self._fence = fence
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
            raise PermanentError("Grafana answered without an annotation id", reason=Reason.BAD_RESPONSE)
        return annotation_id

    async def close_region(self, annotation_id: int, end: datetime, text: str | None = None) -> None:
        body: dict[str, Any] = {"timeEnd": _ms(end)}
        if text is not None:
            body["text"] = text
        await self._call("PATCH", f"/api/annotations/{annotation_id}", body, op="close_region")

    async def find_region(self, incident_id: str) -> int | None:
        query = urlencode({"tags": incident_tag(incident_id), "type": "annotation", "limit": 10})
        answer = await self._list(f"/api/annotations?{query}", op="find_region")
        ids = [a["id"] for a in answer if isinstance(a.get("id"), int) and not isinstance(a["id"], bool)]
        return min(ids) if ids else None

    async def probe(self) -> Probe:
        """Reachable (``/api/health``), the token valid and allowed to read annotations."""
        try:
            health = await self._call("GET", "/api/health", None, op="health", auth=False)
            await self._call("GET", "/api/annotations?limit=1&tags=pitcrew", None, op="probe")
        except PitcrewError as exc:
            missing = {
                Reason.UNAUTHORIZED: ("a valid service-account token",),
                Reason.FORBIDDEN: ("annotations:read",),
            }
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
                f"cannot read grafana.token_file: {exc.strerror}", reason=Reason.NO_CREDENTIALS
            ) from exc
        if not token:
            raise PermanentError("grafana.token_file is empty", reason=Reason.NO_CREDENTIALS)
        return token

    async def _call(
        self, method: str, path: str, body: dict[str, Any] | None, *, op: str, auth: bool = True
    ) -> dict[str, Any]:
        payload = await self._request(method, path, body, op=op, auth=auth)
        return payload if isinstance(payload, dict) else {}

    async def _list(self, path: str, *, op: str) -> list[dict[str, Any]]:
        payload = await self._request("GET", path, None, op=op, auth=True)
        return [a for a in payload if isinstance(a, dict)] if isinstance(payload, list) else []

    async def _request(
        self, method: str, path: str, body: dict[str, Any] | None, *, op: str, auth: bool
    ) -> Any:
        if self._fence is not None and method not in READS:
            self._fence.token()  # Deposed: the lease may have lapsed while the last call was answered
        headers = {"Accept": "application/json"}
        if auth:
            headers["Authorization"] = f"Bearer {self._token()}"
        if self._session is None:
            self._session = aiohttp.ClientSession(timeout=self._timeout, trace_configs=traces(self._fence))
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
            raise TransientError(f"Grafana {op} timed out", reason=Reason.TIMEOUT) from exc
        except aiohttp.ClientError as exc:
            raise TransientError(
                f"Grafana unreachable ({op}): {type(exc).__name__}", reason=Reason.UNREACHABLE
            ) from exc
        message = payload.get("message", "") if isinstance(payload, dict) else ""
        if status in _PERMANENT:
            raise PermanentError(
                f"Grafana refused {op}: HTTP {status} {message}".strip(), reason=_PERMANENT[status]
            )
        if status == 429 or status >= 500:
            reason = Reason.RATE_LIMITED if status == 429 else Reason.UNAVAILABLE
            raise TransientError(f"Grafana {op}: HTTP {status} {message}".strip(), reason=reason)
        if not 200 <= status < 300:
            raise PermanentError(f"Grafana {op}: unexpected HTTP {status}", reason=Reason.BAD_RESPONSE)
        return payload


def region_of(incident: IncidentRecord) -> Region:
    """The incident as a region: from its first alert's fault to its close, tagged by what it was."""
    first = incident.faults[0] if incident.faults else None
    return Region(
        incident_id=incident.id,
        node=incident.node,
        fault_class=first.fault_class if first else "unknown",
        playbook=incident.playbook or (first.playbook if first else "none"),
        start=incident.first_alert_at or incident.opened_at,
        summary=first.describe() if first else "",
    )


def closing_text(region: Region, incident: IncidentRecord) -> str:
    outcome = incident.outcome or incident.state.value
    return f"pitcrew {region.incident_id}: {region.summary or region.playbook} on {region.node} — {outcome}"


class GrafanaDestination:
    """The outbox's Grafana destination: one region annotation per incident, opened once, closed once.

    Its rows are the incident's ``state`` events. The first delivered opens the region (the
    annotation id kept in ``outbox_refs`` like Slack's thread ts); any delivered once the incident
    has ended patches the end (once: the patched end is kept too). A delivery begun before a
    crash (``item.attempts > 1``) first asks Grafana for the incident's tag, so it never creates
    a second annotation.
    """

    def __init__(self, annotations: Annotator, store: Store, clock: Callable[[], datetime]) -> None:
        self.annotations = annotations
        self._store = store
        self._clock = clock

    @property
    def name(self) -> str:
        return NAME

    async def deliver(self, item: OutboxItem, *, more: bool = False) -> str | None:
        if item.incident_id is None:
            return None
        incident = await self._store.incident(item.incident_id)
        if incident is None:
            return None  # written in the same transaction as the incident: only a test store lacks it
        region = region_of(incident)
        key = incident_ref("region", incident.id)
        known = await self._store.outbox_ref(NAME, key)
        if known is not None:
            annotation_id = int(known)
        else:
            annotation_id = await create_once(
                item,
                lambda: self.annotations.find_region(incident.id),
                lambda: self.annotations.open_region(region),
                "annotation in Grafana",
            )
            await self._store.set_outbox_ref(NAME, key, str(annotation_id), self._clock())
        if incident.state.terminal and incident.closed_at is not None:
            end = str(_ms(incident.closed_at))
            if await self._store.outbox_ref(NAME, incident_ref("end", incident.id)) != end:
                await self.annotations.close_region(
                    annotation_id, incident.closed_at, closing_text(region, incident)
                )
                await self._store.set_outbox_ref(NAME, incident_ref("end", incident.id), end, self._clock())
        return str(annotation_id)
