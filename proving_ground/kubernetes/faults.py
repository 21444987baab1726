"""Per-request fault injection and the request log kept for the later RBAC comparison.

A ``Fault`` matches requests by method/verb/resource/name (or a name's prefix: a node the test cannot
name in advance, a replacement) and answers ``times`` of them with ``status`` (the fixtures' Status
bodies, or ``body``) after an optional ``delay``, once ``skip`` matching requests went through untouched (the
third patch of a node, say); a delay alone lets a client time out, and ``before`` alone lets someone
else change the world just before the request is served (a race) — or kill the client.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import kmock

    from proving_ground.kubernetes.resources import ApiError, Resource


@dataclass
class LoggedRequest:
    """One request as RBAC sees it: ``verb`` on ``api_group``/``resource``[/``subresource``]."""

    method: str
    path: str
    verb: str
    api_group: str
    resource: str
    subresource: str | None
    namespace: str | None
    name: str | None
    content_type: str | None
    status: int | None = None
    user_agent: str = ""
    #: The client's address as the emulator's socket saw it (which machine sent it).
    peer: str = ""
    #: When the emulator received it (monotonic seconds), for rate measurements.
    at: float = field(default_factory=time.monotonic)

    @classmethod
    def of(
        cls, request: kmock.Request, res: Resource, ns: str | None, name: str | None, sub: str | None
    ) -> LoggedRequest:
        method = request.method.value
        watch = request.params.get("watch") in ("true", "1")
        verb = {
            "GET": "watch" if watch else ("get" if name else "list"),
            "POST": "create",
            "PUT": "update",
            "PATCH": "patch",
            "DELETE": "delete" if name else "deletecollection",
        }.get(method, method.lower())
        headers = {k.lower(): v for k, v in request.headers.items()}
        return cls(
            method,
            request.url.path,
            verb,
            res.group,
            res.plural,
            sub,
            ns,
            name,
            headers.get("content-type"),
            user_agent=headers.get("user-agent", ""),
            peer=_peer(request),
        )


@dataclass
class Fault:
    status: int | None = None
    method: str | None = None
    verb: str | None = None
    resource: str | None = None
    subresource: str | None = None
    name: str | None = None
    name_prefix: str | None = None
    times: int = 1
    #: Matching requests let through untouched before this fault takes any.
    skip: int = 0
    delay: float = 0.0
    #: Serve the request, then hold the answer this long (the write lands; its acknowledgement is late).
    delay_after: float = 0.0
    retry_after: int | None = None
    #: Serve the request, then answer with this status instead (the write landed; the answer was lost).
    lost_answer: int | None = None
    #: Run before the request is served: another writer acting just before this request lands.
    before: Callable[[], None] | None = None
    #: The body answered with ``status`` instead of the Status the emulator makes for it: a
    #: ``metav1.Status`` a server words otherwise, or one it sends on a 2xx status line.
    body: dict[str, Any] | None = None
    hits: int = 0
    skipped: int = 0

    def matches(self, entry: LoggedRequest) -> bool:
        wanted: dict[str, Any] = {
            "method": self.method,
            "verb": self.verb,
            "resource": self.resource,
            "subresource": self.subresource,
            "name": self.name,
        }
        named = self.name_prefix is None or (entry.name or "").startswith(self.name_prefix)
        return (
            self.hits < self.times
            and named
            and all(v is None or getattr(entry, k) == v for k, v in wanted.items())
        )

    def error(self, res: Resource, name: str | None) -> ApiError:
        from proving_ground.kubernetes.resources import ApiError

        assert self.status is not None
        error = ApiError.injected(self.status, res, name, self.retry_after)
        if self.body is not None:
            error.body = dict(self.body)
        return error


@dataclass
class FaultPlan:
    faults: list[Fault] | None = None

    def add(self, fault: Fault) -> Fault:
        self.faults = [*(self.faults or []), fault]
        return fault

    def take(self, entry: LoggedRequest) -> Fault | None:
        for fault in self.faults or []:
            if fault.matches(entry):
                if fault.skipped < fault.skip:
                    fault.skipped += 1
                    continue
                fault.hits += 1
                return fault
        return None


def _peer(request: kmock.Request) -> str:
    raw = request._raw_request  # kmock keeps aiohttp's request, and with it the socket's peer
    return str(raw.remote or "") if raw is not None else ""
