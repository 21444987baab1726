"""Who may command pitcrew: the allowlist rule, actor validation, and the two tokens kept apart.

Cases: an allowlist entry matches the whole actor, or the bare name of a known channel
(``slack:``, ``cli:``, ``http:``) — never the tail of an arbitrary prefix (``mallory:alice``);
actors are one printable line of bounded length, a bare name (the channel is pitcrew's to
record: ``slack:U0ALICE`` in a body is refused); a configuration whose admin token is the
webhook's token (the same file, or another file with the same token) is refused, so whoever
can send alerts cannot pause pitcrew.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from bot.config import ConfigError, load_config
from bot.engine.commands import actor_problem, allowed

APPROVERS = ("alice", "slack:U0ALICE")


@pytest.mark.parametrize(
    ("actor", "ok"),
    [
        ("alice", True),
        ("slack:U0ALICE", True),
        ("cli:alice", True),
        ("http:alice", True),
        ("api:alice", False),
        ("slack:alice", True),
        ("mallory:alice", False),
        ("cli:mallory", False),
        ("U0ALICE", False),
        ("alice:", False),
        ("slack:slack:U0ALICE", False),
        ("ALICE", False),
        ("", False),
    ],
)
def test_allowlist_matches_the_whole_actor(actor: str, ok: bool) -> None:
    assert allowed(actor, APPROVERS) is ok


@pytest.mark.parametrize(
    ("actor", "problem"),
    [
        ("alice", None),
        ("Ålice Öberg", None),
        ("slack:U0ALICE", "bare name"),
        ("cli:alice", "bare name"),
        ("mallory:alice", "bare name"),
        ("", "say who you are"),
        ("   ", "say who you are"),
        (None, "say who you are"),
        (42, "say who you are"),
        ("alice\x00", "unprintable"),
        ("al\nice", "unprintable"),
        ("a" * 129, "longer than 128"),
        ("a" * 100_000, "longer than 128"),
    ],
)
def test_actors_are_one_bounded_printable_line(actor: object, problem: str | None) -> None:
    found = actor_problem(actor)
    assert (found is None) if problem is None else (found is not None and problem in found)


def _write(path: Path, text: str) -> Path:
    path.write_text(text + "\n")
    return path


@pytest.mark.parametrize("same", ["file", "token"])
def test_the_admin_token_may_not_be_the_webhook_token(same: str, tmp_path: Path) -> None:
    webhook = _write(tmp_path / "webhook.token", "s3cret-webhook")
    admin = webhook if same == "file" else _write(tmp_path / "admin.token", "s3cret-webhook")
    with pytest.raises(
        ConfigError, match=re.escape("server.auth.admin_token_file: the admin token is the webhook's token")
    ):
        load_config(
            None, server={"auth": {"bearer_token_file": str(webhook), "admin_token_file": str(admin)}}
        )
    other = _write(tmp_path / "other.token", "s3cret-admin")
    load_config(None, server={"auth": {"bearer_token_file": str(webhook), "admin_token_file": str(other)}})
