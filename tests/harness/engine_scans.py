"""Waiting for the engine to have looked again, instead of a fixed sleep before a "nothing more
happens" check.

A sleep proves nothing on a slow machine: the engine may not have run once in it. Every scan of
the store sets ``pitcrew_incident_oldest_active_seconds`` to (scan time - the oldest active
incident's opening), so while an incident is active each scan shows a new, larger value on
``/metrics``: ``wait_scans`` returns once the engine has scanned ``count`` more times since it
was called, however long that takes, and fails the test at ``timeout``.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest

SERIES = "pitcrew_incident_oldest_active_seconds"


def oldest_active(exposition: bytes) -> float:
    for line in exposition.decode().splitlines():
        if line.startswith(SERIES + " "):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"{SERIES} not exposed")


def wait_scans(
    metrics: Callable[[], bytes], count: int = 3, *, timeout: float = 60.0, interval: float = 0.02
) -> None:
    """Until ``count`` scans after this call (``metrics`` returns a ``/metrics`` body). Needs an
    active incident: with none the series stays 0 and nothing tells one scan from the next. An
    incident just opened may not show yet (its worker starts without a scan, ``Engine.opened``):
    the first scan that shows it is one of the ``count``."""
    seen = oldest_active(metrics())
    scans = 0
    deadline = time.monotonic() + timeout
    while scans < count:
        if time.monotonic() > deadline:
            why = "" if seen > 0 else " (no active incident shown: scans cannot be told apart)"
            pytest.fail(f"the engine scanned {scans} of {count} times in {timeout:.0f}s{why}")
        time.sleep(interval)
        value = oldest_active(metrics())
        if value > seen:
            scans, seen = scans + 1, value


def scrape(server: object) -> Callable[[], bytes]:
    """``/metrics`` of a ``tests.harness.pitcrew.Pitcrew``."""

    def get() -> bytes:
        status, body = server.request("GET", "/metrics")  # type: ignore[attr-defined]
        assert status == 200, body
        return bytes(body)

    return get
