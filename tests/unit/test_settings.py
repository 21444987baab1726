"""Settings: one mode normaliser.

Cases: every spelling of a mode in ``mode``, ``playbook_modes``, ``PITCREW_MODE`` and
``PITCREW_PLAYBOOK_MODES`` (and the cross-check that reads the normalised value); an unknown
mode listing the valid ones.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from bot.config import ConfigError, Settings, load_config
from bot.domain.policy import Mode, Policy

SPELLINGS = [
    ("observe", Mode.OBSERVE),
    ("OBSERVE", Mode.OBSERVE),
    ("approve", Mode.APPROVE),
    ("APPROVE", Mode.APPROVE),
    ("Approve", Mode.APPROVE),
    ("auto", Mode.AUTO),
    ("Auto", Mode.AUTO),
    ("aUtO", Mode.AUTO),
]
VALID_MODES = "Input should be 'observe', 'approve' or 'auto'"


@pytest.fixture(autouse=True)
def isolated(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for name in [n for n in os.environ if n.startswith("PITCREW_")]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("PITCREW_STORE__PATH", str(tmp_path / "none.db"))


def from_yaml(tmp_path: Path, text: str) -> Settings:
    path = tmp_path / "pitcrew.yaml"
    path.write_text(text)
    return load_config(path).settings


def refusal(tmp_path: Path, text: str) -> str:
    path = tmp_path / "pitcrew.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as caught:
        load_config(path)
    return str(caught.value)


# -- one normaliser for modes ------------------------------------------------------------


@pytest.mark.parametrize(("spelling", "mode"), SPELLINGS)
def test_mode_accepts_any_case(spelling: str, mode: Mode) -> None:
    assert Mode(spelling) is mode


@pytest.mark.parametrize(("spelling", "mode"), SPELLINGS)
def test_mode_key_in_yaml(tmp_path: Path, spelling: str, mode: Mode) -> None:
    settings = from_yaml(tmp_path, f"mode: {spelling}\napprovals: {{approvers: [alice]}}\n")
    assert settings.mode is mode


@pytest.mark.parametrize(("spelling", "mode"), SPELLINGS)
def test_playbook_modes_in_yaml(tmp_path: Path, spelling: str, mode: Mode) -> None:
    settings = from_yaml(
        tmp_path, f"playbook_modes: {{replace-node: {spelling}}}\napprovals: {{approvers: [a]}}\n"
    )
    assert settings.playbook_modes == {"replace-node": mode}


@pytest.mark.parametrize(("spelling", "mode"), SPELLINGS)
def test_mode_from_the_environment(monkeypatch: pytest.MonkeyPatch, spelling: str, mode: Mode) -> None:
    monkeypatch.setenv("PITCREW_MODE", spelling)
    monkeypatch.setenv("PITCREW_PLAYBOOK_MODES", f'{{"reset-gpu": "{spelling}"}}')
    monkeypatch.setenv("PITCREW_APPROVALS__APPROVERS", '["alice"]')
    policy = load_config().policy
    assert policy.mode is mode
    assert policy.mode_for("reset-gpu") is mode


def test_the_domain_model_normalises_too() -> None:
    policy = Policy.model_validate({"mode": "AUTO", "playbook_modes": {"replace-node": "APPROVE"}})
    assert (policy.mode, policy.mode_for("replace-node")) == (Mode.AUTO, Mode.APPROVE)


def test_an_upper_case_approve_still_needs_approvers(tmp_path: Path) -> None:
    # The cross-check sees the normalised mode, whichever key it came from.
    assert "approvals.approvers: mode approve needs" in refusal(tmp_path, "mode: APPROVE\n")
    assert "approvals.approvers: mode approve needs" in refusal(
        tmp_path, "playbook_modes: {replace-node: Approve}\n"
    )


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("mode: sometimes\n", f"mode: {VALID_MODES}"),
        ("mode: 3\n", f"mode: {VALID_MODES}"),
        ("playbook_modes: {replace-node: often}\n", f"playbook_modes.replace-node: {VALID_MODES}"),
    ],
)
def test_an_unknown_mode_lists_the_valid_ones(tmp_path: Path, text: str, says: str) -> None:
    assert says in refusal(tmp_path, text)


def test_an_unknown_mode_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PITCREW_MODE", "sometimes")
    with pytest.raises(ConfigError, match=f"^mode: {VALID_MODES}$"):
        load_config()
    with pytest.raises(ValueError, match="'sometimes' is not a valid Mode"):
        Mode("sometimes")
