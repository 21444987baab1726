"""``chat.update`` within its rate tier: every edit of a parent or a digest waits for a turn.

``chat.update`` is a Tier 3 method: about 50 calls a minute per workspace and app
(docs.slack.dev/reference/methods/chat.update; docs.slack.dev/apis/web-api/rate-limits). Over it,
Slack answers 429 and the edit waits anyway, later. So the destination spends a budget of its own
below the tier — a token bucket of ``burst`` edits refilled at ``per_minute`` — and an edit waits
for a token rather than draw a 429: at most ``burst + per_minute`` edits in any minute.

Waiting is also what coalesces: the outbox delivers one item at a time, and while an edit waits
the items behind it gather, so the next delivery of an incident updates its parent once for all of
them (``more``), and a digest write shows every member that joined meanwhile. A storm therefore
costs fewer edits, not more 429s.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from slack_sdk.web.async_client import AsyncWebClient

from bot.integrations.slack.errors import call
from bot.integrations.slack.messages import Message

#: Below Tier 3's 50 a minute, with room for a burst: 5 + 40 = 45 in any minute at most.
PER_MINUTE = 40.0
BURST = 5


class ChatUpdates:
    def __init__(
        self,
        client: AsyncWebClient,
        channel: str,
        *,
        per_minute: float = PER_MINUTE,
        burst: int = BURST,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._client = client
        self._channel = channel
        self._every = 60.0 / per_minute
        self._burst = float(burst)
        self._clock = clock
        self._tokens = float(burst)
        self._at = clock()
        self._lock = asyncio.Lock()

    async def update(self, ts: str, message: Message) -> None:
        """Replace message ``ts`` with ``message`` once a token is free (``call``'s errors)."""
        await self._take()
        await call(
            self._client.chat_update(channel=self._channel, ts=ts, text=message.text, blocks=message.blocks)
        )

    def wait(self) -> float:
        """Seconds until the next edit may go (0 when one may go now)."""
        self._refill()
        return 0.0 if self._tokens >= 1 else (1 - self._tokens) * self._every

    async def _take(self) -> None:
        async with self._lock:
            delay = self.wait()
            if delay > 0:
                await asyncio.sleep(delay)
                self._refill()
            self._tokens = max(self._tokens - 1, 0.0)

    def _refill(self) -> None:
        now = self._clock()
        self._tokens = min(self._burst, self._tokens + (now - self._at) / self._every)
        self._at = now
