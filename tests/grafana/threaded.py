"""The Grafana stand-in on its own event loop in a thread, for tests that drive pitcrew as a real process
(``tests/harness/pitcrew.py`` is synchronous: its waits would otherwise stall the stand-in)."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from contextlib import contextmanager

from tests.grafana.server import GrafanaStandin


@contextmanager
def threaded_grafana() -> Iterator[GrafanaStandin]:
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, name="grafana-standin", daemon=True)
    thread.start()
    standin = GrafanaStandin()
    asyncio.run_coroutine_threadsafe(standin.start(), loop).result(30)
    try:
        yield standin
    finally:
        try:
            asyncio.run_coroutine_threadsafe(standin.stop(), loop).result(30)
            standin.release()
        finally:
            loop.call_soon_threadsafe(loop.stop)
            thread.join(timeout=10)
            loop.close()
