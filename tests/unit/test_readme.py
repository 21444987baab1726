"""The README stays true where a test can tell.

Cases: every configuration key is documented, and every key the configuration reference names is
a setting, with the default the settings give it (where the reference shows one as a literal);
every documented command exists; every path of this repository the README names exists; the
README promises nothing for later ("until then", "comes with …", "not … yet"): what it describes
is there; every integration error reason is explained.
"""

from __future__ import annotations

import argparse
import re
import typing
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest
import yaml
from pydantic import BaseModel
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

from bot.cli import _parser
from bot.config import Settings
from bot.domain.durations import parse_duration
from bot.engine.errors import Reason

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()
REFERENCE = README[README.index("## Configuration") : README.index("## Install in a cluster")]
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
    assert parser._subparsers is not None  # the parser has subcommands
    known = set(typing.cast(dict[str, argparse.ArgumentParser], parser._subparsers._group_actions[0].choices))
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


def _reference_rows() -> list[tuple[list[str], str]]:
    """The configuration reference: the keys of each row and its default cell."""
    rows = []
    for line in REFERENCE.splitlines():
        if line.startswith("| `"):
            cells = [c.strip() for c in line.strip().strip("|").split(" | ")]
            rows.append((re.findall(r"`([^`]+)`", cells[0]), cells[1]))
    return rows


def _field(key: str) -> FieldInfo | None:
    model: type[BaseModel] = Settings
    field = None
    for part in key.split("."):
        field = next((f for n, f in model.model_fields.items() if (f.alias or n) == part), None)
        if field is None:
            return None
        nested = [
            c
            for c in (field.annotation, *typing.get_args(field.annotation))
            if isinstance(c, type) and issubclass(c, BaseModel)
        ]
        if nested:
            model = nested[0]
    return field


def test_every_key_the_reference_names_is_a_setting() -> None:
    named = [key for keys, _ in _reference_rows() for key in keys]
    assert len(named) > 100
    assert [key for key in named if _field(key) is None] == []


def _same(shown: str, default: object) -> bool:
    """Whether a default as the reference shows it (a literal, or ``—`` for none) is ``default``."""
    if shown == "—":
        return default in (None, "", [], ())
    if isinstance(default, timedelta):
        return parse_duration(shown) == default
    value = yaml.safe_load(shown) if shown.startswith("[") else yaml.safe_load(f"[{shown}]")
    if isinstance(default, dict):  # a map, or a label selector
        return (
            yaml.safe_load(shown) == default
            if shown.startswith("{")
            else shown == ",".join(f"{k}={v}" for k, v in default.items())
        )
    if isinstance(default, (list, tuple)):
        return [str(v) for v in value] == [str(v) for v in default]
    return len(value) == 1 and value[0] == default


def _literal_defaults() -> list[tuple[str, str]]:
    pairs = []
    for keys, cell in _reference_rows():
        shown = [cell] if len(keys) == 1 else [part.strip() for part in cell.split(", ")]
        if len(shown) != len(keys):
            continue  # one default for several keys, said in words
        for key, text in zip(keys, shown, strict=True):
            literal = re.fullmatch(r"`([^`]*)`|—", text)
            if literal is not None:
                pairs.append((key, literal.group(1) if literal.group(1) is not None else "—"))
    return pairs


@pytest.mark.parametrize(("key", "shown"), _literal_defaults())
def test_the_reference_shows_each_setting_s_default(key: str, shown: str) -> None:
    field = _field(key)
    assert field is not None
    if field.is_required():  # no default: the reference shows none
        assert shown == "—", f"README gives the required {key} a default {shown}"
        return
    default = field.default if field.default is not PydanticUndefined else field.default_factory()  # type: ignore[misc,call-arg]
    assert _same(shown, default), f"README says {key} defaults to {shown}; the settings say {default!r}"


#: Where this repository's files live; a backticked path starting with one of these must exist.
TOP = (
    "bot/",
    "deploy/",
    "docs/",
    "rules/",
    "alertmanager/",
    "grafana/",
    "scripts/",
    "bench/",
    "tests/",
    ".ci/",
    "proving_ground/",
)


def test_every_repository_path_the_readme_names_exists() -> None:
    prose = re.sub(
        r"```.*?```", "", README, flags=re.S
    )  # commands, not paths: `deploy/pitcrew` is a Deployment
    named = {
        path.rstrip("/.,:")
        for quoted in re.findall(r"`([^`]+)`", prose) + re.findall(r"\]\(([^)]+)\)", prose)
        if not re.search(r"[<>…*{}]", quoted)  # a pattern (`components/replace-<strategy>`), not a path
        for path in re.findall(r"(?:^|\s)(\.?[\w-]+/[\w./-]*)", quoted)
        if path.startswith(TOP)
    }
    assert len(named) > 30
    missing = [p for p in named if not (ROOT / p).exists() and not (ROOT / f"{p}.py").exists()]  # `bot/cli`
    assert sorted(missing) == []


#: Words that promise what is not there yet (the README describes what exists).
PROMISES = (
    r"\buntil then\b",
    r"\bcomes? with the\b",
    r"\bnot\b[^.|]*\byet\b",
    r"\bwill come\b",
    r"\bcoming\b",
)


def test_the_readme_promises_nothing_for_later() -> None:
    found = [m.group(0) for pattern in PROMISES for m in re.finditer(pattern, README, flags=re.I)]
    assert found == []
