"""Notices: what telling humans costs a step, through the outbox, next to posting inline.

Measured in one run, on loopback, against the Slack Web API stand-in (tests/slack):

  1. baseline: the structured log record alone (the ``log`` notifier, no journal);
  2. outbox: ``OutboxNotifier.post`` — the log record, plus the timeline event and the outbox row
     committed by the SQLite store (``synchronous: full``), which is what a step waits for;
  3. inline (what pitcrew does not do): ``chat.postMessage`` awaited in the step, Slack healthy;
  4. inline with Slack answering 503 at once: the call fails (slack_sdk does not retry 5xx) and a
     step would have to retry it itself (a Slack that does not answer costs slack_sdk's 30 s timeout);
  2b. the outbox again while Slack is down and the sender retries in the background;
  5. delivery: the background sender draining ``--notices`` notices of ``--incidents`` incidents
     to the stand-in (posts and parent updates), notices per second.

Printed: p50/p99 per post for 1-4, and the sender's throughput.

    python bench/notices.py [--notices 400] [--incidents 20]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import statistics
import tempfile
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from pathlib import Path

from slack_sdk.errors import SlackApiError
from slack_sdk.web.async_client import AsyncWebClient

from bot.domain.faults import Fault
from bot.engine.backoff import Backoff
from bot.engine.metrics import Metrics
from bot.engine.outbox import OutboxNotifier, OutboxSender
from bot.engine.ports import Notice
from bot.integrations.journal import LogNotifier
from bot.integrations.slack.outbound import EVENTS, SlackDestination, SlackLinks
from bot.store.base import Delivery, IncomingAlert
from bot.store.sqlite import SqliteStore
from proving_ground.slack.server import SlackStandin
from proving_ground.slack.world import BOT_TOKEN

CHANNEL = "C0GPUOPS"


def now() -> datetime:
    return datetime.now(UTC)


def _notice(incident: str, n: int) -> Notice:
    return Notice(
        incident, "incident" if n == 0 else "step", f"gpu-node: notice {n}", ("line",) * 5, node="gpu"
    )


async def _timed(count: int, call: Callable[[int], Awaitable[object]]) -> list[float]:
    took = []
    for n in range(count):
        start = time.perf_counter()
        with contextlib.suppress(SlackApiError):  # the failed inline post still cost its time
            await call(n)
        took.append((time.perf_counter() - start) * 1000)
    return took


def _line(name: str, took: list[float]) -> None:
    took = sorted(took)
    p99 = took[min(len(took) - 1, int(len(took) * 0.99))]
    print(f"{name:<50} p50 {statistics.median(took):8.2f} ms   p99 {p99:8.2f} ms")


async def _incidents(store: SqliteStore, count: int) -> list[str]:
    alerts = tuple(
        IncomingAlert(
            f"fp{n}",
            now(),
            None,
            "firing",
            "GpuXid",
            f"gpu-node-{n:03d}",
            {"node": f"gpu-node-{n:03d}"},
            {},
            Fault(
                "xid",
                f"gpu-node-{n:03d}",
                "3",
                79,
                "RESTART_BM",
                "fatal",
                "replace-node",
                True,
                "off the bus",
                True,
            ),
        )
        for n in range(count)
    )
    outcome = await store.ingest(Delivery("pitcrew", "{}", "firing", 0, alerts), now())
    return list(outcome.opened)


async def main(notices: int, incidents: int) -> None:
    logging.disable(logging.CRITICAL)  # the log records are still built; their output is not the figure
    slack = await SlackStandin().start()
    client = AsyncWebClient(token=BOT_TOKEN, base_url=slack.base_url)
    with tempfile.TemporaryDirectory() as tmp:
        store = SqliteStore(Path(tmp) / "pitcrew.db", synchronous="full")
        store.route_events(EVENTS, "slack")
        await store.open()
        try:
            ids = await _incidents(store, incidents)
            log_only = LogNotifier()
            outbox = OutboxNotifier(store, now, LogNotifier(), ["slack"])
            print(f"{notices} notices, {incidents} incidents, stand-in on loopback\n")
            _line(
                "1. log record only (baseline)",
                await _timed(notices, lambda n: log_only.post(_notice(ids[n % incidents], n))),
            )
            _line(
                "2. outbox: log + event + row committed",
                await _timed(notices, lambda n: outbox.post(_notice(ids[n % incidents], n))),
            )
            _line(
                "3. inline chat.postMessage, Slack healthy",
                await _timed(notices, lambda n: client.chat_postMessage(channel=CHANNEL, text=f"notice {n}")),
            )
            slack.api.outage(3600)
            _line(
                "4. inline chat.postMessage, Slack 503",
                await _timed(min(notices, 100), lambda n: client.chat_postMessage(channel=CHANNEL, text="x")),
            )
            destination = SlackDestination(
                client, store, SlackLinks(CHANNEL, digest_threshold=incidents + 1), now
            )
            sender = OutboxSender(store, [destination], Metrics(), now, backoff=Backoff(0.05, 0.5))
            await sender.start()  # retrying against the outage while steps keep posting
            _line(
                "2b. outbox while Slack is down (sender retrying)",
                await _timed(notices, lambda n: outbox.post(_notice(ids[n % incidents], n))),
            )
            await sender.stop()
            slack.api.outage(0)
            slack.api.messages.clear()
            slack.api.calls.clear()
            notices *= 2
            start = time.perf_counter()
            while await store.outbox_pending("slack", limit=1):
                await sender.drain(destination)
            took = time.perf_counter() - start
            print(
                f"\n5. sender: {notices} notices delivered in {took:.2f} s = {notices / took:.0f} notices/s "
                f"({len(slack.api.calls_to('chat.postMessage'))} posts, {len(slack.api.calls_to('chat.update'))} updates)"
            )
        finally:
            await store.close()
            await slack.stop()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--notices", type=int, default=400)
    parser.add_argument("--incidents", type=int, default=20)
    args = parser.parse_args()
    asyncio.run(main(args.notices, args.incidents))
