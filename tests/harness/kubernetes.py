"""The tests' handle on the Kubernetes API emulator in a thread: the ``kube_world`` fixture.

The emulator and its world builders live in ``proving_ground.kubernetes.world`` (``scripts/demo`` runs
them too); they are re-exported here under their old names.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from proving_ground.kubernetes.world import KubeWorld, settings_for
from proving_ground.slurm import SlurmCluster

__all__ = ["kube_world", "slurm_and_kubernetes"]


def slurm_and_kubernetes(
    slurm: SlurmCluster, world: KubeWorld, workdir: Path, **kubernetes: Any
) -> dict[str, Any]:
    """pitcrew's configuration for the real Slurm cluster (``scontrol``) and the emulator together:
    mode auto, the breaker wide open (each test is one incident, or a few), ``kubernetes`` the
    ``kubernetes`` keys besides the emulator's kubeconfig (written under ``workdir``). Tests add
    their own keys (playbooks, capacity, store) to the dict it returns."""
    return {
        "mode": "auto",
        "guards": {"breaker": {"max_nodes": 10, "max_fraction": 1.0}},
        "slurm": slurm.pitcrew_settings("scontrol", command_timeout=5)["slurm"],
        "kubernetes": settings_for(world, workdir, **kubernetes)["kubernetes"],
        "integrations": {"scheduler": "slurm", "cluster": "kubernetes"},
    }


@pytest.fixture
def kube_world() -> Iterator[KubeWorld]:
    world = KubeWorld().start()
    yield world
    world.stop()
