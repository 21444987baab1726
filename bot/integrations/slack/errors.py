"""slack_sdk's failures translated into the engine's ``TransientError`` / ``PermanentError``.

Slack answers errors with HTTP 200 ``{"ok": false, "error": ...}``; only rate limiting is a 429 with
``Retry-After``. What a human can fix without a new pitcrew (a revoked token, the bot removed from
the channel, a missing scope) is transient: the outbox keeps the notice and retries with backoff,
and the log says what is wrong, so nothing is lost while someone fixes it. What no retry can fix
(a message Slack refuses to accept) is permanent, and so is a message Slack will take no more edits
of (``MessageClosed``): one a person or a retention policy deleted (``chat.update`` answers
``message_not_found``, ``conversations.replies`` ``thread_not_found``: ``GONE``), and one that is
there but that pitcrew may no longer edit (``edit_window_closed``, the workspace's edit window has
closed on it; ``cant_update_message``: ``UNEDITABLE``). No retry changes either, and as each
incident's notices go out one at a time, retrying would hold every later one back; the destination
starts a new message instead.

Slack's ``error`` code is mapped onto pitcrew's closed ``Reason`` (``REASONS``; a code not listed
there is ``refused``) and kept, verbatim, in the message: the reason is a metric label and must
stay bounded, the code is what a human searches Slack's docs for.
"""

from __future__ import annotations

from collections.abc import Awaitable
from typing import TypeVar

import aiohttp
from slack_sdk.errors import SlackApiError, SlackClientError
from slack_sdk.web.async_slack_response import AsyncSlackResponse

from bot.engine.errors import PermanentError, Reason, TransientError

T = TypeVar("T")

#: Errors no retry fixes: the message itself is wrong.
_PERMANENT = frozenset(
    {
        "invalid_blocks",
        "invalid_blocks_format",
        "msg_too_long",
        "msg_blocks_too_long",
        "too_many_blocks",
        "no_text",
        "invalid_arguments",
        "too_many_attachments",
    }
)

#: Slack's ``error`` codes (the Web API methods pitcrew calls: chat.postMessage, chat.update,
#: chat.getPermalink, chat.postEphemeral, conversations.history/replies, usergroups.users.list,
#: auth.test; from each method's documented errors and slack-api-specs) as pitcrew's reasons.
REASONS: dict[str, Reason] = {
    **dict.fromkeys(("ratelimited", "rate_limited"), Reason.RATE_LIMITED),
    **dict.fromkeys(
        (
            "not_authed",
            "invalid_auth",
            "account_inactive",
            "token_revoked",
            "token_expired",
            "not_allowed_token_type",
            "two_factor_setup_required",
        ),
        Reason.UNAUTHORIZED,
    ),
    **dict.fromkeys(
        (
            "missing_scope",
            "no_permission",
            "access_denied",
            "not_in_channel",
            "is_archived",
            "channel_is_archived",
            "restricted_action",
            "restricted_action_read_only_channel",
            "restricted_action_thread_only_channel",
            "restricted_action_non_threadable_channel",
            "cant_update_message",
            "edit_window_closed",
            "ekm_access_denied",
            "team_access_not_granted",
            "org_login_required",
            "enterprise_is_restricted",
        ),
        Reason.FORBIDDEN,
    ),
    **dict.fromkeys(
        (
            "channel_not_found",
            "message_not_found",
            "thread_not_found",
            "user_not_found",
            "user_not_in_channel",
            "users_not_found",
            "no_such_subteam",
            "subteam_not_found",
        ),
        Reason.NOT_FOUND,
    ),
    **dict.fromkeys(
        (
            *_PERMANENT,
            "invalid_arg_name",
            "invalid_array_arg",
            "invalid_charset",
            "invalid_form_data",
            "invalid_post_type",
            "missing_post_type",
            "invalid_json",
            "json_not_object",
            "invalid_cursor",
            "invalid_limit",
            "invalid_ts_latest",
            "invalid_ts_oldest",
            "invalid_metadata_format",
            "invalid_metadata_schema",
            "metadata_too_large",
            "invalid_attachments",
        ),
        Reason.INVALID_REQUEST,
    ),
    **dict.fromkeys(("internal_error", "fatal_error", "service_unavailable"), Reason.UNAVAILABLE),
    "request_timeout": Reason.TIMEOUT,
    **dict.fromkeys(("method_deprecated", "deprecated_endpoint", "unknown_method"), Reason.UNSUPPORTED),
}


def reason_of(error: str) -> Reason:
    """Slack's ``error`` code as pitcrew's reason; one it does not list is ``refused``."""
    return REASONS.get(error, Reason.REFUSED)


#: The message (or the thread under it) was deleted: permanent for that message.
GONE = frozenset({"message_not_found", "thread_not_found"})
#: The message is there, but Slack will not let pitcrew edit it again: permanent for that message
#: (docs.slack.dev/reference/methods/chat.update, errors: ``cant_update_message`` "Authenticated
#: user does not have permission to update this message", ``edit_window_closed`` "The message
#: cannot be edited due to the team message edit settings").
UNEDITABLE = frozenset({"cant_update_message", "edit_window_closed"})


class MessageClosed(PermanentError):
    """Slack will take no more edits of the message: this type is what tells the destination to
    carry on under a new message (a new parent, the digest posted again) rather than give the item
    up. ``why`` says which of its kinds in words for the log, ``moved`` as the key of the line the
    new parent shows (``messages.MOVED``), kept as ``replaced-why:<id>``."""

    why = "can no longer be changed"
    moved = ""


class MessageGone(MessageClosed):
    """Slack answered that the message (or its thread) is gone (``GONE``): a person or a retention
    policy deleted it. Its reason is ``not_found`` like any missing object."""

    why = "was deleted"
    moved = "deleted"


class MessageUneditable(MessageClosed):
    """Slack refused to edit the message (``UNEDITABLE``): the workspace's edit window has closed on
    it, or the token may not edit it. It stays in Slack as it was last edited, its thread with it.
    Its reason is ``forbidden``, as Slack's refusals of a permission are."""

    why = "can no longer be edited"
    moved = "uneditable"


def translate(exc: Exception) -> TransientError | PermanentError:
    if isinstance(exc, SlackApiError):
        response = exc.response
        status = response.status_code
        error = str(response.get("error", "")) if isinstance(response.data, dict) else ""
        if status == 429 or error in {"ratelimited", "rate_limited"}:
            retry = response.headers.get("Retry-After") or response.headers.get("retry-after")
            return TransientError(
                f"Slack rate limited the call: {error or f'HTTP {status}'}",
                reason=Reason.RATE_LIMITED,
                retry_after=float(retry or 1),
            )
        if status >= 500:
            return TransientError(f"Slack answered HTTP {status}", reason=Reason.UNAVAILABLE)
        if error in _PERMANENT:
            return PermanentError(f"Slack refused the message: {error}", reason=reason_of(error))
        if error in GONE:
            return MessageGone(f"the Slack message was deleted: {error}", reason=reason_of(error))
        if error in UNEDITABLE:
            return MessageUneditable(f"Slack will not edit the message: {error}", reason=reason_of(error))
        needed = str(response.get("needed", "")) if isinstance(response.data, dict) else ""
        detail = f"{error} (needs scope {needed})" if needed else error
        return TransientError(f"Slack refused the call: {detail or 'unknown error'}", reason=reason_of(error))
    if isinstance(exc, TimeoutError):
        return TransientError("Slack gave no answer in time", reason=Reason.TIMEOUT)
    return TransientError(f"Slack unreachable: {type(exc).__name__}", reason=Reason.UNREACHABLE)


async def call(request: Awaitable[AsyncSlackResponse]) -> AsyncSlackResponse:
    """Await one Web API call; library failures come out as the engine's errors, chained."""
    try:
        return await request
    except (TimeoutError, SlackClientError, aiohttp.ClientError, OSError) as exc:
        raise translate(exc) from exc
