"""What the real-Slurm Slinky end-to-end tests share: a cluster of their own with the NodeSet, the
emulator's slurm-operator acting on it, and a training job that has only its node to run on."""

from __future__ import annotations

import contextlib
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from proving_ground.kubernetes.slinky import ScontrolSlurm
from proving_ground.kubernetes.world import KubeWorld
from proving_ground.slurm import SlurmCluster
from tests.e2e.slurm_engine import busy_but, running_on, wait_for_step
from tests.harness.slurm import require_slurm

NODESET = "slurm-worker-gpu-h100"  # the fixture pod's NodeSet (also its feature)


@contextlib.contextmanager
def nodeset_cluster(version: str, prefix: str, **options: Any) -> Iterator[SlurmCluster]:
    """A Slurm cluster of its own with the NodeSet (the session's has none), ``options`` for
    ``SlurmCluster``; stopped, every slurmd with it, and its directory removed."""
    require_slurm(version)
    run_dir = Path(tempfile.mkdtemp(prefix=prefix))
    cluster = SlurmCluster(run_dir, version=version, nodeset=NODESET, **options).start()
    try:
        yield cluster
    finally:
        cluster.stop()
        shutil.rmtree(run_dir, ignore_errors=True)


def operator_on(kube_world: KubeWorld, slurm: SlurmCluster) -> None:
    """The emulator's slurm-operator drains, undrains and runs preStop hooks on ``slurm``."""

    def operator(e: Any) -> None:
        e.slinky_drain_delay, e.slinky_slurm = 0.5, ScontrolSlurm(slurm)

    kube_world.call(operator)


def training_on(slurm: SlurmCluster, node: str) -> str:
    """Every other node busy, the training job running on ``node`` past step 3: it has nowhere else
    to run once taken off ``node``. Its id."""
    busy_but(slurm, node)
    job_id = slurm.submit_training()
    assert running_on(slurm, job_id).nodes == (node,)
    wait_for_step(slurm, job_id, 3)
    return job_id
