"""The one ``kubernetes.aio`` client of the process, its rate limit and its error translation.

Every request pitcrew sends to the API server goes through the client built here, and every
HTTP request that client makes (its own retries included) first takes a token from one
shared bucket (``qps`` refill, ``burst`` capacity), so an alert storm of hundreds of
incidents polling at once can never flood the API server. The limiter hooks the client's
aiohttp session through ``trace_configs``: nothing wraps or patches the client.

Credentials from a kubeconfig exec plugin (``aws eks get-token``, ``gke-gcloud-auth-plugin``) expire,
typically after 15 minutes, and the client library runs the plugin only when the kubeconfig is
loaded. ``ApiClient`` (the library's client with ``call_api`` extended) answers a 401 as client-go
does: it reloads the kubeconfig once (running the plugin again) and sends the request again with the
new token. A 401 means the server refused before doing anything, so a create is never sent twice
for real. A reload that gives no new token leaves the 401 to stand.

``call`` turns the client's exceptions into ``TransientError``/``PermanentError`` with a
bounded ``reason``, chaining the original; it must not retry (the client retries idempotent
requests itself, the executor retries steps).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any, TypeVar

import aiohttp
from kubernetes.aio import client, config
from kubernetes.aio.client.exceptions import ApiException

from bot import __version__, logger
from bot.config import KubernetesSettings
from bot.engine.errors import PermanentError, Reason, TransientError
from bot.integrations.fenced import traces
from bot.store.lease import Fence

T = TypeVar("T")
log = logger(__name__)
USER_AGENT = "pitcrew"

#: Status codes that may succeed later: conflicts, throttling (PDB too), server errors.
_TRANSIENT = {409, 429, 500, 502, 503, 504}
#: The API server's answers as pitcrew's reasons (a 5xx, or status 0, is ``unavailable``; another
#: 4xx is ``refused``). A 429 from the Eviction API is a PDB's refusal: ``pods`` says so.
_TRANSIENT_REASONS = {409: Reason.CONFLICT, 429: Reason.RATE_LIMITED}
_PERMANENT_REASONS = {
    400: Reason.INVALID_REQUEST,
    401: Reason.UNAUTHORIZED,
    403: Reason.FORBIDDEN,
    404: Reason.NOT_FOUND,
    405: Reason.UNSUPPORTED,
    410: Reason.NOT_FOUND,
    422: Reason.INVALID_REQUEST,
}


class TokenBucket:
    """``rate`` tokens a second, at most ``burst`` saved up; ``acquire`` waits for one (FIFO)."""

    def __init__(self, rate: float, burst: int) -> None:
        self.rate = rate
        self.burst = burst
        self._tokens = float(burst)
        self._at = time.monotonic()
        self._lock = asyncio.Lock()

    async def acquire(self) -> None:
        async with self._lock:  # one waiter at a time keeps the order and the arithmetic simple
            now = time.monotonic()
            self._tokens = min(self.burst, self._tokens + (now - self._at) * self.rate)
            self._at = now
            if self._tokens < 1:
                await asyncio.sleep((1 - self._tokens) / self.rate)
                self._tokens = 1.0
                self._at = time.monotonic()
            self._tokens -= 1


def _trace(bucket: TokenBucket) -> aiohttp.TraceConfig:
    async def take(_session: aiohttp.ClientSession, _ctx: SimpleNamespace, _params: object) -> None:
        await bucket.acquire()

    trace = aiohttp.TraceConfig()
    trace.on_request_start.append(take)
    return trace


@dataclass(frozen=True, slots=True)
class Connection:
    """Where one client connects: the pod's service account, or a kubeconfig file and context."""

    in_cluster: bool
    kubeconfig: Path | None
    context: str | None

    async def load(self, configuration: client.Configuration) -> None:
        """Credentials and server into ``configuration``; an exec plugin runs again on every load."""
        if self.in_cluster:
            # The service-account token file is re-read by the library's own refresh hook.
            config.load_incluster_config(client_configuration=configuration)
            return
        await config.load_kube_config(
            config_file=str(self.kubeconfig) if self.kubeconfig else None,
            context=self.context,
            client_configuration=configuration,
            persist_config=False,
        )


class ApiClient(client.ApiClient):  # type: ignore[misc]
    """The library's client, whose requests refused with 401 reload the credentials once and go again."""

    def __init__(self, configuration: client.Configuration, connection: Connection | None = None) -> None:
        super().__init__(configuration)
        self._connection = connection
        self._reloading = asyncio.Lock()

    async def call_api(
        self,
        method: str,
        url: str,
        header_params: dict[str, str] | None = None,
        body: Any = None,
        post_params: Any = None,
        _request_timeout: Any = None,
        _preload_content: bool = True,
    ) -> Any:
        response = await super().call_api(
            method, url, header_params, body, post_params, _request_timeout, _preload_content
        )
        if response.status != 401 or self._connection is None or self._connection.in_cluster:
            return response
        sent = (header_params or {}).get("authorization")
        fresh = await self._refreshed(sent)
        if fresh is None:
            return response  # nothing new to offer: the 401 stands
        await response.read()  # release the refused answer's connection
        log.info(
            "kubernetes credentials refused (401): reloaded the kubeconfig, sending %s %s again", method, url
        )
        return await super().call_api(
            method,
            url,
            {**(header_params or {}), "authorization": fresh},
            body,
            post_params,
            _request_timeout,
            _preload_content,
        )

    async def _refreshed(self, sent: str | None) -> str | None:
        """A token other than ``sent``: another request's reload, or this one's (one at a time)."""
        assert self._connection is not None
        async with self._reloading:
            current = await self.configuration.get_api_key_with_prefix("BearerToken", alias="authorization")
            if current == sent:
                try:
                    await self._connection.load(self.configuration)
                except Exception as exc:  # the library raises ConfigException and more for a bad file
                    log.warning("kubernetes credentials not reloaded: %s", exc)
                    return None
                current = await self.configuration.get_api_key_with_prefix(
                    "BearerToken", alias="authorization"
                )
        return current if current and current != sent else None


async def api_client(
    settings: KubernetesSettings,
    bucket: TokenBucket,
    connection: Connection | None = None,
    fence: Fence | None = None,
) -> ApiClient:
    """A client for the configured cluster (or ``connection``): the service account in-cluster, else a
    kubeconfig whose credentials are reloaded on a 401. With ``fence`` (``pitcrew serve``), every
    request that changes the cluster asks it last, once its connection is held and its turn in
    the rate limit has come (``bot.integrations.fenced``)."""
    connection = connection or Connection(settings.in_cluster, settings.kubeconfig, settings.context)
    configuration = client.Configuration()
    await connection.load(configuration)
    configuration.retries = settings.retries or None
    configuration.trace_configs = [_trace(bucket), *traces(fence)]
    api = ApiClient(configuration, connection)
    # The apiserver records the User-Agent up to its first "/" as the field manager: name us.
    api.user_agent = f"{USER_AGENT}/{__version__}"
    return api


def status_of(exc: ApiException) -> dict[str, Any]:
    """The ``metav1.Status`` body of a failed request ({} when it was not one)."""
    try:
        body = json.loads(exc.body or b"{}")
    except ValueError:
        return {}
    return body if isinstance(body, dict) else {}


def refusal(
    code: int, status: dict[str, Any], what: str, said: str | None = None
) -> TransientError | PermanentError:
    """The port's error for the API server's refusal of HTTP ``code`` with ``metav1.Status`` body
    ``status`` ({} if none); ``what`` says what pitcrew was doing, ``said`` stands in for a Status
    without a message (the HTTP reason phrase). The code and the Status' own ``reason``
    (``NotFound``, ``AlreadyExists``, ``TooManyRequests`` ...) stay in the message; the error's
    ``reason`` is pitcrew's, from the code. Also for a refusal a server sends on a 2xx status line
    (an eviction's Failure Status): ``code`` is then the Status' own."""
    reason = f" {status['reason']}" if isinstance(status.get("reason"), str) else ""
    message = f"{what}: {code}{reason} {status.get('message') or said}"
    if code in _TRANSIENT or code == 0:
        retry = (status.get("details") or {}).get("retryAfterSeconds")
        kind = _TRANSIENT_REASONS.get(code, Reason.UNAVAILABLE)
        return TransientError(message, reason=kind, retry_after=float(retry) if retry else None)
    return PermanentError(message, reason=_PERMANENT_REASONS.get(code, Reason.REFUSED))


def translate(exc: BaseException, what: str) -> TransientError | PermanentError:
    """The port's error for a failed request (``refusal`` for the API server's); ``what`` says what
    pitcrew was doing."""
    if isinstance(exc, ApiException):
        return refusal(exc.status, status_of(exc), what, exc.reason)
    if isinstance(exc, TimeoutError):
        return TransientError(f"{what}: {type(exc).__name__} {exc}", reason=Reason.TIMEOUT)
    if isinstance(exc, aiohttp.ClientError | OSError):
        return TransientError(f"{what}: {type(exc).__name__} {exc}", reason=Reason.UNREACHABLE)
    raise exc


async def call(what: str, request: Awaitable[T]) -> T:
    """Await one API request; failures become the port's errors (``translate``)."""
    try:
        return await request
    except (TimeoutError, ApiException, aiohttp.ClientError, OSError) as exc:
        raise translate(exc, what) from exc
