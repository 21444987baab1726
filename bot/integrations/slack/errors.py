"""slack_sdk's failures translated into the engine's ``TransientError`` / ``PermanentError``.

Slack answers errors with HTTP 200 ``{"ok": false, "error": ...}``; only rate limiting is a 429 with
``Retry-After``. What a human can fix without a new pitcrew (a revoked token, the bot removed from
the channel, a missing scope) is transient: the outbox keeps the notice and retries with backoff,
and the log says what is wrong, so nothing is lost while someone fixes it. What no retry can fix
(a message Slack refuses to accept) is permanent, and so is a message that is gone: a person or a
retention policy deleted it (``chat.update`` answers ``message_not_found``, ``conversations.replies``
``thread_not_found``); no retry brings it back, and the destination starts a new one (``GONE``).
"""

from __future__ import annotations

from collections.abc import Awaitable
from typing import TypeVar

import aiohttp
from slack_sdk.errors import SlackApiError, SlackClientError
from slack_sdk.web.async_slack_response import AsyncSlackResponse

from bot.engine.errors import PermanentError, TransientError

T = TypeVar("T")

#: Errors no retry fixes: the message itself is wrong.
_PERMANENT = frozenset(
    {
        "invalid_blocks",
        "invalid_blocks_format",
        "msg_too_long",
        "no_text",
        "invalid_arguments",
        "too_many_attachments",
    }
)


#: The message (or the thread under it) was deleted: permanent for that message.
GONE = frozenset({"message_not_found", "thread_not_found"})


def translate(exc: Exception) -> TransientError | PermanentError:
    if isinstance(exc, SlackApiError):
        response = exc.response
        status = response.status_code
        error = str(response.get("error", "")) if isinstance(response.data, dict) else ""
        if status == 429 or error in {"ratelimited", "rate_limited"}:
            retry = response.headers.get("Retry-After") or response.headers.get("retry-after")
            return TransientError(
                "Slack rate limited the call", reason="ratelimited", retry_after=float(retry or 1)
            )
        if status >= 500:
            return TransientError(f"Slack answered HTTP {status}", reason="unavailable")
        if error in _PERMANENT:
            return PermanentError(f"Slack refused the message: {error}", reason=error)
        if error in GONE:
            return PermanentError(f"the Slack message was deleted: {error}", reason=error)
        needed = str(response.get("needed", "")) if isinstance(response.data, dict) else ""
        detail = f"{error} (needs scope {needed})" if needed else error
        return TransientError(
            f"Slack refused the call: {detail or 'unknown error'}", reason=error or "refused"
        )
    return TransientError(f"Slack unreachable: {type(exc).__name__}", reason="unreachable")


async def call(request: Awaitable[AsyncSlackResponse]) -> AsyncSlackResponse:
    """Await one Web API call; library failures come out as the engine's errors, chained."""
    try:
        return await request
    except (TimeoutError, SlackClientError, aiohttp.ClientError, OSError) as exc:
        raise translate(exc) from exc
