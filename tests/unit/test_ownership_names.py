"""Each ownership rule has one name and one import path: ``bot.domain.ownership``.

Cases: no module of ``bot`` holds one of its functions or marks under another name (an alias
such as ``slurm_reason as pitcrew_reason``), lists one in its ``__all__`` or re-exports one
(``import X as X``); so whoever asks whether a mark is pitcrew's reads the one rule, and a
weaker copy (the ``resume_if_ours`` that once judged any ``pitcrew:`` reason ours) cannot
hide behind a second name.
"""

from __future__ import annotations

import importlib
import pkgutil
import re
from pathlib import Path
from types import ModuleType

import pytest

import bot
from bot.domain import ownership

#: The proving ground is not part of the service (and is moving out of ``bot``).
OUTSIDE = ("bot.demo",)
RULES = {
    name: value
    for name, value in vars(ownership).items()
    if not name.startswith("_") and (callable(value) or name.isupper()) and name != "annotations"
    if getattr(value, "__module__", ownership.__name__) == ownership.__name__
}


def _modules() -> list[ModuleType]:
    names = [
        info.name
        for info in pkgutil.walk_packages(bot.__path__, "bot.")
        if not info.name.startswith(OUTSIDE) and info.name != ownership.__name__
    ]
    return [importlib.import_module(name) for name in sorted(names)]


def test_the_rules_are_found() -> None:
    assert {"slurm_reason", "owns_slurm_reason", "is_pitcrew_reason", "owns_node", "OWNER_ANNOTATION"} <= set(
        RULES
    )


@pytest.mark.parametrize("module", _modules(), ids=lambda m: m.__name__)
def test_no_module_names_an_ownership_rule_otherwise_or_passes_it_on(module: ModuleType) -> None:
    renamed = [
        f"{name} is ownership.{rule}"
        for name, value in vars(module).items()
        for rule, original in RULES.items()
        if callable(original) and value is original and name != rule
    ]
    assert renamed == []
    assert set(getattr(module, "__all__", ())) & set(RULES) == set()
    source = Path(module.__file__ or "").read_text()
    assert re.findall(r"(\w+) as (\w+)", _ownership_imports(source)) == []


def _ownership_imports(source: str) -> str:
    """The text of every ``from bot.domain.ownership import …`` statement in ``source``."""
    return "\n".join(
        m.group(0) for m in re.finditer(r"from bot\.domain\.ownership import (\([^)]*\)|[^\n]*)", source)
    )
