"""The README stays true: every configuration key is documented, every documented command exists,
every integration error reason is explained."""

from __future__ import annotations

import re
import typing
from collections.abc import Iterator
from pathlib import Path

import pytest
from pydantic import BaseModel

from bot.cli import _parser
from bot.config import Settings
from bot.engine.errors import Reason

README = (Path(__file__).resolve().parents[2] / "README.md").read_text()
OPAQUE = {"playbooks", "catalog.overrides", "playbook_modes"}  # free-form maps, documented by example


def keys(model: type[BaseModel], prefix: str = "") -> Iterator[str]:
    for name, field in model.model_fields.items():
        key = f"{prefix}{field.alias or name}"  # a domain model's alias is the key users write
        nested = [
            c
            for c in (field.annotation, *typing.get_args(field.annotation))
            if isinstance(c, type) and issubclass(c, BaseModel)
        ]
        if nested and key not in OPAQUE and typing.get_origin(field.annotation) is not dict:
            yield from keys(nested[0], key + ".")
        else:
            yield key


@pytest.mark.parametrize("key", sorted(keys(Settings)))
def test_every_config_key_is_in_the_readme(key: str) -> None:
    assert f"`{key}`" in README, f"README configuration reference misses {key}"


def test_documented_cli_commands_exist() -> None:
    commands = set(re.findall(r"^pitcrew ([a-z-]+)", README, flags=re.M))
    parser = _parser()
    known = set(parser._subparsers._group_actions[0].choices)  # type: ignore[union-attr]
    assert commands, "README shows no pitcrew command"
    assert commands <= known, commands - known


def test_readme_shows_the_test_command_ci_runs() -> None:
    root = Path(__file__).resolve().parents[2]
    ci = (root / ".ci" / "run").read_text()
    assert "scripts/test" in ci and "scripts/setup dev" in ci
    assert "python -m pytest -q" in (root / "scripts" / "test").read_text()
    assert "scripts/test" in README and ".ci/run" in README


def test_readme_opens_with_the_two_set_up_commands() -> None:
    root = Path(__file__).resolve().parents[2]
    setup = README[: README.index("## Using it")]
    assert "scripts/demo" in setup and "scripts/test" in setup
    assert "python -m proving_ground" in (root / "scripts" / "demo").read_text()
    makefile = (root / "Makefile").read_text()
    assert "scripts/demo" in makefile and "scripts/test" in makefile


def test_every_integration_error_reason_is_explained() -> None:
    section = README[README.index("**Integration error reasons**") :]
    section = section[: section.index("\n\n")]
    assert [r.value for r in Reason if f"`{r.value}`" not in section] == []
