"""The tests' handle on the Kubernetes API emulator in a thread: the ``kube_world`` fixture.

The emulator and its world builders live in ``bot.demo.kubernetes.world`` (``pitcrew demo`` runs
them too); they are re-exported here under their old names.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from bot.demo.kubernetes.world import (
    KubeWorld,
    gpu_fleet,
    pod_ready,
    pods_like_the_fixture,
    settings_for,
    slinky_workers,
    write_kubeconfig,
)

__all__ = [
    "KubeWorld",
    "gpu_fleet",
    "kube_world",
    "pod_ready",
    "pods_like_the_fixture",
    "settings_for",
    "slinky_workers",
    "write_kubeconfig",
]


@pytest.fixture
def kube_world() -> Iterator[KubeWorld]:
    world = KubeWorld().start()
    yield world
    world.stop()
