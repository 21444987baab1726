"""``check-config --live`` for Slack: the probe pitcrew builds from its settings, against the stand-in.

Cases: a good token in the channel is ok; the bot not in the channel names the channel; a token
without ``channels:read`` names that scope (Slack's ``missing_scope`` with ``needed``); a revoked
token is not ok; Slack unreachable is not ok and does not raise. The incident destination answers
the same probe. In Socket Mode the app-level token is checked too (``apps.connections.open``; the
stand-in answers as Slack does): a revoked one names ``slack.app_token_file`` and ``invalid_auth``,
a bot token pasted in its place names the file and ``connections:write``, an app token without
``connections:write`` names that scope (each failed before: the probe never asked).
"""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

from bot.config import SlackSettings
from bot.engine.ports import Probe
from bot.integrations.slack import slack_probe
from bot.integrations.slack.outbound import SlackDestination, SlackLinks
from bot.store.sqlite import SqliteStore
from proving_ground.proc import free_port
from proving_ground.slack.server import SlackStandin
from proving_ground.slack.world import APP_TOKEN, BOT_TOKEN, TESTER_TOKEN


async def _probe(
    tmp_path: Path,
    base_url: str,
    channel: str = "C0GPUOPS",
    token: str = BOT_TOKEN,
    app_token: str = APP_TOKEN,
    transport: str = "http",
) -> Probe:
    token_file, app_token_file = tmp_path / "bot.token", tmp_path / "app.token"
    token_file.write_text(token + "\n")
    app_token_file.write_text(app_token + "\n")
    settings = SlackSettings(
        bot_token_file=token_file,
        app_token_file=app_token_file,
        signing_secret_file=app_token_file,  # http needs one; its content is not read by a probe
        channel=channel,
        base_url=base_url,
        transport=transport,
    )
    return await slack_probe(settings).probe()


async def test_probe_says_what_is_missing(slack: SlackStandin, tmp_path: Path) -> None:
    ok = await _probe(tmp_path, slack.base_url)
    assert (ok.system, ok.ok, ok.missing) == ("slack", True, ())
    assert ok.detail == "bot pitcrew in team Pit Crew, channel C0GPUOPS"

    outside = await _probe(tmp_path, slack.base_url, "C0ELSEWHERE")
    assert not outside.ok and outside.missing == ("channel C0ELSEWHERE",)

    slack.world.scopes.discard("channels:read")
    scope = await _probe(tmp_path, slack.base_url)
    assert not scope.ok and scope.missing == ("channels:read",)
    assert "channels:read" in scope.detail
    slack.world.scopes.add("channels:read")

    revoked = await _probe(tmp_path, slack.base_url, token="xoxb-revoked")
    assert not revoked.ok and "invalid_auth" in revoked.detail

    unreachable = await _probe(tmp_path, f"http://127.0.0.1:{free_port()}/api/")
    assert not unreachable.ok and "unreachable" in unreachable.detail
    assert {c.method for c in slack.api.calls} == {"auth.test", "conversations.info"}
    assert not slack.api.messages  # a probe changes nothing


async def test_socket_mode_probe_checks_the_app_token(slack: SlackStandin, tmp_path: Path) -> None:
    # Four checks within a minute: apps.connections.open is Tier 1 (1+ a minute).
    slack.api.allow("rate_tiers")
    ok = await _probe(tmp_path, slack.base_url, transport="socket")
    assert ok.ok and ok.detail.endswith("Socket Mode app token ok"), ok

    revoked = await _probe(tmp_path, slack.base_url, app_token="xapp-1-revoked", transport="socket")
    assert not revoked.ok and revoked.missing == ("slack.app_token_file",)
    assert "slack.app_token_file" in revoked.detail and "invalid_auth" in revoked.detail

    pasted = await _probe(tmp_path, slack.base_url, app_token=TESTER_TOKEN, transport="socket")
    assert not pasted.ok and pasted.missing == ("slack.app_token_file", "connections:write")
    assert "app-level token (xapp-)" in pasted.detail

    slack.world.app_token_scopes.clear()
    scopeless = await _probe(tmp_path, slack.base_url, transport="socket")
    assert not scopeless.ok and scopeless.missing == ("connections:write",)
    assert "slack.app_token_file" in scopeless.detail and "connections:write" in scopeless.detail
    assert not slack.socket.connections  # the URLs it got were never used


async def test_the_destination_answers_the_same_probe(slack: SlackStandin, tmp_path: Path) -> None:
    token_file = tmp_path / "bot.token"
    token_file.write_text(BOT_TOKEN)
    client = slack_probe(
        SlackSettings(
            bot_token_file=token_file,
            signing_secret_file=token_file,
            transport="http",
            channel="C0GPUOPS",
            base_url=slack.base_url,
        )
    ).client
    destination = SlackDestination(
        client, SqliteStore(tmp_path / "p.db"), SlackLinks("C0GPUOPS"), lambda: datetime.now(UTC)
    )
    assert await destination.probe() == await _probe(tmp_path, slack.base_url)
