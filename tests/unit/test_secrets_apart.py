"""One secret, one role: pitcrew refuses to start with a secret shared by two roles.

Cases: for every pair among the webhook's token (or its basic-auth password), the read token,
the admin token and Slack's signing secret, the same file or two files holding the same
secret is refused by ``load_config`` (what ``pitcrew serve`` runs first) and by ``pitcrew
check-config`` (exit 1), with one line naming both keys and never the secret; distinct
secrets load.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from bot.cli import main
from bot.config import ConfigError, load_config

SECRET = "s3cret-shared-by-two-roles"
ROLES: dict[str, Callable[[str], dict[str, Any]]] = {
    "server.auth.bearer_token_file": lambda path: {"server": {"auth": {"bearer_token_file": path}}},
    "server.auth.basic_auth.password_file": lambda path: {
        "server": {"auth": {"basic_auth": {"username": "alertmanager", "password_file": path}}}
    },
    "server.auth.read_token_file": lambda path: {"server": {"auth": {"read_token_file": path}}},
    "server.auth.admin_token_file": lambda path: {"server": {"auth": {"admin_token_file": path}}},
    "slack.signing_secret_file": lambda path: {"slack": {"signing_secret_file": path}},
}
PAIRS = [
    (one, other)
    for one, other in itertools.combinations(ROLES, 2)
    # The webhook authenticates with a bearer token or basic auth, never both.
    if {one, other} != {"server.auth.bearer_token_file", "server.auth.basic_auth.password_file"}
]


def _merge(*parts: dict[str, Any]) -> dict[str, Any]:
    merged: dict[str, Any] = {}
    for part in parts:
        for key, value in part.items():
            merged[key] = _merge(merged[key], value) if isinstance(merged.get(key), dict) else value
    return merged


def _settings(tmp_path: Path, one: str, other: str, same: str) -> dict[str, Any]:
    first = tmp_path / "first.secret"
    first.write_text(SECRET + "\n")
    second = first
    if same != "file":
        second = tmp_path / "second.secret"
        second.write_text(SECRET if same == "token" else "an-entirely-different-secret")
    return _merge(ROLES[one](str(first)), ROLES[other](str(second)))


@pytest.mark.parametrize(("one", "other"), PAIRS)
@pytest.mark.parametrize("same", ["file", "token"])
def test_a_secret_shared_by_two_roles_is_refused(one: str, other: str, same: str, tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as refused:
        load_config(None, **_settings(tmp_path, one, other, same))
    [line] = [ln for ln in str(refused.value).splitlines() if "own secret" in ln]
    assert line.startswith(f"{other}: ") and f"({one})" in line
    assert SECRET not in str(refused.value)


@pytest.mark.parametrize(("one", "other"), PAIRS)
def test_distinct_secrets_load(one: str, other: str, tmp_path: Path) -> None:
    load_config(None, **_settings(tmp_path, one, other, "different"))


def test_check_config_refuses_a_basic_password_that_is_the_admin_token(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "password").write_text(SECRET + "\n")
    (tmp_path / "admin").write_text(SECRET)
    (tmp_path / "pitcrew.yaml").write_text(
        "server:\n  auth:\n"
        f"    basic_auth: {{username: alertmanager, password_file: {tmp_path / 'password'}}}\n"
        f"    admin_token_file: {tmp_path / 'admin'}\n"
    )
    assert main(["check-config", "-c", str(tmp_path / "pitcrew.yaml")]) == 1
    err = capsys.readouterr().err
    assert (
        "server.auth.admin_token_file: the admin token is the webhook's basic-auth password "
        "(server.auth.basic_auth.password_file)"
    ) in err
    assert SECRET not in err
