"""``pitcrew check-config --live`` reaches the far sides behind the outbox: Slack and Grafana.

pitcrew runs as the installer runs it (``python -m bot.cli check-config --live``, a subprocess);
the Slack stand-in and the Grafana stand-in answer over HTTP from their own threads.

- Slack (``auth.test``, the bot in the channel) and Grafana (``/api/health``, the token reads
  annotations) both ``ok``, exit 0, and nothing written to either;
- the Slack stand-in answering ``missing_scope`` (the token lacks ``channels:read``): exit 1,
  the scope named on stderr, Grafana's line still ``ok``;
- the bot not in the configured channel: exit 1 naming the channel;
- a Grafana token Grafana refuses: exit 1 naming the token, Slack's line still ``ok``;
- Grafana unreachable: exit 1, its line ``FAIL``;
- ``grafana.api_url`` set beside a public ``grafana.url``: the probe calls the API there;
- Socket Mode with an app-level token Slack refuses (revoked: ``invalid_auth``; without
  ``connections:write``: ``missing_scope``): exit 1 naming ``slack.app_token_file`` and the scope
  (before: ``ok``, the app token was never asked about).
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from proving_ground.proc import free_port
from proving_ground.slack.server import SlackStandin
from proving_ground.slack.threaded import threaded_standin
from proving_ground.slack.world import APP_TOKEN, BOT_TOKEN, SIGNING_SECRET
from tests.grafana.server import TOKEN, GrafanaStandin
from tests.grafana.threaded import threaded_grafana
from tests.harness import check_config


@pytest.fixture
def slack() -> Iterator[SlackStandin]:
    with threaded_standin() as standin:
        yield standin


@pytest.fixture
def grafana() -> Iterator[GrafanaStandin]:
    with threaded_grafana() as standin:
        yield standin


def check_live(
    tmp_path: Path,
    slack: SlackStandin,
    grafana_url: str,
    *,
    channel: str = "C0GPUOPS",
    token: str = TOKEN,
    transport: str = "http",
    grafana_api: str | None = None,
) -> subprocess.CompletedProcess[str]:
    (tmp_path / "bot.token").write_text(BOT_TOKEN + "\n")
    (tmp_path / "signing.secret").write_text(SIGNING_SECRET + "\n")
    (tmp_path / "app.token").write_text(APP_TOKEN + "\n")
    (tmp_path / "grafana.token").write_text(token + "\n")
    secret = (
        {"signing_secret_file": str(tmp_path / "signing.secret")}
        if transport == "http"
        else {"app_token_file": str(tmp_path / "app.token")}
    )
    settings: dict[str, Any] = {
        "integrations": {"notifier": "slack"},
        "slack": {
            "bot_token_file": str(tmp_path / "bot.token"),
            "channel": channel,
            "base_url": slack.base_url,
            "transport": transport,
            **secret,
        },
        "grafana": {"url": grafana_url, "token_file": str(tmp_path / "grafana.token")},
    }
    if grafana_api is not None:
        settings["grafana"]["api_url"] = grafana_api
    return check_config.check_live(tmp_path, settings)


def status_of(stdout: str, system: str) -> str:
    return check_config.line_of(stdout, system).split()[0]


def test_slack_and_grafana_green(tmp_path: Path, slack: SlackStandin, grafana: GrafanaStandin) -> None:
    result = check_live(tmp_path, slack, grafana.url)
    assert result.returncode == 0, result.stdout + result.stderr
    assert status_of(result.stdout, "slack") == "ok"
    assert "bot pitcrew in team Pit Crew, channel C0GPUOPS" in result.stdout
    assert status_of(result.stdout, "grafana") == "ok"
    assert f"Grafana 11.3.0 at {grafana.url}: token accepted" in result.stdout
    assert "(annotations)" in result.stdout and "(notices)" in result.stdout
    assert result.stderr == ""
    assert {c.method for c in slack.api.calls} == {"auth.test", "conversations.info"}
    assert not slack.api.messages and not grafana.world.annotations
    assert {m for m, _, _ in grafana.world.requests} == {"GET"}


def test_grafana_s_api_is_called_where_api_url_says(
    tmp_path: Path, slack: SlackStandin, grafana: GrafanaStandin
) -> None:
    """People open Grafana at its public address, pitcrew calls it at the in-cluster Service: the
    probe reaches ``api_url``, never ``url`` (here an address that does not resolve)."""
    public = "https://grafana.example.invalid"
    result = check_live(tmp_path, slack, public, grafana_api=grafana.url)
    assert result.returncode == 0, result.stdout + result.stderr
    assert status_of(result.stdout, "grafana") == "ok"
    assert f"Grafana 11.3.0 at {grafana.url}: token accepted" in result.stdout
    assert public not in result.stdout
    assert {m for m, _, _ in grafana.world.requests} == {"GET"}


def test_a_missing_slack_scope_is_named(tmp_path: Path, slack: SlackStandin, grafana: GrafanaStandin) -> None:
    slack.world.scopes.discard("channels:read")
    result = check_live(tmp_path, slack, grafana.url)
    assert result.returncode == 1
    assert status_of(result.stdout, "slack") == "FAIL"
    assert status_of(result.stdout, "grafana") == "ok"
    assert "pitcrew: check-config --live: missing slack: channels:read" in result.stderr
    assert "grafana" not in result.stderr


def test_the_bot_outside_the_channel_is_named(
    tmp_path: Path, slack: SlackStandin, grafana: GrafanaStandin
) -> None:
    result = check_live(tmp_path, slack, grafana.url, channel="C0ELSEWHERE")
    assert result.returncode == 1
    assert "missing slack: channel C0ELSEWHERE" in result.stderr


def test_a_grafana_token_refused_is_named(
    tmp_path: Path, slack: SlackStandin, grafana: GrafanaStandin
) -> None:
    result = check_live(tmp_path, slack, grafana.url, token="glsa_revoked")
    assert result.returncode == 1
    assert status_of(result.stdout, "grafana") == "FAIL"
    assert status_of(result.stdout, "slack") == "ok"
    assert "pitcrew: check-config --live: missing grafana: a valid service-account token" in result.stderr
    assert "glsa_revoked" not in result.stdout + result.stderr


def test_grafana_unreachable_fails(tmp_path: Path, slack: SlackStandin) -> None:
    result = check_live(tmp_path, slack, f"http://127.0.0.1:{free_port()}")
    assert result.returncode == 1
    assert status_of(result.stdout, "grafana") == "FAIL"
    assert "missing grafana:" in result.stderr and "unreachable" in result.stderr


def test_socket_mode_checks_the_app_token(
    tmp_path: Path, slack: SlackStandin, grafana: GrafanaStandin
) -> None:
    slack.api.allow("rate_tiers")  # three checks within a minute; apps.connections.open is Tier 1
    good = check_live(tmp_path, slack, grafana.url, transport="socket")
    assert good.returncode == 0, good.stdout + good.stderr
    assert "Socket Mode app token ok" in good.stdout

    slack.world.app_tokens.clear()  # revoked
    revoked = check_live(tmp_path, slack, grafana.url, transport="socket")
    assert revoked.returncode == 1
    assert status_of(revoked.stdout, "slack") == "FAIL"
    assert "slack.app_token_file" in revoked.stdout and "invalid_auth" in revoked.stdout

    slack.world.app_tokens.add(APP_TOKEN)
    slack.world.app_token_scopes.clear()
    scopeless = check_live(tmp_path, slack, grafana.url, transport="socket")
    assert scopeless.returncode == 1
    assert "slack.app_token_file" in scopeless.stdout and "connections:write" in scopeless.stdout
    assert "missing slack: connections:write" in scopeless.stderr
    assert not slack.socket.connections
