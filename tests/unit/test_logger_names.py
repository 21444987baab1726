"""Every logger pitcrew's modules create is named for the product (``pitcrew.…``), never ``bot.…``.

Operators set levels and filters by logger name; the import package is called ``bot`` only
because the project's layout names it so.
"""

from __future__ import annotations

import importlib
import logging
import pkgutil

import bot
from bot import logger


def test_a_module_name_becomes_a_pitcrew_logger_name() -> None:
    assert logger("bot.engine.flow").name == "pitcrew.engine.flow"


def test_no_module_of_the_package_creates_a_logger_outside_pitcrew() -> None:
    for module in pkgutil.walk_packages(bot.__path__, "bot."):
        importlib.import_module(module.name)
    names = [name for name in logging.Logger.manager.loggerDict if name == "bot" or name.startswith("bot.")]
    assert names == [], names
    ours = [name for name in logging.Logger.manager.loggerDict if name.startswith("pitcrew.")]
    assert "pitcrew.engine.flow" in ours and "pitcrew.store.writer" in ours, ours
