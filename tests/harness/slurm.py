"""The real Slurm cluster as pytest fixtures; the cluster itself is ``proving_ground.slurm``.

``slurm_cluster`` is one cluster for the whole session (stopped and checked for survivors at
its end); ``slurm`` is that cluster reset to quiet (no jobs, every node IDLE) for each test.
``require_slurm`` skips, or under ``CI=true`` fails, when a Slurm or munge binary is missing.
The names tests import from here (``SlurmCluster``, ``eventually``, ``TRAIN_JOB`` ...) are the
package's, re-exported so existing imports keep working.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from proving_ground.slurm import (
    BINARIES,
    SlurmCluster,
    main,
)
from tests.harness.proc import in_ci, require_binary

__all__ = ["require_slurm", "slurm", "slurm_cluster"]


def require_slurm() -> None:
    """Skip (or, under CI=true, fail) when a Slurm or munge binary is missing."""
    for binary, package in BINARIES.items():
        require_binary(binary, package)
    if os.geteuid() != 0:
        message = "the Slurm harness runs slurmd as root"
        if in_ci():
            pytest.fail(message)
        pytest.skip(message)


@pytest.fixture(scope="session")
def slurm_cluster() -> Iterator[SlurmCluster]:
    """One real cluster for the whole session; stopped (and checked) at the end."""
    require_slurm()
    run_dir = Path(tempfile.mkdtemp(prefix="pitcrew-slurm-"))
    cluster = SlurmCluster(run_dir).start()
    try:
        yield cluster
    finally:
        cluster.stop()
        shutil.rmtree(run_dir, ignore_errors=True)


@pytest.fixture
def slurm(slurm_cluster: SlurmCluster) -> SlurmCluster:
    """The session cluster, reset to quiet: no jobs, every node IDLE."""
    slurm_cluster.reset()
    return slurm_cluster


if __name__ == "__main__":  # python -m tests.harness.slurm, as before the move
    main()
