"""Real Prometheus and Alertmanager for tests and the bench: the pytest fixtures, and the harness API.

The fixtures are thin wrappers over the proving ground's plain classes (``proving_ground.prometheus``: the
two servers and their configs; ``proving_ground.stack``: the detection stack and the webhook sink), so ``bench/detection.py``
uses the same code. Each test module gets its own Prometheus (its first scrape comes ~6 s after
start: a few seconds per module, where a session's Prometheus scraping twelve targets every second
for the whole run cost a minute of a CI core) and a fresh Alertmanager, because its notification
log dedupes across runs. Every server is stopped when its scope ends, failure or not.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from proving_ground.prometheus import (
    Alertmanager,
)
from proving_ground.stack import (
    DetectionStack,
    WebhookSink,
    start_stack,
    stop_stack,
)
from tests.harness.proc import require_binary


@pytest.fixture(scope="session")
def alertmanager_binary() -> str:
    return require_binary("prometheus-alertmanager", "prometheus-alertmanager")


@pytest.fixture(scope="module")
def detection_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DetectionStack]:
    """The module's stand-in and Prometheus; each test injects on its own node and clears it after."""
    stack = start_stack(require_binary("prometheus", "prometheus"), tmp_path_factory.mktemp("prometheus"))
    yield stack
    stop_stack(stack)


@pytest.fixture(scope="module")
def start_alertmanager(
    detection_stack: DetectionStack, alertmanager_binary: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Callable[[str], Alertmanager]]:
    """Start the module's Alertmanager towards a webhook URL (at most one per module); stopped after it."""
    started: list[Alertmanager] = []

    def start(webhook_url: str) -> Alertmanager:
        assert not started, "one Alertmanager per module: Prometheus sends to a single port"
        started.append(
            detection_stack.start_alertmanager(
                alertmanager_binary, tmp_path_factory.mktemp("alertmanager"), webhook_url
            )
        )
        return started[0]

    yield start
    for alertmanager in started:
        alertmanager.stop()


@pytest.fixture(scope="module")
def webhook_sink() -> Iterator[WebhookSink]:
    sink = WebhookSink().start()
    yield sink
    sink.stop()
