"""The tests' handle on the Kubernetes API emulator in a thread: the ``kube_world`` fixture, and
``host_slurmds``, the machines' slurmds joined to it (a reboot or replacement restarts one).

The emulator and its world builders live in ``proving_ground.kubernetes.world`` (``scripts/demo`` runs
them too). They are imported when the fixture is first used: this plugin is loaded by every pytest
run, and the Kubernetes client they import is the costliest import of the suite.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from proving_ground.kubernetes.host_slurmds import HostSlurmds
    from proving_ground.kubernetes.world import KubeWorld
    from proving_ground.slurm import SlurmCluster

__all__ = ["host_slurmds", "kube_world"]


@pytest.fixture
def kube_world() -> Iterator[KubeWorld]:
    from proving_ground.kubernetes.world import KubeWorld

    world = KubeWorld().start()
    yield world
    world.stop()


@pytest.fixture
def host_slurmds(kube_world: KubeWorld, slurm: SlurmCluster) -> Iterator[Callable[..., HostSlurmds]]:
    """Starts ``HostSlurmds`` (the session's Slurm nodes' slurmds run on the emulator's nodes named
    as them: a reboot restarts one, a replacement's successor starts it again) over the world as
    the test has seeded it: call it once the nodes are there (``boot_seconds``: from a reboot's new
    boot id, or a successor Ready, until its slurmd starts). Stopped after the test."""
    from proving_ground.kubernetes.host_slurmds import HostSlurmds

    started: list[HostSlurmds] = []

    def start(boot_seconds: float = 0.0) -> HostSlurmds:
        hosts = HostSlurmds(kube_world, slurm, boot_seconds=boot_seconds).start()
        started.append(hosts)
        return hosts

    yield start
    for hosts in started:
        hosts.stop()
