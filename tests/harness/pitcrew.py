"""pitcrew as a subprocess for tests: the ``pitcrew_factory`` fixture over ``proving_ground.pitcrew.Pitcrew``.

The runner itself (start, SIGKILL, HTTP, incidents, the far side's journal) is the proving
ground's; the tests' ``Pitcrew`` runs it in front of the simulated far side (``tests.simulator``)
unless ``simulated=False``. This module also owns the fixture, which stops every process it built,
and ``Crash``: a SIGKILL fired from inside a far side (the moment it has stored what pitcrew sent,
before it answers).
"""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Self

import pytest

from proving_ground import pitcrew as runner
from proving_ground.proc import wait_until
from proving_ground.slurm import SlurmCluster
from tests.simulator.machines import SimulatedMachines

__all__ = ["Crash", "Pitcrew", "pitcrew_factory"]


#: What the tests' pitcrew runs in front of the simulated far side.
SIMULATOR = "tests.simulator.serve"


class Pitcrew(runner.Pitcrew):
    """The proving ground's runner, in front of the simulated far side unless ``simulated=False``.
    With ``slurm`` (the real cluster pitcrew is configured for), the simulated far side's machines
    are joined to it (``SimulatedMachines``): a simulated replacement or reboot restarts the node's
    real slurmd, from the first start until ``release``."""

    def __init__(
        self, workdir: Path, *, simulated: bool = True, slurm: SlurmCluster | None = None, **kwargs: Any
    ) -> None:
        super().__init__(workdir, simulator=SIMULATOR if simulated else None, **kwargs)
        world = kwargs.get("world") or {}
        journal = Path(world["journal"]) if "journal" in world else self.journal  # a shared one
        self.machines = SimulatedMachines(journal, slurm) if simulated and slurm is not None else None

    def start(self, timeout: float = runner.START_TIMEOUT, *, ready: bool = True) -> Self:
        if self.machines is not None:
            self.machines.start()
        return super().start(timeout, ready=ready)

    def release(self) -> None:
        if self.machines is not None:
            self.machines.stop()
        super().release()


class Crash:
    """SIGKILL ``server`` the first time ``fire()`` is called: a far side's hook calls it after
    storing a request and before answering, so the far side has it and pitcrew never hears."""

    def __init__(self, server: Pitcrew) -> None:
        self.server = server
        self.killed: list[int] = []

    def fire(self) -> None:
        process = self.server.process
        if not self.killed and process is not None:
            self.killed.append(process.pid)
            os.kill(process.pid, signal.SIGKILL)

    def wait(self, what: str, timeout: float = 30) -> None:
        """Until the kill has fired (``what`` names the far side's moment) and the process is gone;
        ``server`` can then be started again on the same store."""
        wait_until(lambda: bool(self.killed), timeout=timeout, what=what)
        assert self.server.process is not None
        self.server.process.wait(timeout=10)
        self.server.process = None


@pytest.fixture
def pitcrew_factory(tmp_path: Path) -> Iterator[Any]:
    """Build (not start) pitcrew processes; all are stopped at teardown."""
    made: list[Pitcrew] = []

    def make(name: str = "pitcrew", **kwargs: Any) -> Pitcrew:
        server = Pitcrew(tmp_path / name, **kwargs)
        made.append(server)
        return server

    yield make
    for server in made:
        server.stop()
        server.release()
