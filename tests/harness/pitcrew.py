"""pitcrew as a subprocess for tests: the ``pitcrew_factory`` fixture over ``bot.demo.pitcrew.Pitcrew``.

The runner itself (start, SIGKILL, HTTP, incidents, the far side's journal) is the proving
ground's, re-exported here so existing imports keep working; this module owns only the
fixture, which stops every process it built.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from bot.demo.assets import REPO
from bot.demo.pitcrew import Pitcrew

__all__ = ["REPO", "Pitcrew", "pitcrew_factory"]


@pytest.fixture
def pitcrew_factory(tmp_path: Path) -> Iterator[Any]:
    """Build (not start) pitcrew processes; all are stopped at teardown."""
    made: list[Pitcrew] = []

    def make(name: str = "pitcrew", **kwargs: Any) -> Pitcrew:
        server = Pitcrew(tmp_path / name, **kwargs)
        made.append(server)
        return server

    yield make
    for server in made:
        server.stop()
