"""slurmd run on the machines themselves, as a site whose Slurm nodes are named as its Kubernetes nodes
(``slurm.node_mapping: identity``) runs it: the emulator's nodes joined to a harness Slurm cluster.

The machine's slurmd (a systemd unit, or a pod of the site's own DaemonSet) ends when the machine goes
down and starts when it boots: a reboot ends it and starts a new one, with a new ``SlurmdStartTime``
(the slurmd host's ``time(NULL)`` at its first registration, slurmd.c ``_fill_registration_msg``).
slurmctld answers for the old slurmd meanwhile, until its pings find it gone (``SlurmdTimeout``), and
a node that registers having booted since it last answered, while not DOWN, is set DOWN "Node
unexpectedly rebooted" (node_mgr.c ``validate_node_specs``, ``ReturnToService`` 0 or 1). A replaced
machine's slurmd goes with it; its successor serves the same Slurm node name (the NodeName slurm.conf
lists), whose slurmd registers the record Slurm still holds once the new machine is up.

``HostSlurmds`` is the machines' side, polling the emulator: a node whose ``status.nodeInfo.bootID``
changed (the emulator's reboot) has its Slurm node's slurmd stopped (``SlurmCluster.stop_slurmd``: it
went down with the machine) and started again ``boot_seconds`` later (``start_slurmd_again``: the
boot reaching the slurmd unit); a node that is gone has its slurmd stopped, and the next node that was
not there at the start and turns Ready takes that Slurm node over, its slurmd started ``boot_seconds``
after. With ``SlurmdTimeout`` at Slurm's default (300 s) slurmctld notices none of it: only the start
time tells. The Slurm nodes are the Kubernetes nodes named as one of ``slurm.nodes`` (``serving``: by
default all of them); any other slurmd (a Slinky NodeSet pod's, ``slurmd_pods``) is left alone.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import Any

from proving_ground.kubernetes.world import KubeWorld
from proving_ground.slurm import SlurmCluster
from proving_ground.sync_loop import SyncLoop


class HostSlurmds(SyncLoop):
    def __init__(
        self,
        world: KubeWorld,
        slurm: SlurmCluster,
        *,
        boot_seconds: float = 0.0,
        interval: float = 0.2,
        serving: Iterable[str] | None = None,
    ) -> None:
        super().__init__("host-slurmds", interval)
        self.world, self.slurm, self.boot_seconds = world, slurm, boot_seconds
        nodes = self.nodes()
        serves = set(slurm.nodes if serving is None else serving)
        #: Kubernetes node → (the Slurm node its slurmd registers, the boot id it runs under).
        self.machines: dict[str, tuple[str, str]] = {
            name: (name, boot) for name, (boot, _) in nodes.items() if name in serves
        }
        self._known = set(nodes)  # nodes there at the start, or taken into account since
        self._orphans: list[str] = []  # Slurm nodes whose machine went, in order, awaiting a successor
        self._booting: dict[str, float] = {}  # Slurm node → when its stopped slurmd starts (monotonic)
        #: What it did, in order: ``(Slurm node, "stop" | "start")``.
        self.moves: list[tuple[str, str]] = []
        #: When each slurmd it started had registered (wall clock, as pitcrew's timeline has it).
        self.started: dict[str, float] = {}

    def stop(self) -> None:
        super().stop()
        # The session's cluster gets back each slurmd stopped here and not started again.
        for slurm_node in [*self._orphans, *self._booting]:
            self.slurm.start_slurmd_again(slurm_node)

    def nodes(self) -> dict[str, tuple[str, bool]]:
        """Kubernetes node → (its boot id, whether it is Ready)."""

        def look(emulator: Any) -> dict[str, tuple[str, bool]]:
            found = {}
            for (plural, _, _), node in emulator.objects.items():
                if plural != "nodes":
                    continue
                status = node.get("status") or {}
                ready = any(
                    c["type"] == "Ready" and c["status"] == "True" for c in status.get("conditions", [])
                )
                found[node["metadata"]["name"]] = (
                    str((status.get("nodeInfo") or {}).get("bootID", "")),
                    ready,
                )
            return found

        result: dict[str, tuple[str, bool]] = self.world.call(look)
        return result

    def _down(self, slurm_node: str) -> None:
        self.slurm.stop_slurmd(slurm_node)
        self.moves.append((slurm_node, "stop"))

    def sync(self) -> None:
        nodes, now = self.nodes(), time.monotonic()
        for name, (slurm_node, boot) in sorted(self.machines.items()):
            if name not in nodes:  # the machine went (replaced): its slurmd with it
                self._down(slurm_node)
                self._orphans.append(slurm_node)
                del self.machines[name]
            elif nodes[name][0] != boot:  # rebooted: its slurmd went down, the boot starts it
                self._down(slurm_node)
                self._booting[slurm_node] = now + self.boot_seconds
                self.machines[name] = (slurm_node, nodes[name][0])
        for name, (boot, ready) in sorted(nodes.items()):
            if name in self._known or not ready:
                continue
            self._known.add(name)
            if self._orphans:  # a successor: the new machine serves the Slurm node name it took over
                slurm_node = self._orphans.pop(0)
                self._booting[slurm_node] = now + self.boot_seconds
                self.machines[name] = (slurm_node, boot)
        for slurm_node, due in sorted(self._booting.items()):
            if due <= now:
                self.slurm.start_slurmd_again(slurm_node)
                del self._booting[slurm_node]
                self.started[slurm_node] = time.time()
                self.moves.append((slurm_node, "start"))
