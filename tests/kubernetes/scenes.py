"""Objects tests add to the emulator's fixture world: the budgets that guard the node's pods."""

from __future__ import annotations

from typing import Any


def slinky_pdb() -> dict[str, Any]:
    """slurm-operator's budget: ``maxUnavailable: 0`` over slurmd pods marked busy (``pod-protect``)."""
    return {
        "metadata": {"name": "slurm-workers-pdb-slurm", "namespace": "slurm", "generation": 1},
        "spec": {
            "maxUnavailable": 0,
            "selector": {
                "matchLabels": {
                    "nodeset.slinky.slurm.net/pod-protect": "true",
                    "slinky.slurm.net/cluster": "slurm",
                }
            },
        },
        "status": {"observedGeneration": 1},
    }


def training_pdb(min_available: int = 1) -> dict[str, Any]:
    """A team's budget over its one training worker: evicting it is refused while it is the last."""
    return {
        "metadata": {"name": "llama-pretrain", "namespace": "training", "generation": 1},
        "spec": {
            "minAvailable": min_available,
            "selector": {"matchLabels": {"training.kubeflow.org/job-name": "llama-pretrain"}},
        },
        "status": {"observedGeneration": 1},
    }
