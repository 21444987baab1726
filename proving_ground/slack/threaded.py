"""The Slack stand-in on its own event loop in a thread, for callers that are synchronous: the demo
and tests that drive pitcrew as a real process (their waits would otherwise stall the stand-in)."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

from proving_ground.slack.server import SlackStandin
from proving_ground.slack.world import World

T = TypeVar("T")


class ThreadedStandin:
    def __init__(self, world: World | None = None, *, host: str = "127.0.0.1") -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="slack-standin", daemon=True)
        self.standin = SlackStandin(world, host=host)

    def run(self, coro: Coroutine[Any, Any, T], timeout: float = 30.0) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def start(self) -> ThreadedStandin:
        self._thread.start()
        self.run(self.standin.start())
        return self

    def stop(self) -> None:
        try:
            self.run(self.standin.stop())
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(timeout=10)
            self.loop.close()


@contextmanager
def threaded_standin() -> Iterator[SlackStandin]:
    """For tests: also fails if the app called a method the stand-in does not serve."""
    threaded = ThreadedStandin().start()
    try:
        yield threaded.standin
    finally:
        threaded.stop()
    threaded.standin.api.check_served()
