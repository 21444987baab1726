"""``pitcrew check-config --live`` as the installer runs it: a subprocess on a config file.

``check_live(tmp_path, settings)`` writes ``settings`` (with a store in ``tmp_path``) to
``tmp_path/pitcrew.yaml`` and runs ``python -m bot.cli check-config --live`` on it;
``line_of(stdout, system)`` is the one report line of a far side (``ok slurm ...``).
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from proving_ground.assets import REPO


def check_live(
    tmp_path: Path, settings: Mapping[str, Any], env: Mapping[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """``env`` is laid over the test's environment (e.g. a PATH without Slurm's client)."""
    config = tmp_path / "pitcrew.yaml"
    config.write_text(yaml.safe_dump({"store": {"path": str(tmp_path / "pitcrew.db")}, **settings}))
    env = {**os.environ, "PYTHONPATH": os.environ.get("PYTHONPATH", str(REPO)), **(env or {})}
    return subprocess.run(
        [sys.executable, "-m", "bot.cli", "check-config", "--live", "-c", str(config)],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )


def line_of(stdout: str, system: str) -> str:
    """The line reporting ``system``; exactly one."""
    (line,) = [ln for ln in stdout.splitlines() if ln.split()[1:2] == [system]]
    return line
