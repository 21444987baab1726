"""The slurmd containers of a Slinky NodeSet's pods (either scaling mode), run for real: the emulator's
NodeSet pods joined to a harness Slurm cluster that has the NodeSet (``SlurmCluster(nodeset=...)``).

slurm-operator runs slurmd in each NodeSet pod as a dynamic node: ``slurmd -Z --conf
'Features=<nodeset> ...'`` (``internal/builder/workerbuilder/worker_app.go``, ``slurmdArgs`` and
``slurmdConfArgs``), so slurmctld adds the Slurm node when that slurmd registers, under the pod's
hostname (DaemonSet mode: the Kubernetes node's name, ``GetDaemonSetPodHostname``; StatefulSet mode:
the pod's ordinal name, ``GetOrdinalPodName``); it knows no such node before. A StatefulSet-mode
replica made again (same name, on whatever node it lands) runs its slurmd under the same Slurm node
name: the record Slurm still holds is registered again (``SlurmCluster.start_slurmd_again``; proc_req.c
``find_node_record2``, no new dynamic node), in whatever state Slurm keeps it. When the pod terminates its container stops, and nothing restarts that slurmd (its
preStop hook, which sets the Slurm node DOWN first, is the emulator's: ``_slinky_prestop``, through
``slinky.ScontrolSlurm`` for a real cluster).

``SlurmdPods`` is the kubelet's side of that, polling the emulator: a NodeSet pod on a Ready node whose
Slurm node has no slurmd gets one (``SlurmCluster.start_dynamic``) ``start_after`` seconds after it is
first seen so (the image pulled, the container started), Slurm knowing nothing of it meanwhile (or, for
a name Slurm knows, keeping the record as it is); a pod that is terminating or gone has its slurmd
stopped (``SlurmCluster.stop_slurmd``), and so has a pod whose node rebooted (a new ``bootID``: the
emulator's reboot), its container started again by the kubelet after the boot, ``start_after`` later,
on the same node. The Slurm nodes ``running`` names (by default the cluster's
static nodes) stand for the pods there at the start (their slurmds already run); any other slurmd runs
outside Kubernetes and is left alone.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import Any

from proving_ground.kubernetes import slinky
from proving_ground.kubernetes.world import KubeWorld
from proving_ground.slurm import SlurmCluster
from proving_ground.sync_loop import SyncLoop


class SlurmdPods(SyncLoop):
    def __init__(
        self,
        world: KubeWorld,
        slurm: SlurmCluster,
        *,
        start_after: float = 1.5,
        interval: float = 0.2,
        running: Iterable[str] | None = None,
    ) -> None:
        super().__init__("slurmd-pods", interval)
        self.world, self.slurm, self.start_after = world, slurm, start_after
        self._seen: dict[str, float] = {}  # a pod waiting for its slurmd: when it was first seen
        #: Slurm nodes whose slurmd runs in a pod now; at the start ``running``, by default every
        #: node of the cluster (a slurmd run outside Kubernetes is left alone).
        self.running: set[str] = set(slurm.nodes if running is None else running)
        #: What it did, in order: ``(Slurm node, "start" | "stop")``.
        self.moves: list[tuple[str, str]] = []
        #: Slurm node → the boot id of the node its pod's slurmd was started on (None: not known).
        self._boots: dict[str, str | None] = {}

    def pods(self) -> dict[str, bool]:
        """Slurm node → whether its NodeSet pod runs (on a Ready node, not terminating)."""
        return {name: runs for name, (runs, _) in self._look().items()}

    def _look(self) -> dict[str, tuple[bool, str | None]]:
        """Slurm node → whether its NodeSet pod runs, and the boot id of the node it runs on."""

        def look(emulator: Any) -> dict[str, tuple[bool, str | None]]:
            found: dict[str, tuple[bool, str | None]] = {}
            for (plural, _, _), pod in emulator.objects.items():
                if plural != "pods" or slinky.scaling_mode(pod) is None:
                    continue
                meta, on = pod["metadata"], pod["spec"].get("nodeName")
                node = emulator.objects.get(("nodes", None, on)) if on else None
                ready = node is not None and any(
                    c["type"] == "Ready" and c["status"] == "True"
                    for c in (node.get("status") or {}).get("conditions", [])
                )
                name = meta["labels"]["nodeset.slinky.slurm.net/pod-hostname"]
                if ready and not meta.get("deletionTimestamp"):
                    boot = ((node or {}).get("status") or {}).get("nodeInfo", {}).get("bootID")
                    found[name] = (True, boot)
                else:
                    found.setdefault(name, (False, None))
            return found

        result: dict[str, tuple[bool, str | None]] = self.world.call(look)
        return result

    def sync(self) -> None:
        seen = self._look()
        pods = {name: runs for name, (runs, _) in seen.items()}
        for name in sorted(self.running):
            boot = seen.get(name, (False, None))[1]
            rebooted = self._boots.setdefault(name, boot) != boot  # its slurmd went down with the node
            if not pods.get(name, False) or rebooted:
                self._boots.pop(name, None)
                self.slurm.stop_slurmd(name)
                self.running.discard(name)
                self._seen.pop(name, None)
                self.moves.append((name, "stop"))
        for name, runs in sorted(pods.items()):
            if not runs or name in self.running:
                continue
            if time.monotonic() - self._seen.setdefault(name, time.monotonic()) >= self.start_after:
                if name in (*self.slurm.nodes, *self.slurm.dynamic):  # the same Slurm node again
                    self.slurm.start_slurmd_again(name)
                else:
                    self.slurm.start_dynamic(name)
                self.running.add(name)
                self._boots[name] = seen[name][1]
                self._seen.pop(name, None)
                self.moves.append((name, "start"))
