"""A Slinky NodeSet's effect on Slurm, for the proving ground: a node is a member of the jobs'
partition while its Kubernetes node carries the NodeSet's labels.

The real NodeSet controller runs a slurmd pod on each node its selector matches; a node it does
not select has no slurmd, so Slurm cannot give it a job. Here every Slurm node's slurmd runs on
the host (``proving_ground.slurm``), so this stand-in stands for the pod's coming and going:
a node the selector stops matching, or that is cordoned, is drained with ``NOT_SELECTED`` as its
reason (no job is placed there); one it starts matching uncordoned, drained so, is resumed (its
slurmd registered). Nothing else is touched: a node DOWN or drained for another reason
(pitcrew's, an administrator's) is left as it is. Kubernetes node names are the Slurm node names; a replacement node is named
after the node it replaces (``gpu-001-x7b2n``, the MachineSet stand-in's naming) and serves the same
Slurm node, as where slurm.conf lists the nodes (a static NodeName the new machine takes over, which
is what pitcrew's ``identity`` mapping assumes) or a StatefulSet-mode NodeSet's pod keeps its ordinal
hostname. A DaemonSet-mode NodeSet's does not: it is named after the new node (the emulator's
``_nodeset_daemon``, the simulator's ``DaemonSetNodeSet``).
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import Any

from proving_ground.kubernetes.world import KubeWorld
from proving_ground.slurm import SlurmCluster

NOT_SELECTED = "nodeset: not selected"


class NodeSetStandin:
    def __init__(
        self, world: KubeWorld, slurm: SlurmCluster, labels: Mapping[str, str], interval: float = 0.2
    ):
        self.world, self.slurm, self.labels, self.interval = world, slurm, dict(labels), interval
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="nodeset-standin", daemon=True)
        #: What it did, in order: ``(node, "join" | "leave")``.
        self.moves: list[tuple[str, str]] = []

    def __enter__(self) -> NodeSetStandin:
        self.sync()
        self._thread.start()
        return self

    def __exit__(self, *_: Any) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self.sync()

    def selected(self) -> set[str]:
        """Slurm nodes whose NodeSet pod has a node to run on: the node of that name, or its
        replacement, selected and not cordoned. slurm-operator creates no NodeSet pod on a node
        whose taints it does not tolerate (``PodShouldRunOnNode``; a cordon brings the
        ``node.kubernetes.io/unschedulable`` taint), and drains the Slurm node of a pod whose node
        is cordoned (the NodeSet controller's ``syncCordon``): either way no job lands there."""

        def pick(emulator: Any) -> set[str]:
            return {
                obj["metadata"]["name"]
                for (plural, _, _), obj in emulator.objects.items()
                if plural == "nodes"
                and self.labels.items() <= (obj["metadata"].get("labels") or {}).items()
                and not (obj.get("spec") or {}).get("unschedulable")
            }

        nodes: set[str] = self.world.call(pick)
        return {n for n in self.slurm.nodes if any(k == n or k.startswith(f"{n}-") for k in nodes)}

    def sync(self) -> None:
        selected = self.selected()
        for name in self.slurm.nodes:
            state = self.slurm.node(name)
            if name in selected and state.drained and state.reason == NOT_SELECTED:
                self.slurm.run("scontrol", "update", f"NodeName={name}", "State=RESUME")
                self.moves.append((name, "join"))
            elif name not in selected and not (state.down or state.drained):
                self.slurm.run(
                    "scontrol", "update", f"NodeName={name}", "State=DRAIN", f"Reason={NOT_SELECTED}"
                )
                self.moves.append((name, "leave"))
