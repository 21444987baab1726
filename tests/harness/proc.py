"""Shared helpers for tests that start real programs.

``unavailable`` is the one place that decides skip-or-fail: under ``CI=true`` a missing binary
or capability fails the test (CI installs everything and runs as root, so absence is a defect);
elsewhere it skips, saying what is missing (``require_binary``: the package to install).
``wait_until`` fails the test on timeout. Ports, stopping and log tails are the proving ground's
own (``proving_ground.proc``), re-exported here.
"""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import NoReturn

import pytest

from proving_ground.proc import find_binary

__all__ = ["in_ci", "require_binary", "talking_child", "unavailable", "wait_until"]

#: The checkout: where a child process imports ``bot`` from.
ROOT = Path(__file__).resolve().parents[2]


def in_ci() -> bool:
    return os.environ.get("CI", "").lower() in {"1", "true", "yes"}


def unavailable(message: str) -> NoReturn:
    """A capability a test needs is missing (root, a mount, a file flag): CI has them, so there it
    is a defect and the test fails; elsewhere a skip."""
    if in_ci():
        pytest.fail(message)
    pytest.skip(message)


def require_binary(name: str, package: str) -> str:
    """Path of ``name`` on PATH (or in /usr/sbin); fail under CI, skip elsewhere, if absent."""
    path = find_binary(name)
    if path:
        return path
    unavailable(f"{name} not found: apt-get install {package}")


def wait_until(
    predicate: Callable[[], object], *, timeout: float, interval: float = 0.05, what: str = ""
) -> None:
    """Poll ``predicate`` until true; fail the test with ``what`` on timeout."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(interval)
    pytest.fail(f"timed out after {timeout:.1f}s waiting for {what or predicate}")


def process_state(pid: int) -> str | None:
    """The kernel's one-letter state of a process (``T`` stopped, ``Z`` a zombie); ``None`` once
    it is gone. Read from ``/proc/PID/stat``, whose second field, the name, may hold spaces and
    parentheses: the state is the first word after its last ``)``."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return None


def talking_child(argv: list[str], ready: str = "open") -> subprocess.Popen[str]:
    """A process the test talks to by lines (its stdin and stdout), started in the checkout, once
    it has said ``ready`` (the store it opened is open); killed if it says anything else."""
    child = subprocess.Popen(argv, cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert child.stdout is not None
    said = child.stdout.readline().strip()
    if said != ready:
        child.kill()
        child.wait(timeout=30)
        pytest.fail(f"the child said {said!r}, not {ready!r}: {' '.join(argv[:3])}")
    return child
