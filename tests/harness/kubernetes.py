"""The tests' handle on the Kubernetes API emulator in a thread: the ``kube_world`` fixture.

The emulator and its world builders live in ``proving_ground.kubernetes.world`` (``scripts/demo`` runs
them too). They are imported when the fixture is first used: this plugin is loaded by every pytest
run, and the Kubernetes client they import is the costliest import of the suite.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from proving_ground.kubernetes.world import KubeWorld

__all__ = ["kube_world"]


@pytest.fixture
def kube_world() -> Iterator[KubeWorld]:
    from proving_ground.kubernetes.world import KubeWorld

    world = KubeWorld().start()
    yield world
    world.stop()
