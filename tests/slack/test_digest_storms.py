"""Two storms an hour apart get a digest each, and a late notice of the first updates the first.

Through ``SlackDestination.deliver`` with a real SQLite store and the stand-in: incidents are opened
by ingesting deliveries at chosen times, their notices come from the outbox as the sender reads
them. Cases: the first ``threshold - 1`` incidents of each storm get threads, the rest join the
storm's digest; the second storm does not join the first one's digest; a notice of a first-storm
incident delivered during the second storm updates the first digest, not the second. A state change
committed after a digest write read the store is shown by the next one, though the engine stamped
it earlier than that read (a breaker's quiet suppression, whose only item is its ``state`` event).
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

from slack_sdk.web.async_client import AsyncWebClient

from bot.domain.faults import Fault
from bot.domain.incident import State
from bot.engine.ports import Notice
from bot.integrations.slack import EVENTS
from bot.integrations.slack.outbound import SlackDestination, SlackLinks
from bot.store.base import Delivery, IncomingAlert, NewEvent
from bot.store.sqlite import SqliteStore
from proving_ground.slack.server import SlackStandin

T0 = datetime(2026, 11, 29, 8, 0, tzinfo=UTC)


def _delivery(node: str, at: datetime) -> Delivery:
    fault = Fault("xid", node, "3", 79, "RESTART_BM", "fatal", "replace-node", True, "fell off the bus", True)
    alert = IncomingAlert(f"fp-{node}", at, None, "firing", "GpuXid", node, {"node": node}, {}, fault)
    return Delivery("pitcrew", f"{{node={node}}}", "firing", 0, (alert,))


def _destination(bot: AsyncWebClient, store: SqliteStore, now: list[datetime]) -> SlackDestination:
    """Slack's destination over ``store``, a digest from the third incident in two minutes, on the
    test's clock (``now[0]``)."""
    links = SlackLinks("C0GPUOPS", digest_window=timedelta(minutes=2), digest_threshold=3)
    return SlackDestination(bot, store, links, lambda: now[0])


async def _tell_opened(store: SqliteStore, incident: str, node: str, at: datetime) -> None:
    """The incident notice the engine writes to the outbox for a new incident on ``node``."""
    notice = Notice(incident, "incident", f"{node}: XID 79", ("fell off the bus",), node=node)
    await store.enqueue(
        incident, NewEvent("notice"), "incident", {**notice.record(), "node": node}, ["slack"], at
    )


async def _deliver_pending(store: SqliteStore, destination: SlackDestination, at: datetime) -> None:
    """What the outbox holds for Slack, delivered in order, as the sender does."""
    for item in await store.outbox_pending("slack"):
        await store.outbox_delivered(item.id, await destination.deliver(item), at)


async def test_each_storm_has_its_digest(slack: SlackStandin, bot: AsyncWebClient, tmp_path: Path) -> None:
    now = [T0]
    store = SqliteStore(tmp_path / "p.db")
    await store.open()
    try:
        destination = _destination(bot, store, now)

        async def storm(start: datetime, prefix: str) -> list[str]:
            ids = []
            for n in range(5):
                now[0] = start + timedelta(seconds=n)
                ids += (await store.ingest(_delivery(f"{prefix}-{n}", now[0]), now[0])).opened
            for incident in ids:
                await _tell_opened(store, incident, incident, now[0])
            await _deliver_pending(store, destination, now[0])
            return ids

        first = await storm(T0, "a")
        second = await storm(T0 + timedelta(hours=1), "b")
        channel = slack.api.channel_view("C0GPUOPS")
        digests = [m for m in channel if "storm" in m.text]
        assert len(digests) == 2 and len(channel) == 6  # and two threads per storm
        assert all("5 nodes" in d.text for d in digests), [d.text for d in digests]
        assert "a-4" in repr(digests[0].blocks) and "b-" not in repr(digests[0].blocks)
        assert "b-4" in repr(digests[1].blocks) and "a-" not in repr(digests[1].blocks)

        versions = len(digests[0].updates), len(digests[1].updates)
        now[0] += timedelta(seconds=5)
        await store.enqueue(
            first[-1], NewEvent("notice"), "summary", {"title": "late", "lines": []}, ["slack"], now[0]
        )
        (late,) = await store.outbox_pending("slack")
        assert (await destination.deliver(late) or "").startswith("digest:")
        assert (len(digests[0].updates), len(digests[1].updates)) == (versions[0] + 1, versions[1])
        assert second
    finally:
        await store.close()


async def test_a_state_change_stamped_before_a_digest_read_is_shown(
    slack: SlackStandin, bot: AsyncWebClient, tmp_path: Path
) -> None:
    now = [T0]
    store = SqliteStore(tmp_path / "p.db")
    store.route_events(EVENTS, "slack")  # as build_app routes them: a state change is an item too
    await store.open()
    try:
        destination = _destination(bot, store, now)
        ids = []
        for n in range(5):
            now[0] = T0 + timedelta(seconds=n)
            ids += (await store.ingest(_delivery(f"n-{n}", now[0]), now[0])).opened
            await _tell_opened(store, ids[-1], f"n-{n}", now[0])
        stamped = now[0]  # the engine's time when it decided, before its transaction commits
        now[0] += timedelta(seconds=2)
        await _deliver_pending(
            store, destination, now[0]
        )  # the digest reads the store: the last incident is open
        digest = next(m for m in slack.api.channel_view("C0GPUOPS") if "storm" in m.text)
        assert "n-4 — XID 79 gpu3 — open" in repr(digest.blocks), digest.blocks
        await store.transition(
            ids[-1],
            State.SUPPRESSED,
            stamped,
            outcome="circuit breaker open",
            event=NewEvent("state", outcome="suppressed", detail="circuit breaker open"),
        )
        await _deliver_pending(store, destination, now[0])
        digest = next(m for m in slack.api.channel_view("C0GPUOPS") if "storm" in m.text)
        assert "n-4 — XID 79 gpu3 — suppressed" in repr(digest.blocks), digest.blocks
    finally:
        await store.close()
