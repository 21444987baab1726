"""The CLI writing into a device that takes nothing (``pitcrew catalog > /dev/full``).

Cases: ``catalog`` (more output than one buffer), ``catalog --json``, ``plan`` and
``check-config`` (a few lines, written at the final flush) print one line on stderr naming
the failure — no traceback, nothing at interpreter exit — and exit 1. Run as real processes
with stdout on ``/dev/full``, which fails every write with ENOSPC.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import FIXTURES

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    "argv",
    [
        ["catalog"],
        ["catalog", "--json"],
        ["plan", str(FIXTURES / "alertmanager" / "xid79-firing.json")],
        ["check-config"],
    ],
    ids=["catalog", "catalog-json", "plan", "check-config"],
)
def test_a_full_device_is_one_line_and_exit_1(argv: list[str], tmp_path: Path) -> None:
    with open("/dev/full", "wb") as full:
        done = subprocess.run(
            [sys.executable, "-m", "bot.cli", *argv],
            stdout=full,
            stderr=subprocess.PIPE,
            cwd=REPO,
            env={**os.environ, "PITCREW_STORE__PATH": str(tmp_path / "pitcrew.db")},
            timeout=60,
            check=False,
        )
    assert done.stderr.decode().splitlines() == ["pitcrew: cannot write the output: No space left on device"]
    assert done.returncode == 1
