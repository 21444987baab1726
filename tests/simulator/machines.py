"""The simulated cluster's machines joined to a real Slurm cluster: a replacement or a reboot restarts
the node's real slurmd, as the machine's own would.

Where pitcrew runs in front of the simulated far side with the real Slurm cluster
(``integrations.scheduler: slurm``; Kubernetes node names are the Slurm node names, the ``identity``
mapping), the simulator journals pitcrew's ``replace`` (a new machine under the same name) and
``reboot`` and changes nothing real. On a real site both end the node's slurmd: the old machine's
goes with it, the reboot takes it down, and the new or rebooted machine starts one, with a new
``SlurmdStartTime`` (slurmd.c ``_fill_registration_msg``: its host's time at its first registration)
that registers the record Slurm holds; slurmctld answers for the old slurmd meanwhile
(``SlurmdTimeout``). ``SimulatedMachines`` is that side, from the test's process (which owns the
slurmds): it reads the journal as it grows and restarts the named Slurm node's slurmd
(``SlurmCluster.restart_slurmd``) once per such record, at once (the simulated new machine, or the
rebooted one, is up when the call returns). Records for names that are not Slurm nodes of the
cluster are left alone.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from proving_ground.slurm import SlurmCluster
from proving_ground.sync_loop import SyncLoop

#: Journal operations that end a machine's slurmd and start a new one under the same name.
RESTARTS = frozenset({"replace", "reboot"})


class SimulatedMachines(SyncLoop):
    def __init__(self, journal: Path, slurm: SlurmCluster, *, interval: float = 0.2) -> None:
        super().__init__("simulated-machines", interval)
        self.journal, self.slurm = journal, slurm
        self._offset = 0  # bytes of the journal read: a record is acted on once, across restarts
        #: The Slurm nodes whose slurmd it restarted, in order.
        self.restarted: list[str] = []

    def sync(self) -> None:
        for record in self._new_records():
            node = record.get("node")
            if record.get("op") in RESTARTS and node in self.slurm.nodes:
                self.slurm.restart_slurmd(str(node))
                self.restarted.append(str(node))

    def _new_records(self) -> list[dict[str, Any]]:
        """Whole lines appended since the last read (a line still being written waits)."""
        if not self.journal.exists():
            return []
        with self.journal.open("rb") as handle:
            handle.seek(self._offset)
            data = handle.read()
        whole = data[: data.rfind(b"\n") + 1]
        self._offset += len(whole)
        return [json.loads(line) for line in whole.splitlines() if line.strip()]
