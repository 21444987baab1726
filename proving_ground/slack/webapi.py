"""The Slack Web API stand-in: an aiohttp server that slack_sdk reaches through ``base_url``.

It owns the workspace's state (channels, members, user groups, messages and their edits), records every
call, and answers like Slack: errors are HTTP 200 ``{"ok": false, "error": ...}``, only rate limiting is a
429 with ``Retry-After`` (fixtures/slack/README.md, "Rules a stand-in must enforce"). A method it does not
serve is answered as Slack answers a name it has no method by, HTTP 200 ``unknown_method`` naming it in
``req_method``, whatever the body; one called with the app's own tokens is also kept in ``unserved`` (the
fixtures fail the test on it: either pitcrew calls a method Slack lacks, or the stand-in lacks one Slack
has, and its answer was not Slack's). A path outside ``/api/<method>`` is a plain 404. It must not grow
pitcrew logic: it knows nothing of incidents.
"""

from __future__ import annotations

import asyncio
import json
import math
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from proving_ground.slack import mrkdwn
from proving_ground.slack.world import BOT_TOKEN, TESTER_TOKEN, World

Handler = Callable[["WebApi", str, dict[str, Any]], Awaitable[dict[str, Any]]]

#: Per-method rate tiers in calls per minute (docs.slack.dev/apis/web-api/rate-limits: Tier 1 1+/min,
#: Tier 2 20+/min, Tier 3 50+/min; each method's reference page names its tier). The stand-in holds
#: each method to the floor of its tier over any 60 s window, per workspace and app, and answers the
#: call over it HTTP 429 with ``Retry-After`` (seconds until the window has room). chat.postMessage
#: has its own "special" limit (``WebApi.post_interval``).
TIERS: dict[str, int] = {
    "apps.connections.open": 1,
    "usergroups.users.list": 20,
    "chat.update": 50,
    "chat.delete": 50,
    "conversations.history": 50,
    "conversations.replies": 50,
}

#: What a test may relax, by name (strict is the default; a test opts in and says why in its code).
LENIENCIES: dict[str, str] = {
    "rate_tiers": "do not hold methods to their rate tiers (TIERS)",
    "broadcast_mentions": "let messages notify the whole channel (<!channel>, <!here>, <!everyone>)",
    "unescaped_markup": "do not fail the test on markup flagged in text from outside (WebApi.flags)",
}

#: Every Web API method called with pitcrew's bot token (``BOT_TOKEN``) on any stand-in during this
#: test session; a test's own client uses ``TESTER_TOKEN``, so its calls are left out. What the app
#: manifest must grant (``tests/slack/test_manifest.py``, run last).
RECORDED: set[str] = set()


@dataclass
class Call:
    """One request as it reached the stand-in (token kept so a test can check which one was used)."""

    method: str
    args: dict[str, Any]
    token: str | None
    status: int = 200
    answer: dict[str, Any] | None = None


@dataclass
class Fault:
    """An answer forced on the next ``count`` calls of a method ("*" for any)."""

    status: int
    count: int
    retry_after: int = 1


@dataclass
class Message:
    """A message as a human reads it; ``updates`` holds each earlier version replaced by chat.update."""

    channel: str
    ts: str
    text: str
    blocks: list[dict[str, Any]]
    user: str
    thread_ts: str | None = None
    reply_broadcast: bool = False
    updates: list[dict[str, Any]] = field(default_factory=list)
    #: Message metadata (``{"event_type", "event_payload"}``) as posted, returned by history reads
    #: that ask for it (``include_all_metadata``).
    metadata: dict[str, Any] | None = None
    #: Unix time the message was posted (its ``ts`` counts from the fixtures' epoch, not the clock).
    posted_at: float = field(default_factory=time.time)


class ApiError(Exception):
    """A Slack error code, answered with HTTP 200."""

    def __init__(self, error: str, **extra: Any) -> None:
        super().__init__(error)
        self.body = {"ok": False, "error": error, **extra}


def _bearer(request: web.Request) -> str | None:
    auth = request.headers.get("Authorization", "")
    return auth.removeprefix("Bearer ") if auth.startswith("Bearer ") else None


async def _arguments(request: web.Request) -> tuple[dict[str, Any], str | None]:
    """Query, form and JSON arguments merged (slack_sdk uses all three); the token from header or field."""
    args: dict[str, Any] = dict(request.query)
    if request.content_type == "application/json":
        # Slack's own answers to a JSON body it cannot use (its common errors): ``invalid_json``
        # for one that does not parse, ``json_not_object`` for JSON that is not an object.
        try:
            body = json.loads(await request.text())
        except ValueError as e:
            raise ApiError("invalid_json") from e
        if not isinstance(body, dict):
            raise ApiError("json_not_object")
        args.update(body)
    elif request.can_read_body:
        args.update(dict(await request.post()))
    token = args.pop("token", None)
    return args, _bearer(request) or token


def _json_arg(args: dict[str, Any], name: str) -> Any:
    """Form callers send lists as JSON strings; JSON callers send them as lists."""
    value = args.get(name)
    if isinstance(value, str):
        try:
            return json.loads(value)
        except json.JSONDecodeError as e:
            raise ApiError(f"invalid_{name}") from e
    return value


def _truthy(value: Any) -> bool:
    return value is True or str(value).lower() in ("1", "true")


class WebApi:
    """State and routes of the Web API; ``World`` says who exists, this class says what happened."""

    def __init__(self, world: World) -> None:
        self.world = world
        self.calls: list[Call] = []
        self.messages: list[Message] = []
        self.ephemeral: list[dict[str, Any]] = []
        self.faults: dict[str, list[Fault]] = {}
        self.methods: dict[str, Handler] = {}
        #: Off by default. Set to 1.0 to enforce chat.postMessage's "one message per second per channel"
        #: strictly (real Slack tolerates short bursts), e.g. for a storm test.
        self.post_interval: float | None = None
        self._last_post: dict[str, float] = {}
        self._seq = 0
        #: Monotonic time until which every call answers 503 (Slack down).
        self._down_until = -math.inf
        #: Called with each call before it is answered (a test may kill pitcrew right there).
        self.on_call: Callable[[Call], None] | None = None
        #: Leniencies a test opted into (``allow``); see ``LENIENCIES``.
        self.lenient: set[str] = set()
        #: Text that came from outside the app (a test names it: a job name, an alert description).
        self.outside: list[str] = []
        #: Markup Slack would act on that the app did not mean (``mrkdwn.audit``), in call order.
        self.flags: list[mrkdwn.Flag] = []
        #: Messages deleted (``chat.delete`` or a person), as they were when deleted.
        self.deleted: list[Message] = []
        #: Seconds each method takes before it answers (``slow``).
        self.delays: dict[str, float] = {}
        self._window: dict[str, list[float]] = {}
        #: Calls with a token this workspace issued to the app (not a test's own ``TESTER_TOKEN``) to
        #: a method the stand-in does not serve: answered ``unknown_method`` as Slack answers a name it
        #: has no method by, which is not Slack's answer if Slack has the method. The fixtures assert
        #: it is empty at teardown.
        self.unserved: list[Call] = []
        #: Mints a response_url for (user, channel, "commands" | "actions"); set by the server.
        self.response_url: Callable[[str, str, str], str] | None = None

    # -- what a test drives -------------------------------------------------------------------------

    def fail(self, method: str, status: int, count: int = 1, retry_after: int = 1) -> None:
        """Answer the next ``count`` calls of ``method`` ("*" = any) with 429 (+Retry-After) or a 5xx."""
        self.faults.setdefault(method, []).append(Fault(status, count, retry_after))

    def allow(self, *names: str) -> None:
        """Opt this test into named leniencies (``LENIENCIES``); strict otherwise."""
        unknown = set(names) - set(LENIENCIES)
        assert not unknown, f"no leniency called {unknown}: {sorted(LENIENCIES)}"
        self.lenient.update(names)

    def slow(self, method: str, seconds: float) -> None:
        """``method`` answers only after ``seconds`` (Slack under load, a large user group)."""
        self.delays[method] = seconds

    def delete(self, channel: str, ts: str) -> Message:
        """A person (or a retention policy) deletes a message: gone for every reader and method."""
        m = self.message(channel, ts)
        assert m is not None, f"no message {ts} in {channel}"
        self.messages.remove(m)
        self.deleted.append(m)
        return m

    def backdate(self, channel: str, ts: str, seconds: float) -> Message:
        """Message ``ts`` as if posted ``seconds`` earlier: time passes for it alone (past the
        workspace's edit window, ``World.edit_window``) without the test waiting that long."""
        m = self.message(channel, ts)
        assert m is not None, f"no message {ts} in {channel}"
        m.posted_at -= seconds
        return m

    def audit(self, method: str, text: str, blocks: list[dict[str, Any]]) -> None:
        """Note markup in the mrkdwn of a message that Slack would act on and the app did not mean."""
        broadcasts = "broadcast_mentions" in self.lenient
        texts = [("/text", text), *mrkdwn.mrkdwn_texts(blocks)]
        for pointer, body in texts:
            self.flags += mrkdwn.audit(method, pointer, body, self.outside, broadcasts)

    def outage(self, seconds: float) -> None:
        """Answer every call with HTTP 503 for the next ``seconds`` (Slack down)."""
        self._down_until = time.monotonic() + seconds

    def check_served(self) -> None:
        """Fail if the app called a method the stand-in does not serve (``unserved``)."""
        names = sorted({c.method for c in self.unserved})
        assert not names, (
            f"the app called Web API methods the Slack stand-in does not serve: {names}. Each was answered"
            " unknown_method, as Slack answers a name it has no method by; if Slack has the method, add it to"
            " proving_ground/slack/methods.py from the fixtures and docs, else the app calls what Slack lacks"
        )

    def calls_to(self, method: str) -> list[Call]:
        return [c for c in self.calls if c.method == method]

    def message(self, channel: str, ts: str) -> Message | None:
        return next((m for m in self.messages if m.channel == channel and m.ts == ts), None)

    def thread(self, channel: str, ts: str) -> list[Message]:
        """The parent then its replies, in the order a human sees them."""
        return [m for m in self.messages if m.channel == channel and (m.ts == ts or m.thread_ts == ts)]

    def channel_view(self, channel: str) -> list[Message]:
        """What the channel itself shows: top-level messages and replies broadcast to it."""
        return [
            m for m in self.messages if m.channel == channel and (m.thread_ts is None or m.reply_broadcast)
        ]

    # -- the server ---------------------------------------------------------------------------------

    def next_ts(self) -> str:
        self._seq += 1
        return f"{self.world.epoch + self._seq // 1000}.{self._seq % 1000 * 100:06d}"

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_route("*", "/api/{method}", self._handle)
        return app

    def _throttled(self, method: str, args: dict[str, Any]) -> int | None:
        """Seconds to wait if this post comes too soon after the last one in its channel."""
        if method != "chat.postMessage" or self.post_interval is None:
            return None
        now, channel = time.monotonic(), str(args.get("channel", ""))
        wait = self._last_post.get(channel, -math.inf) + self.post_interval - now
        if wait > 0:
            return max(1, math.ceil(wait))
        self._last_post[channel] = now
        return None

    def _over_tier(self, method: str) -> int | None:
        """Seconds to wait if this call would pass its method's tier within the last 60 s."""
        limit = TIERS.get(method)
        if limit is None or "rate_tiers" in self.lenient:
            return None
        now = time.monotonic()
        window = [t for t in self._window.get(method, []) if now - t < 60.0]
        self._window[method] = window
        if len(window) >= limit:
            return max(1, math.ceil(window[0] + 60.0 - now))
        window.append(now)
        return None

    def _forced(self, method: str) -> Fault | None:
        for key in (method, "*"):
            queue = self.faults.get(key, [])
            if queue:
                fault = queue[0]
                fault.count -= 1
                if fault.count <= 0:
                    queue.pop(0)
                return fault
        return None

    async def _handle(self, request: web.Request) -> web.Response:
        method = request.match_info["method"]
        unusable: dict[str, Any] | None = None  # a served method's answer to a body it cannot use
        try:
            args, token = await _arguments(request)
        except ApiError as e:
            args, token = {}, _bearer(request)
            if method in self.methods:  # else unknown_method: Slack looks at the name first (README)
                unusable = e.body
        call = Call(method, args, token)
        self.calls.append(call)
        if unusable is not None:
            call.answer = unusable
            return web.json_response(unusable)
        if token == BOT_TOKEN:
            RECORDED.add(method)
        fault = self._forced(method)
        if fault is None and time.monotonic() < self._down_until:
            fault = Fault(503, 1)
        throttle = self._throttled(method, args) if fault is None else None
        if fault is None and throttle is None:
            throttle = self._over_tier(method)
        if throttle is not None:
            fault = Fault(429, 1, throttle)
        if fault is not None and fault.status == 429:
            call.status, call.answer = 429, {"ok": False, "error": "ratelimited"}
            return web.json_response(call.answer, status=429, headers={"Retry-After": str(fault.retry_after)})
        if fault is not None:
            call.status = fault.status
            return web.Response(status=fault.status, text="upstream connect error", content_type="text/plain")
        handler = self.methods.get(method)
        if method in self.delays:
            await asyncio.sleep(self.delays[method])
        try:
            if handler is None:
                if token != TESTER_TOKEN and token in self.world.bot_tokens | self.world.app_tokens:
                    self.unserved.append(call)
                raise ApiError("unknown_method", req_method=method)
            answer = await handler(self, token or "", args)
        except ApiError as e:
            answer = e.body
        call.answer = answer
        if self.on_call is not None:
            self.on_call(call)
        return web.json_response(answer)
