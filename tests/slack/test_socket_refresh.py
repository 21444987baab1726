"""Socket Mode survives Slack's connection refresh: a ``disconnect`` (refresh_requested) makes pitcrew
open a new ``apps.connections.open`` URL, and ``/pitcrew`` works over the new connection; a pitcrew
started while Slack is down starts anyway (ready) and connects once Slack answers."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from proving_ground.slack.server import SlackStandin
from tests.slack.pitcrew_app import SlackPitcrew, until


async def test_refresh_requested_reconnects(slack: SlackStandin, tmp_path: Path) -> None:
    # Slack refreshes a connection after hours; here within seconds, so the second
    # apps.connections.open comes within the minute of Tier 1.
    slack.api.allow("rate_tiers")
    async with SlackPitcrew(tmp_path / "p", slack, transport="socket", config={"mode": "observe"}) as pitcrew:
        assert "mode *observe*" in await pitcrew.slash("status")
        opened = len(slack.api.calls_to("apps.connections.open"))
        await slack.socket.disconnect("refresh_requested")
        await until(lambda: len(slack.api.calls_to("apps.connections.open")) > opened, what="a new URL")
        await slack.socket.connected(timeout=10)
        assert "mode *observe*" in await pitcrew.slash("status")
        assert all(
            c.token and c.token.startswith("xapp-") for c in slack.api.calls_to("apps.connections.open")
        )


async def test_pitcrew_starts_while_slack_is_down_and_connects_later(
    slack: SlackStandin, tmp_path: Path
) -> None:
    # Slack is down until pitcrew has been refused once, however long its start takes: a fixed
    # 2 s outage ended before a start slowed by a loaded machine asked, and the test failed in CI.
    slack.api.outage(120.0)

    def refused() -> list[Any]:
        return [c for c in slack.api.calls_to("apps.connections.open") if c.status == 503]

    async def back_once_refused() -> None:
        await until(lambda: bool(refused()), timeout=60, what="pitcrew asking Slack while it is down")
        slack.api.outage(0)

    back = asyncio.create_task(back_once_refused())
    # slack_sdk retries a failed connection every ping interval (10 s) by itself.
    async with SlackPitcrew(
        tmp_path / "p", slack, transport="socket", config={"mode": "observe"}, connect_timeout=40
    ) as pitcrew:
        # __aenter__ returned once Socket Mode connected: after the outage, in the background.
        await back
        assert refused(), "Slack was never asked while down"
        status, _ = await pitcrew.request("GET", "/readyz")
        assert status == 200
        assert "mode *observe*" in await pitcrew.slash("status")
