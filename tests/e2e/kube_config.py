"""pitcrew's configuration for the end-to-end tests that join real Slurm and the Kubernetes emulator."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from proving_ground.kubernetes.world import KubeWorld, settings_for
from proving_ground.slurm import SlurmCluster


def slurm_and_kubernetes(
    slurm: SlurmCluster, world: KubeWorld, workdir: Path, *, backend: str = "scontrol", **kubernetes: Any
) -> dict[str, Any]:
    """pitcrew's configuration for the real Slurm cluster (``backend``) and the emulator together:
    mode auto, the breaker wide open (each test is one incident, or a few), ``kubernetes`` the
    ``kubernetes`` keys besides the emulator's kubeconfig (written under ``workdir``). Tests add
    their own keys (playbooks, capacity, store) to the dict it returns."""
    return {
        "mode": "auto",
        "guards": {"breaker": {"max_nodes": 10, "max_fraction": 1.0}},
        "slurm": slurm.pitcrew_settings(backend, command_timeout=5)["slurm"],
        "kubernetes": settings_for(world, workdir, **kubernetes)["kubernetes"],
        "integrations": {"scheduler": "slurm", "cluster": "kubernetes"},
    }
