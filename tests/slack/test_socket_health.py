"""Socket Mode that cannot work says so: in ``/readyz``'s detail, in a metric, within a minute.

Cases (pitcrew in this process, Socket Mode against the stand-in):
- the app-level token revoked (``apps.connections.open`` answers ``invalid_auth``) or without
  ``connections:write`` (``missing_scope``): pitcrew starts and stays ready (remediation needs no
  Slack), ``/readyz`` shows ``slack_socket`` disconnected with Slack's reason and the scope, and
  ``pitcrew_slack_socket_connected`` is 0; it never opened a websocket. Before: no sign anywhere
  (slack_sdk only logged and retried);
- a half-open connection (the far end stops answering pings): ``/readyz`` and the metric turn to
  disconnected, and once Slack answers again a new connection replaces it and both say connected;
- the first dial of Slack's URL fails (HTTP 503 before the upgrade, which spends the single-use
  URL): pitcrew gives the connection up within ``give_up``, opens a fresh URL and connects, and
  ``/readyz``, the metric and ``/pitcrew`` say so; no aiohttp session is left unclosed. Before:
  slack_sdk dialled the spent URL every ping interval forever (401 each time) and Socket Mode
  stayed down until pitcrew restarted; pitcrew stopped meanwhile stops at once, its task and
  sessions gone.
"""

from __future__ import annotations

import asyncio
import gc
import json
import time
from pathlib import Path
from typing import Any

import aiohttp

from proving_ground.slack.server import SlackStandin
from tests.slack.pitcrew_app import SlackPitcrew, until

#: How long pitcrew gives a connection that is not up before it replaces it (``slack.socket_give_up``,
#: its least; the default is 30 s).
GIVE_UP = 5.0


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


async def _until_socket(
    pitcrew: SlackPitcrew, connected: bool, timeout: float = 60.0, reason: str = ""
) -> dict[str, Any]:
    """Until ``/readyz`` and the metric say ``connected`` (with ``reason`` in the reason, if given)."""
    deadline = time.monotonic() + timeout
    while True:
        detail, gauge = await _socket(pitcrew)
        # "not started" is no verdict yet: wait for what the connection attempt found.
        settled = detail.get("reason") != "not started" and reason in detail.get("reason", "")
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


#: With room for a fresh URL and its dial.
GIVE_UP_AND_DIAL = GIVE_UP + 30.0


def _open_sessions() -> set[int]:
    """The aiohttp client sessions alive and not closed (a handler dropped unclosed leaves its own)."""
    gc.collect()
    return {id(o) for o in gc.get_objects() if isinstance(o, aiohttp.ClientSession) and not o.closed}


async def test_a_failed_first_dial_is_given_up_for_a_fresh_url(slack: SlackStandin, tmp_path: Path) -> None:
    slack.api.allow("rate_tiers")  # the fresh URL is opened within the minute of the first (Tier 1)
    slack.socket.fail_dials(1)  # Slack's edge answers the first dial 503; that URL is spent
    before = _open_sessions()
    config = {"mode": "observe", "slack": {"socket_give_up": f"{GIVE_UP:g}s"}}
    async with SlackPitcrew(
        tmp_path / "p", slack, transport="socket", config=config, wait_connected=False
    ) as pitcrew:
        given_up = await _until_socket(
            pitcrew, connected=False, timeout=GIVE_UP_AND_DIAL, reason="did not connect"
        )
        assert f"within {GIVE_UP:g}s" in given_up["reason"], (
            given_up
        )  # the configured give_up, not the default
        detail = await _until_socket(pitcrew, connected=True, timeout=GIVE_UP_AND_DIAL)
        assert detail["reason"] == "connected", detail
        assert slack.socket.dials_failed == 1
        assert len(slack.api.calls_to("apps.connections.open")) == 2  # a fresh URL, once
        assert len(slack.socket.connections) == 1
        assert "mode *observe*" in await pitcrew.slash("status")
    assert _open_sessions() <= before  # the given-up client's session was closed, and the last one's


async def test_stopping_while_the_first_dial_fails_leaves_nothing_behind(
    slack: SlackStandin, tmp_path: Path
) -> None:
    slack.socket.fail_dials(1)
    before = _open_sessions()
    async with SlackPitcrew(
        tmp_path / "p", slack, transport="socket", config={"mode": "observe"}, wait_connected=False
    ) as pitcrew:
        await until(lambda: slack.socket.dials_failed == 1, what="the first dial refused")
        detail, _ = await _socket(pitcrew)
        assert detail["connected"] is False and detail["reason"] == "connecting", detail
        stopping = time.monotonic()
    assert time.monotonic() - stopping < 5.0  # stopped at once, not after give_up
    assert not [t for t in asyncio.all_tasks() if t.get_name() == "pitcrew-slack-socket-mode"]
    assert _open_sessions() <= before
