"""``integrations.notifier: slack`` and the ``slack:`` section are checked at start.

Cases: a complete Socket Mode and a complete HTTP mode configuration load; without a bot token, a
channel, or the transport's secret the start is refused with a line naming the key; an empty secret
file is refused without echoing anything; unknown keys in ``slack:`` are errors.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from bot.config import ConfigError, load_config


def _config(tmp_path: Path, slack: dict[str, Any]) -> Path:
    path = tmp_path / "pitcrew.yaml"
    path.write_text(yaml.safe_dump({"integrations": {"notifier": "slack"}, "slack": slack}))
    return path


def _secret(tmp_path: Path, name: str, value: str = "s3cret") -> str:
    (tmp_path / name).write_text(value)
    return str(tmp_path / name)


def test_complete_configurations_load(tmp_path: Path) -> None:
    bot = _secret(tmp_path, "bot.token", "xoxb-1")
    socket = load_config(
        _config(
            tmp_path, {"bot_token_file": bot, "app_token_file": _secret(tmp_path, "app"), "channel": "C1"}
        )
    )
    assert socket.settings.slack.transport == "socket"
    http = load_config(
        _config(
            tmp_path,
            {
                "bot_token_file": bot,
                "transport": "http",
                "signing_secret_file": _secret(tmp_path, "sig"),
                "channel": "C1",
            },
        )
    )
    assert http.settings.slack.transport == "http" and http.settings.slack.digest_threshold == 5


@pytest.mark.parametrize(
    ("slack", "named"),
    [
        ({"channel": "C1"}, "slack.bot_token_file"),
        ({"bot_token_file": "BOT", "app_token_file": "APP"}, "slack.channel"),
        ({"bot_token_file": "BOT", "channel": "C1"}, "app_token_file"),
        ({"bot_token_file": "BOT", "channel": "C1", "transport": "http"}, "signing_secret_file"),
        ({"bot_token_file": "BOT", "channel": "C1", "app_token_file": "EMPTY"}, "slack.app_token_file"),
        (
            {"bot_token_file": "BOT", "channel": "C1", "app_token_file": "APP", "token": "xoxb-inline"},
            "token",
        ),
    ],
)
def test_incomplete_slack_is_refused(tmp_path: Path, slack: dict[str, Any], named: str) -> None:
    files = {
        "BOT": _secret(tmp_path, "bot"),
        "APP": _secret(tmp_path, "app"),
        "EMPTY": _secret(tmp_path, "e", ""),
    }
    slack = {k: files.get(v, v) if isinstance(v, str) else v for k, v in slack.items()}
    with pytest.raises(ConfigError) as caught:
        load_config(_config(tmp_path, slack))
    assert named in str(caught.value)
    assert "s3cret" not in str(caught.value)
