"""The Web API methods pitcrew calls, each answering with the fixtures' shapes and error codes.

One function per method, registered in ``METHODS``. Checks run in Slack's order: token, then channel,
then membership, then content, so the error a test sees is the one Slack would send first.
"""

from __future__ import annotations

import base64
import binascii
import time
from typing import TYPE_CHECKING, Any

from proving_ground.slack import blocks as blockkit
from proving_ground.slack.webapi import ApiError, Message, _json_arg, _truthy
from proving_ground.slack.world import Channel

if TYPE_CHECKING:
    from proving_ground.slack.webapi import Handler, WebApi


#: The bot-token scope each method needs (docs.slack.dev method reference, "Required scopes"; public
#: channels — a private channel needs the groups:* counterpart). auth.test needs none.
SCOPES: dict[str, str | None] = {
    "auth.test": None,
    "chat.postMessage": "chat:write",
    "chat.update": "chat:write",
    "chat.delete": "chat:write",
    "chat.postEphemeral": "chat:write",
    "chat.getPermalink": None,
    "conversations.info": "channels:read",
    "conversations.members": "channels:read",
    "conversations.history": "channels:history",
    "conversations.replies": "channels:history",
    "usergroups.users.list": "usergroups:read",
}


#: The Web API methods pitcrew calls (the scenario tests check every call they record is one of
#: these; tests/slack/test_manifest.py checks the app manifest against the calls recorded instead).
PITCREW_METHODS = frozenset(
    {
        "auth.test",
        "chat.postMessage",
        "chat.update",
        "chat.postEphemeral",
        "chat.getPermalink",
        "conversations.info",
        "conversations.history",
        "conversations.replies",
        "usergroups.users.list",
        "apps.connections.open",
    }
)


def _bot(api: WebApi, token: str, method: str | None = None) -> None:
    if not token:
        raise ApiError("not_authed")
    if token in api.world.app_tokens:
        raise ApiError("not_allowed_token_type")
    if token not in api.world.bot_tokens:
        raise ApiError("invalid_auth")
    needed = SCOPES.get(method or "")
    if needed is not None and needed not in api.world.scopes:
        raise ApiError("missing_scope", needed=needed, provided=",".join(sorted(api.world.scopes)))


def _channel(api: WebApi, args: dict[str, Any], *, member: bool = True) -> Channel:
    channel = api.world.channels.get(str(args.get("channel", "")))
    if channel is None or (channel.is_private and api.world.bot_user not in channel.members):
        raise ApiError("channel_not_found")
    if member and api.world.bot_user not in channel.members:
        raise ApiError("not_in_channel")
    return channel


def _content(args: dict[str, Any]) -> tuple[str, list[dict[str, Any]]]:
    blocks = _json_arg(args, "blocks")
    text = str(args.get("text") or "")
    if blocks is not None:
        errors = blockkit.validate(blocks)
        if errors:
            body = blockkit.invalid_blocks_body(errors)
            raise ApiError(
                "invalid_blocks", errors=body["errors"], response_metadata=body["response_metadata"]
            )
        if blockkit.text_total(blocks) > blockkit.BLOCKS_TEXT:
            raise ApiError("msg_blocks_too_long")
    if not text and not blocks:
        raise ApiError("no_text")
    return text[:40000], blockkit.stored(blocks or [])


def _metadata(args: dict[str, Any]) -> dict[str, Any] | None:
    """``metadata`` as Slack takes it: ``event_type`` (a string) and ``event_payload`` (an object)."""
    metadata = _json_arg(args, "metadata")
    if metadata is None:
        return None
    if (
        not isinstance(metadata, dict)
        or not isinstance(metadata.get("event_type"), str)
        or not isinstance(metadata.get("event_payload"), dict)
    ):
        raise ApiError("invalid_metadata_format")
    return {"event_type": metadata["event_type"], "event_payload": metadata["event_payload"]}


def _message_json(
    api: WebApi, m: Message, *, with_ts: bool = True, with_metadata: bool = False
) -> dict[str, Any]:
    w = api.world
    out: dict[str, Any] = {"user": m.user, "type": "message", "text": m.text, "bot_id": w.bot_id}
    if with_ts:
        out["ts"] = m.ts
    out.update({"app_id": w.app_id, "team": w.team_id, "blocks": m.blocks})
    if m.thread_ts:
        out.update({"thread_ts": m.thread_ts, "parent_user_id": w.bot_user})
    if with_metadata and m.metadata is not None:
        out["metadata"] = m.metadata
    out["bot_profile"] = {"id": w.bot_id, "app_id": w.app_id, "user_id": w.bot_user, "name": w.bot_name}
    return out


async def auth_test(api: WebApi, token: str, args: dict[str, Any]) -> dict[str, Any]:
    _bot(api, token, "auth.test")
    w = api.world
    return {
        "ok": True,
        "url": f"https://{w.domain}.slack.com/",
        "team": w.team,
        "user": w.bot_name,
        "team_id": w.team_id,
        "user_id": w.bot_user,
        "bot_id": w.bot_id,
        "is_enterprise_install": False,
    }


async def chat_post_message(api: WebApi, token: str, args: dict[str, Any]) -> dict[str, Any]:
    _bot(api, token, "chat.postMessage")
    channel = _channel(api, args)
    text, blocks = _content(args)
    thread_ts = args.get("thread_ts") or None
    if thread_ts is not None:
        parent = api.message(channel.id, str(thread_ts))
        # A reply to a reply lands in the parent's thread, as in Slack. A reply to a deleted parent is
        # accepted and posted at the channel's top level, with no error: Slack's developers say the
        # app "has to delete (or cancel to post) its reply" (slackapi/python-slack-events-api#87).
        thread_ts = (parent.thread_ts or parent.ts) if parent is not None else None
    api.audit("chat.postMessage", text, blocks)
    m = Message(channel.id, api.next_ts(), text, blocks, api.world.bot_user, thread_ts)
    m.reply_broadcast = thread_ts is not None and _truthy(args.get("reply_broadcast"))
    m.metadata = _metadata(args)
    api.messages.append(m)
    return {"ok": True, "channel": channel.id, "ts": m.ts, "message": _message_json(api, m)}


async def chat_update(api: WebApi, token: str, args: dict[str, Any]) -> dict[str, Any]:
    """Edit one of the bot's own messages (docs.slack.dev/reference/methods/chat.update): not another's
    (``cant_update_message``), and not one older than the workspace's edit window allows
    (``edit_window_closed``, "due to the team message edit settings"; ``World.edit_window``)."""
    _bot(api, token, "chat.update")
    channel = _channel(api, args)
    m = api.message(channel.id, str(args.get("ts", "")))
    if m is None:
        raise ApiError("message_not_found")
    if m.user != api.world.bot_user:
        raise ApiError("cant_update_message")
    window = api.world.edit_window
    if window is not None and time.time() - m.posted_at > window:
        raise ApiError("edit_window_closed")
    text, blocks = _content(args)
    api.audit("chat.update", text, blocks)
    m.updates.append({"text": m.text, "blocks": m.blocks})
    m.text, m.blocks = text, blocks
    message = _message_json(api, m, with_ts=False)
    return {"ok": True, "channel": channel.id, "ts": m.ts, "text": m.text, "message": message}


async def chat_delete(api: WebApi, token: str, args: dict[str, Any]) -> dict[str, Any]:
    """A bot deletes one of its own messages (docs.slack.dev/reference/methods/chat.delete)."""
    _bot(api, token, "chat.delete")
    channel = _channel(api, args)
    m = api.message(channel.id, str(args.get("ts", "")))
    if m is None:
        raise ApiError("message_not_found")
    if m.user != api.world.bot_user:
        raise ApiError("cant_delete_message")
    api.delete(channel.id, m.ts)
    return {"ok": True, "channel": channel.id, "ts": m.ts}


async def chat_get_permalink(api: WebApi, token: str, args: dict[str, Any]) -> dict[str, Any]:
    """The message's permalink, in Slack's format (a reply's carries its thread and channel)."""
    _bot(api, token, "chat.getPermalink")
    channel = _channel(api, args, member=False)
    m = api.message(channel.id, str(args.get("message_ts", "")))
    if m is None:
        raise ApiError("message_not_found")
    url = f"https://{api.world.domain}.slack.com/archives/{channel.id}/p{m.ts.replace('.', '')}"
    if m.thread_ts is not None and m.thread_ts != m.ts:
        url += f"?thread_ts={m.thread_ts}&cid={channel.id}"
    return {"ok": True, "channel": channel.id, "permalink": url}


async def chat_post_ephemeral(api: WebApi, token: str, args: dict[str, Any]) -> dict[str, Any]:
    _bot(api, token, "chat.postEphemeral")
    channel = _channel(api, args)
    user = str(args.get("user", ""))
    if user not in channel.members:
        raise ApiError("user_not_in_channel")
    text, blocks = _content(args)
    api.audit("chat.postEphemeral", text, blocks)
    ts = api.next_ts()
    api.ephemeral.append({"channel": channel.id, "user": user, "ts": ts, "text": text, "blocks": blocks})
    return {"ok": True, "message_ts": ts}


async def conversations_info(api: WebApi, token: str, args: dict[str, Any]) -> dict[str, Any]:
    _bot(api, token, "conversations.info")
    c = _channel(api, args, member=False)
    info = {"id": c.id, "name": c.name, "is_channel": not c.is_private, "is_private": c.is_private}
    info.update({"is_archived": False, "is_member": api.world.bot_user in c.members})
    return {"ok": True, "channel": info}


async def conversations_members(api: WebApi, token: str, args: dict[str, Any]) -> dict[str, Any]:
    _bot(api, token, "conversations.members")
    c = _channel(api, args, member=False)
    return {"ok": True, "members": sorted(c.members), "response_metadata": {"next_cursor": ""}}


def _page(args: dict[str, Any]) -> int:
    try:
        return max(1, min(int(args.get("limit") or 100), 999))
    except ValueError as e:
        raise ApiError("invalid_limit") from e


async def conversations_history(api: WebApi, token: str, args: dict[str, Any]) -> dict[str, Any]:
    """Top-level messages and broadcast replies, newest first, within ``oldest``/``latest``."""
    _bot(api, token, "conversations.history")
    channel = _channel(api, args)
    oldest, latest = float(args.get("oldest") or 0), float(args.get("latest") or "inf")
    shown = [
        m
        for m in api.channel_view(channel.id)
        if oldest < float(m.ts) <= latest or (oldest == 0 and float(m.ts) <= latest)
    ]
    shown.sort(key=lambda m: float(m.ts), reverse=True)
    return _messages_page(api, shown, args)


async def conversations_replies(api: WebApi, token: str, args: dict[str, Any]) -> dict[str, Any]:
    """A thread: its parent first, then the replies, oldest first."""
    _bot(api, token, "conversations.replies")
    channel = _channel(api, args)
    asked = api.message(channel.id, str(args.get("ts", "")))
    root = (asked.thread_ts or asked.ts) if asked is not None else ""
    if asked is None or api.message(channel.id, root) is None:
        raise ApiError("thread_not_found")  # its parent was deleted: the thread cannot be read
    return _messages_page(api, api.thread(channel.id, root), args)


def _cursor(ts: str) -> str:
    """An opaque cursor naming the next message, in the form Slack's look like (base64 ``next_ts:``)."""
    return base64.b64encode(f"next_ts:{ts.replace('.', '')}".encode()).decode()


def _start(shown: list[Message], cursor: str) -> int:
    if not cursor:
        return 0
    try:
        key = base64.b64decode(cursor, validate=True).decode()
    except (binascii.Error, UnicodeDecodeError) as e:
        raise ApiError("invalid_cursor") from e
    for index, m in enumerate(shown):
        if key == f"next_ts:{m.ts.replace('.', '')}":
            return index
    raise ApiError("invalid_cursor")


def _messages_page(api: WebApi, shown: list[Message], args: dict[str, Any]) -> dict[str, Any]:
    """One page (``limit`` from ``cursor``) of ``shown`` as Slack answers a history or replies call:
    ``has_more`` and a ``next_cursor`` for the next page (docs.slack.dev/apis/web-api/pagination)."""
    meta = _truthy(args.get("include_all_metadata"))
    limit = _page(args)
    start = _start(shown, str(args.get("cursor") or ""))
    page, rest = shown[start : start + limit], shown[start + limit :]
    return {
        "ok": True,
        "messages": [_message_json(api, m, with_metadata=meta) for m in page],
        "has_more": bool(rest),
        "response_metadata": {"next_cursor": _cursor(rest[0].ts) if rest else ""},
    }


async def usergroups_users_list(api: WebApi, token: str, args: dict[str, Any]) -> dict[str, Any]:
    _bot(api, token, "usergroups.users.list")
    users = api.world.usergroups.get(str(args.get("usergroup", "")))
    if users is None:
        raise ApiError("no_such_subteam")
    return {"ok": True, "users": list(users)}


METHODS: dict[str, Handler] = {
    "auth.test": auth_test,
    "chat.postMessage": chat_post_message,
    "chat.getPermalink": chat_get_permalink,
    "chat.update": chat_update,
    "chat.delete": chat_delete,
    "chat.postEphemeral": chat_post_ephemeral,
    "conversations.info": conversations_info,
    "conversations.members": conversations_members,
    "conversations.history": conversations_history,
    "conversations.replies": conversations_replies,
    "usergroups.users.list": usergroups_users_list,
}
