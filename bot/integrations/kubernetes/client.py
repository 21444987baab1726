"""The one ``kubernetes.aio`` client of the process, its rate limit and its error translation.

Every request pitcrew sends to the API server goes through the client built here, and every
HTTP request that client makes (its own retries included) first takes a token from one
shared bucket (``qps`` refill, ``burst`` capacity), so an alert storm of hundreds of
incidents polling at once can never flood the API server. The limiter hooks the client's
aiohttp session through ``trace_configs``: nothing wraps or patches the client.

``call`` turns the client's exceptions into ``TransientError``/``PermanentError`` with a
bounded ``reason``, chaining the original; it must not retry (the client retries idempotent
requests itself, the executor retries steps).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable
from types import SimpleNamespace
from typing import Any, TypeVar

import aiohttp
from kubernetes.aio import client, config
from kubernetes.aio.client.exceptions import ApiException

from bot import __version__
from bot.config import KubernetesSettings
from bot.engine.errors import PermanentError, Reason, TransientError

T = TypeVar("T")
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


async def api_client(settings: KubernetesSettings, bucket: TokenBucket) -> client.ApiClient:
    """A client for the configured cluster: the service account in-cluster, else a kubeconfig."""
    configuration = client.Configuration()
    if settings.in_cluster:
        config.load_incluster_config(client_configuration=configuration)
    else:
        await config.load_kube_config(
            config_file=str(settings.kubeconfig) if settings.kubeconfig else None,
            context=settings.context,
            client_configuration=configuration,
            persist_config=False,
        )
    configuration.retries = settings.retries or None
    configuration.trace_configs = [_trace(bucket)]
    api = client.ApiClient(configuration)
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


def translate(exc: BaseException, what: str) -> TransientError | PermanentError:
    """The port's error for a failed request; ``what`` says what pitcrew was doing. The HTTP code
    and the Status' own ``reason`` (``NotFound``, ``AlreadyExists``, ``TooManyRequests`` ...) stay
    in the message; the error's ``reason`` is pitcrew's, from the HTTP code."""
    if isinstance(exc, ApiException):
        status = status_of(exc)
        code = f" {status['reason']}" if isinstance(status.get("reason"), str) else ""
        message = f"{what}: {exc.status}{code} {status.get('message') or exc.reason}"
        if exc.status in _TRANSIENT or exc.status == 0:
            retry = (status.get("details") or {}).get("retryAfterSeconds")
            reason = _TRANSIENT_REASONS.get(exc.status, Reason.UNAVAILABLE)
            return TransientError(message, reason=reason, retry_after=float(retry) if retry else None)
        return PermanentError(message, reason=_PERMANENT_REASONS.get(exc.status, Reason.REFUSED))
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
