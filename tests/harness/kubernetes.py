"""The tests' handle on the Kubernetes API emulator in a thread: the ``kube_world`` fixture.

The emulator and its world builders live in ``proving_ground.kubernetes.world`` (``scripts/demo`` runs
them too); they are re-exported here under their old names.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from proving_ground.kubernetes.world import (
    KubeWorld,
)

__all__ = ["kube_world"]


@pytest.fixture
def kube_world() -> Iterator[KubeWorld]:
    world = KubeWorld().start()
    yield world
    world.stop()
