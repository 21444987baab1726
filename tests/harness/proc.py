"""Shared helpers for tests that start real programs.

``require_binary`` is the one place that decides skip-or-fail: under ``CI=true`` a missing
binary fails the test (CI installs everything, so absence is a defect); elsewhere it skips
with the package to install.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import pytest


def in_ci() -> bool:
    return os.environ.get("CI", "").lower() in {"1", "true", "yes"}


def require_binary(name: str, package: str) -> str:
    """Path of ``name`` on PATH (or in /usr/sbin); fail under CI, skip elsewhere, if absent."""
    path = shutil.which(name) or shutil.which(name, path="/usr/sbin:/sbin:/usr/bin")
    if path:
        return path
    message = f"{name} not found: apt-get install {package}"
    if in_ci():
        pytest.fail(message)
    pytest.skip(message)


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_until(
    predicate: Callable[[], bool], *, timeout: float, interval: float = 0.05, what: str = ""
) -> None:
    """Poll ``predicate`` until true; fail the test with ``what`` on timeout."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(interval)
    pytest.fail(f"timed out after {timeout:.1f}s waiting for {what or predicate}")


def stop_process(proc: subprocess.Popen[bytes], *, timeout: float = 10.0) -> None:
    """SIGTERM, then SIGKILL after ``timeout``; always reaps the child."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=5)


def tail(path: Path, lines: int = 40) -> str:
    """Last lines of a log file, for failure messages."""
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return f"(no {path})"
