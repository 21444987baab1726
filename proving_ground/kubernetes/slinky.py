"""The Slurm side the emulator's slurm-operator stand-in reads and drains.

slurm-operator (SlinkyProject/slurm-operator, ``internal/controller/nodeset``) talks to Slurm
through slurmrestd: it reads each NodeSet pod's Slurm node (state and reason), drains it when the
Kubernetes node is cordoned, and keeps the pod's ``pod-protect`` label while the Slurm node is busy.
``MemorySlurm`` is that Slurm in memory (integration tests); ``ScontrolSlurm`` is a real cluster of
the harness (end-to-end tests), read and drained with ``scontrol``.
"""

from __future__ import annotations

import asyncio
import copy
import uuid
from typing import TYPE_CHECKING, Any, Protocol
from unicodedata import category

import attrs

if TYPE_CHECKING:
    from proving_ground.slurm import SlurmCluster

#: What the operator puts before every reason it writes; a reason without it is someone else's.
OPERATOR_PREFIX = "slurm-operator: "
#: The reason the slurmd container's preStop hook sets its Slurm node DOWN with when its pod starts
#: terminating (``internal/builder/workerbuilder/worker_app.go``: ``scontrol update
#: nodename=$(hostname) state=down reason='slurm-operator: Pod is terminating'``).
TERMINATING = OPERATOR_PREFIX + "Pod is terminating"
#: Slurm states in which the node is doing work (slurm_conditions.IsNodeBusy).
BUSY = frozenset({"ALLOCATED", "MIXED", "COMPLETING"})


#: The NodeSet pod label naming its NodeSet's scaling mode (``LabelNodeSetScalingMode``, well_known.go).
NODESET_SCALING_MODE = "nodeset.slinky.slurm.net/scaling-mode"
POD_PROTECT = "nodeset.slinky.slurm.net/pod-protect"


def scaling_mode(pod: dict[str, Any]) -> str | None:
    """The scaling mode of the NodeSet that made ``pod`` (``StatefulSet``, ``DaemonSet``: its mode
    label), or ``None`` if no NodeSet controls it."""
    meta = pod["metadata"]
    if not any(o.get("kind") == "NodeSet" and o.get("controller") for o in meta.get("ownerReferences") or []):
        return None
    mode = (meta.get("labels") or {}).get(NODESET_SCALING_MODE)
    return str(mode) if mode is not None else None


def recreated(gone: dict[str, Any]) -> dict[str, Any] | None:
    """The pod a StatefulSet-mode NodeSet makes again for one of its replicas that is gone: the
    same name, unbound and Pending, not protected (its Slurm node is not busy); None for any other
    pod (DaemonSet-mode NodeSet pods are made per node, under a generated name)."""
    if scaling_mode(gone) != "StatefulSet":
        return None
    pod = copy.deepcopy(gone)
    kept = ("name", "namespace", "labels", "annotations", "ownerReferences", "generateName")
    pod["metadata"] = {k: v for k, v in pod["metadata"].items() if k in kept}
    pod["metadata"].get("labels", {}).pop(POD_PROTECT, None)
    pod["metadata"].get("annotations", {}).pop("emulator/nominated", None)
    pod["spec"].pop("nodeName", None)
    pod["status"] = {"phase": "Pending"}
    return pod


#: The Node annotation that names a DaemonSet-mode pod's hostname (``AnnotationNodeHostnameOverride``).
HOSTNAME_OVERRIDE = "nodeset.slinky.slurm.net/hostname-override"


def daemonset_mode(pod: dict[str, Any]) -> bool:
    """A pod a NodeSet in DaemonSet scaling mode made."""
    return scaling_mode(pod) == "DaemonSet"


def daemonset_hostname(node: dict[str, Any]) -> str:
    """``GetDaemonSetPodHostname``: the Node's ``hostname-override`` annotation, else its name up to
    the first dot. The pod's hostname is the Slurm node its slurmd registers (dynamic nodes)."""
    meta = node["metadata"]
    override = (meta.get("annotations") or {}).get(HOSTNAME_OVERRIDE)
    return str(override or meta["name"].split(".", 1)[0])


def daemonset_pod(template: dict[str, Any], node: dict[str, Any]) -> dict[str, Any]:
    """The pod a DaemonSet-mode NodeSet makes for ``node`` (``NewNodeSetDaemonSetPod``), from one of
    its pods: a generated name (``<nodeset>-``), hostname and ``pod-hostname`` label by
    ``daemonset_hostname``, pinned to the node by node affinity; placed and running here at once,
    not protected (nothing runs on its new Slurm node)."""
    pod = copy.deepcopy(template)
    meta, spec = pod["metadata"], pod["spec"]
    kept = ("namespace", "labels", "annotations", "ownerReferences", "generateName")
    pod["metadata"] = meta = {k: v for k, v in meta.items() if k in kept}
    meta["name"] = f"{meta.get('generateName', 'slurmd-')}{uuid.uuid4().hex[:5]}"
    hostname, node_name = daemonset_hostname(node), node["metadata"]["name"]
    labels = meta.setdefault("labels", {})
    labels.pop(POD_PROTECT, None)
    labels.update(
        {"nodeset.slinky.slurm.net/pod-hostname": hostname, "nodeset.slinky.slurm.net/pod-name": meta["name"]}
    )
    spec.update(hostname=hostname, nodeName=node_name)
    for term in (
        ((spec.get("affinity") or {}).get("nodeAffinity") or {})
        .get("requiredDuringSchedulingIgnoredDuringExecution", {})
        .get("nodeSelectorTerms", [])
    ):
        for field in term.get("matchFields", []):
            if field.get("key") == "metadata.name":
                field["values"] = [node_name]
    return pod


#: The operator's limit on a reason it writes (runes), after sanitizing.
MAX_REASON = 256


def slurm_reason(text: str) -> str:
    """The operator's sanitizeSlurmReason: tabs and line breaks become spaces, other control
    characters go, the ends are trimmed, and at most ``MAX_REASON`` characters are kept."""
    kept = "".join(" " if c in "\t\n\r" else c for c in text if c in "\t\n\r" or category(c) != "Cc")
    return kept.strip()[:MAX_REASON].strip()


class SlurmSide(Protocol):
    async def state(self, hostname: str) -> tuple[bool, str]:
        """Whether the Slurm node is busy, and its reason ("" when none)."""
        ...

    async def drain(self, hostname: str, reason: str) -> None: ...

    async def down(self, hostname: str, reason: str) -> None:
        """DOWN with ``reason`` (replacing the reason it had), as ``scontrol update state=down`` does."""
        ...

    async def undrain(self, hostname: str, reason: str) -> None:
        """The operator's undrain of an uncordoned pod's Slurm node: only one with DRAIN and the
        operator's reason, not DOWN "Not responding" (``syncCordon``: ``IsNodeReasonOurs``,
        ``IsNodeDownForUnresponsive``; ``MakeNodeUndrain``). UNDRAIN clears DRAIN only and takes
        ``reason`` (node_mgr.c ``update_node``): a DOWN stays DOWN."""
        ...


def undrains(drained: bool, down: bool, reason: str) -> bool:
    """Whether the operator's undrain acts on a Slurm node so (``SlurmSide.undrain``)."""
    return drained and reason.startswith(OPERATOR_PREFIX) and not (down and "Not responding" in reason)


@attrs.define
class MemorySlurm:
    """Slurm nodes in memory: busy while a job runs (``busy``), their reasons (``reasons``)."""

    busy: dict[str, bool] = attrs.field(factory=dict)
    reasons: dict[str, str] = attrs.field(factory=dict)
    drained: set[str] = attrs.field(factory=set)
    downed: set[str] = attrs.field(factory=set)

    async def state(self, hostname: str) -> tuple[bool, str]:
        return self.busy.get(hostname, False), self.reasons.get(hostname, "")

    async def drain(self, hostname: str, reason: str) -> None:
        self.drained.add(hostname)
        self.reasons[hostname] = reason

    async def down(self, hostname: str, reason: str) -> None:
        self.downed.add(hostname)
        self.reasons[hostname] = reason

    async def undrain(self, hostname: str, reason: str) -> None:
        drained, down = hostname in self.drained, hostname in self.downed
        if undrains(drained, down, self.reasons.get(hostname, "")):
            self.drained.discard(hostname)
            self.reasons[hostname] = reason


@attrs.define
class ScontrolSlurm:
    """A harness cluster, through ``scontrol`` (run off the emulator's loop)."""

    cluster: SlurmCluster

    async def state(self, hostname: str) -> tuple[bool, str]:
        node = await asyncio.to_thread(self.cluster.node, hostname)
        return bool(node.states & BUSY), node.reason

    async def drain(self, hostname: str, reason: str) -> None:
        await asyncio.to_thread(
            self.cluster.run, "scontrol", "update", f"NodeName={hostname}", "State=DRAIN", f"Reason={reason}"
        )

    async def down(self, hostname: str, reason: str) -> None:
        await asyncio.to_thread(
            self.cluster.run, "scontrol", "update", f"NodeName={hostname}", "State=DOWN", f"Reason={reason}"
        )

    async def undrain(self, hostname: str, reason: str) -> None:
        node = await asyncio.to_thread(self.cluster.node, hostname)
        if undrains(node.drained, node.down, node.reason):
            await asyncio.to_thread(
                self.cluster.run,
                "scontrol",
                "update",
                f"NodeName={hostname}",
                "State=UNDRAIN",
                f"Reason={reason}",
            )
