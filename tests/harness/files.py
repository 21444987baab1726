"""Files made read-only even for root, for tests of a store that cannot write (a pytest plugin,
``tests/conftest.py``).

``immutable(*paths, on=True)`` sets (or clears) ``chattr +i`` on each path: no write, rename or
new file inside, whoever asks (root included; ``access(2)`` says so too). Every flag set is
cleared at teardown. Where ``chattr +i`` does not work (not root, a filesystem without it) the
test fails under CI and is skipped elsewhere (``tests.harness.proc.unavailable``).
"""

from __future__ import annotations

import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.harness.proc import require_binary, unavailable


@pytest.fixture
def immutable(tmp_path: Path) -> Iterator[Callable[..., None]]:
    """``chattr +i`` (read-only even for root); every flag set is cleared at teardown."""
    chattr = require_binary("chattr", "e2fsprogs")
    flagged: list[Path] = []
    probe = tmp_path / "chattr-probe"
    probe.touch()
    if subprocess.run([chattr, "+i", str(probe)], capture_output=True).returncode != 0:
        unavailable(f"chattr +i does not work on {tmp_path} (not root, or the filesystem lacks it)")
    subprocess.run([chattr, "-i", str(probe)], check=True)

    def set_flag(*paths: Path, on: bool = True) -> None:
        for path in paths:
            if path.exists():
                subprocess.run([chattr, "+i" if on else "-i", str(path)], check=True)
                flagged.append(path)

    yield set_flag
    for path in flagged:
        subprocess.run([chattr, "-i", str(path)], capture_output=True)
