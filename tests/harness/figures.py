"""A figure a test measured, printed on the run's output past pytest's capture.

It goes to stderr: in a pytest-xdist worker (``scripts/test`` spreads each shard over workers)
stdout is ``/dev/null``, since execnet carries the worker's channel on the original, while
stderr is the run's, so the figure reaches the shard's log either way.
"""

from __future__ import annotations

import sys

import pytest


def show_figure(capsys: pytest.CaptureFixture[str], line: str) -> None:
    with capsys.disabled():
        print(line, file=sys.stderr, flush=True)
