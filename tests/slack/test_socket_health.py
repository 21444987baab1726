"""Socket Mode that cannot work says so: in ``/readyz``'s detail, in a metric, within a minute.

Cases (pitcrew in this process, Socket Mode against the stand-in):
- the app-level token revoked (``apps.connections.open`` answers ``invalid_auth``) or without
  ``connections:write`` (``missing_scope``): pitcrew starts and stays ready (remediation needs no
  Slack), ``/readyz`` shows ``slack_socket`` disconnected with Slack's reason and the scope, and
  ``pitcrew_slack_socket_connected`` is 0; it never opened a websocket. Before: no sign anywhere
  (slack_sdk only logged and retried);
- a half-open connection (the far end stops answering pings): ``/readyz`` and the metric turn to
  disconnected, and once Slack answers again a new connection replaces it and both say connected.
"""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

from proving_ground.slack.server import SlackStandin
from tests.slack.pitcrew_app import SlackPitcrew


async def _socket(pitcrew: SlackPitcrew) -> tuple[dict[str, Any], float | None]:
    status, raw = await pitcrew.request("GET", "/readyz")
    assert status == 200, raw  # ready either way: remediation does not need Slack
    detail = json.loads(raw).get("detail", {}).get("slack_socket", {})
    _, metrics = await pitcrew.request("GET", "/metrics")
    gauge = next(
        (float(line.split()[-1]) for line in metrics.decode().splitlines()
         if line.startswith("pitcrew_slack_socket_connected ")),
        None,
    )  # fmt: skip
    return detail, gauge


async def _until_socket(pitcrew: SlackPitcrew, connected: bool, timeout: float = 60.0) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        detail, gauge = await _socket(pitcrew)
        # "not started" is no verdict yet: wait for what the connection attempt found.
        settled = detail.get("reason") != "not started"
        if detail.get("connected") is connected and gauge == (1.0 if connected else 0.0) and settled:
            return detail
        assert time.monotonic() < deadline, (detail, gauge)
        await asyncio.sleep(0.2)


async def test_a_revoked_app_token_is_shown(slack: SlackStandin, tmp_path: Path) -> None:
    slack.world.app_tokens.clear()
    async with SlackPitcrew(
        tmp_path / "p", slack, transport="socket", config={"mode": "observe"}, wait_connected=False
    ) as pitcrew:
        detail = await _until_socket(pitcrew, connected=False)
        assert "invalid_auth" in detail["reason"], detail
    assert slack.socket.tickets == {} and not slack.socket.connections


async def test_an_app_token_without_connections_write_is_shown(slack: SlackStandin, tmp_path: Path) -> None:
    slack.world.app_token_scopes.clear()
    async with SlackPitcrew(
        tmp_path / "p", slack, transport="socket", config={"mode": "observe"}, wait_connected=False
    ) as pitcrew:
        detail = await _until_socket(pitcrew, connected=False)
        assert "missing_scope" in detail["reason"] and "connections:write" in detail["reason"], detail


async def test_a_half_open_socket_is_noticed_and_replaced(slack: SlackStandin, tmp_path: Path) -> None:
    slack.api.allow("rate_tiers")  # the replacement opens a new URL within the minute (Tier 1)
    async with SlackPitcrew(tmp_path / "p", slack, transport="socket", config={"mode": "observe"}) as pitcrew:
        await _until_socket(pitcrew, connected=True)
        opened = len(slack.api.calls_to("apps.connections.open"))
        slack.socket.answer_pings = False
        await _until_socket(pitcrew, connected=False)
        assert slack.socket.pings_unanswered > 0
        slack.socket.answer_pings = True
        await _until_socket(pitcrew, connected=True)
        assert len(slack.api.calls_to("apps.connections.open")) > opened  # a new connection
        assert "mode *observe*" in await pitcrew.slash("status")
