"""Kubernetes and notifier halves of the simulated far side (see ``tests.simulator.world``)."""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from bot.domain.nodemap import (
    DEFAULT_SLINKY_SELECTOR,
    SLINKY_HOSTNAME_OVERRIDE,
    SLINKY_POD_HOSTNAME,
    SLINKY_SCALING_MODE,
    SlurmdPod,
)
from bot.domain.ownership import (
    SLINKY_CORDON_REASON,
    SLINKY_PRESTOP_REASON,
    SLINKY_REASON_PREFIX,
    fault_taint,
)
from bot.engine.ports import ClusterNode, Notice, OldNodeLook, PodRef
from tests.simulator.world import SimulatedWorld

log = logging.getLogger(__name__)


class SimulatedCluster:
    far_side = "simulator"

    def __init__(self, world: SimulatedWorld) -> None:
        self._world = world

    async def node(self, name: str) -> ClusterNode | None:
        await self._world.round_trip()
        return self._facts(name, self._world.node_record(name))

    def _facts(self, name: str, n: Any) -> ClusterNode:
        return ClusterNode(
            name=name,
            unschedulable=n.unschedulable,
            ready=self._world.ready(n),
            taints=(fault_taint(),) if n.tainted else (),
            labels=dict(n.labels),
            annotations=dict(n.annotations),
        )

    async def count_nodes(self) -> int:
        nodes, _ = self._world.state()
        return len(nodes)

    async def nodes(self) -> list[ClusterNode]:
        await self._world.round_trip()  # one list: one round trip
        nodes, _ = self._world.state()
        return [self._facts(name, n) for name, n in nodes.items()]

    async def cordon(self, name: str, *, incident_id: str, reason: str) -> None:
        await self._world.write("cordon", node=name, incident_id=incident_id, reason=reason)

    async def uncordon(self, name: str, *, incident_id: str) -> None:
        await self._world.write("uncordon", node=name, incident_id=incident_id)

    async def set_annotations(self, name: str, annotations: Mapping[str, str | None]) -> None:
        await self._world.write("annotate", node=name, annotations=dict(annotations))

    async def set_labels(self, name: str, labels: Mapping[str, str | None]) -> None:
        await self._world.write("label", node=name, labels=dict(labels))

    async def pods_on_node(self, name: str) -> list[PodRef]:
        n = self._world.node_record(name)
        await self._world.round_trip()
        return [
            PodRef(namespace, name, owner_kind=kind)
            for (namespace, _, name), kind in ((ref.partition("/"), kind) for ref, kind in n.pods.items())
        ]

    async def slurmd_pods(self, namespace: str, selector: Mapping[str, str]) -> list[SlurmdPod]:
        return []

    async def evict(self, pod: PodRef) -> None:
        node = self._owner(pod)
        await self._world.write("evict", node=node, pod=pod.ref)

    async def delete_pod(self, pod: PodRef, *, force: bool) -> None:
        await self._world.write("delete_pod", node=self._owner(pod), pod=pod.ref, force=force)

    def _owner(self, pod: PodRef) -> str:
        nodes, _ = self._world.state()
        return next((n.name for n in nodes.values() if pod.ref in n.pods), "unknown")

    async def replace(
        self,
        name: str,
        *,
        strategy: str,
        incident_id: str,
        slurm_nodes: Sequence[str] = (),
        nodeset_pods: Sequence[str] = (),
    ) -> str:
        if strategy == "watch":  # another system replaces the node: nothing changes here
            return f"watch:{name}"
        await self._world.write(
            "replace",
            node=name,
            strategy=strategy,
            incident_id=incident_id,
            slurm_nodes=list(slurm_nodes),
            nodeset_pods=list(nodeset_pods),
        )
        return f"{strategy}:{name}"

    async def replacement_started(self, name: str, *, incident_id: str) -> bool:
        return any(
            r.get("op") == "replace" and r.get("node") == name and r.get("incident_id") == incident_id
            for r in self._world.journal.records()
        )

    async def replacement_handle(self, name: str, *, strategy: str) -> str | None:
        return None  # the simulated replacement keeps the node's name: nothing to recognise it by

    async def repair_owner(self, name: str) -> str | None:
        return None  # no other repair system in the simulated world

    async def successor(self, name: str, *, handle: str | None) -> ClusterNode | None:
        return await self.node(name)  # the simulated replacement keeps the node's name

    async def held_up(self, name: str, *, handle: str) -> str | None:
        return None  # the simulated replacement is never held up

    async def termination_held(self, name: str, *, handle: str) -> OldNodeLook:
        return OldNodeLook(gone=True)  # the simulated old node goes at once

    async def cancel_replacement(self, name: str, *, incident_id: str) -> bool:
        return False  # the simulated replacement starts at once: there is never one to cancel

    async def reboot(self, name: str, *, incident_id: str, rung: str = "") -> None:
        await self._world.write("reboot", node=name, incident_id=incident_id)

    async def reset_gpu(self, name: str, gpus: Sequence[str], *, incident_id: str, rung: str = "") -> None:
        await self._world.write("reset_gpu", node=name, gpus=list(gpus), incident_id=incident_id)


class DaemonSetNodeSet(SimulatedCluster):
    """The simulated cluster under a Slinky NodeSet in DaemonSet scaling mode, replaced by Cluster API
    or Karpenter: the replacement is a new node, ``<node>-x7b2n``, the old one gone.

    slurm-operator makes one slurmd pod per node (``NewNodeSetDaemonSetPod``, internal/controller/
    nodeset/utils/utils.go) whose hostname, the Slurm node it registers (dynamic nodes), is the
    Kubernetes node's name up to its first dot, or the node's ``hostname-override`` annotation
    (``GetDaemonSetPodHostname``). A MachineTemplate or NodePool cannot give a new node a per-node
    annotation, so the replacement's slurmd registers a new Slurm node, named after the new node;
    the old Slurm node's record stays, its slurmd gone (NOT_RESPONDING) and its state and reason as
    they were (``pruneSlurmNodeRecords`` defaults to ``Never``). ``successors``: old → new node.

    ``annotated``: a site whose own controller gives every node, a new one too, the Slurm name it is
    to take in its ``hostname-override`` annotation (here the node's own name), which a
    ``node_mapping: annotation`` on that key reads.

    slurm-operator v1.2's own moves on the Slurm node, journalled as the far side's: a cordoned
    node's Slurm node is drained with the cordon-reason annotation under the operator's prefix
    (``syncCordon`` → ``MakeNodeDrain``); a pod that terminates (the replaced node's, drained by
    its Machine's or NodeClaim's deletion) runs its slurmd container's preStop hook, which sets the
    Slurm node DOWN "slurm-operator: Pod is terminating" (``worker_app.go``), kept when the same
    name's slurmd registers again (``ReturnToService=1``, ``validate_node_specs``); a pod on an
    uncordoned node whose Slurm node is drained with the operator's prefix is undrained
    (``MakeNodeUndrain``: UNDRAIN, which leaves a DOWN and takes the operator's reason); a reboot
    in place, with graceful node shutdown on, runs the slurmd pod's preStop hook too (``reboot``).

    The node's slurmd pod is listed on it (``pods_on_node``) as slurm-operator makes it: its
    controller the NodeSet, not a DaemonSet (``NewNodeSetDaemonSetPod``: ``GetPodFromTemplate``
    with the NodeSet's controllerRef). Evicted or deleted, it terminates (its preStop hook sets the
    Slurm node DOWN, its slurmd stops) and is made again only on a node it should run on
    (nodeset_sync.go ``podsShouldBeOnNode``: ``shouldRun && !exists``; ``PodShouldRunOnNode``,
    ``predicates``: no NoSchedule or NoExecute taint the pod does not tolerate). Its template
    tolerates only slurm-operator's own worker taint (workerbuilder ``worker_app.go``:
    ``TolerationWorkerNode``; here the NodeSet's own template adds none), not pitcrew's
    ``NoSchedule`` taint nor the cordon's ``node.kubernetes.io/unschedulable``: so from a cordoned node it stays gone (``gone``) until
    the uncordon, whose node update the operator syncs (eventhandler_node.go ``Update``) and makes
    it again there, its slurmd registering the same Slurm node."""

    #: The NodeSet's scaling mode, as its pods' ``scaling-mode`` label says it.
    mode = "DaemonSet"
    #: The kubelet's graceful node shutdown is configured (``shutdownGracePeriod`` above 0; the
    #: kubelet's default, 0, leaves it off): a reboot terminates the node's pods first, running
    #: their preStop hooks (``reboot``).
    graceful_node_shutdown = True

    def __init__(self, world: SimulatedWorld, *, annotated: bool = False) -> None:
        super().__init__(world)
        self.successors: dict[str, str] = {}
        self.annotated = annotated
        #: Slurm node (its pod's hostname) → the node its slurmd pod was evicted or deleted from
        #: while that node refused a new one (cordoned): not made again until the uncordon.
        self.gone: dict[str, str] = {}

    def _facts(self, name: str, n: Any) -> ClusterNode:
        facts = super()._facts(name, n)
        if not self.annotated:
            return facts
        return replace(
            facts, annotations={**facts.annotations, SLINKY_HOSTNAME_OVERRIDE: name.split(".", 1)[0]}
        )

    async def cordon(self, name: str, *, incident_id: str, reason: str) -> None:
        await super().cordon(name, incident_id=incident_id, reason=reason)
        hostname = self._hostname(name)
        state = await self._world.node(hostname)
        if state.reason and not state.reason.startswith(SLINKY_REASON_PREFIX):
            return  # "externally set into a state, preserve it" (syncCordon)
        annotation = self._world.node_record(name).annotations.get(SLINKY_CORDON_REASON)
        said = annotation or f"Node ({name}) was cordoned, Pod ({self._pod(hostname)}) must be cordoned"
        await self._operator("operator_drain", hostname, SLINKY_REASON_PREFIX + said)

    async def uncordon(self, name: str, *, incident_id: str) -> None:
        await super().uncordon(name, incident_id=incident_id)
        hostname = self._hostname(name)
        if self.gone.get(hostname) == name:  # the node takes the pod again: its slurmd registers
            del self.gone[hostname]
            await self._world.journal.append({"op": "slurmd_registered", "node": hostname})
        if name not in self.successors:  # the replaced node has no pod left to undrain for
            await self._undrain(hostname)

    async def _undrain(self, hostname: str) -> None:
        """``syncCordon`` for an uncordoned pod: UNDRAIN a Slurm node the operator drained, unless
        Slurm itself set it DOWN "Not responding" (``IsNodeDownForUnresponsive``)."""
        state = await self._world.node(hostname)
        if not state.drained or not state.reason.startswith(SLINKY_REASON_PREFIX):
            return
        if state.down and "Not responding" in state.reason:
            return
        reason = f"{SLINKY_REASON_PREFIX}Pod ({self._pod(hostname)}) was uncordoned"
        await self._operator("operator_undrain", hostname, reason)

    async def _operator(self, op: str, hostname: str, reason: str) -> None:
        await self._world.journal.append({"op": op, "node": hostname, "reason": reason})

    @staticmethod
    def _pod(hostname: str) -> str:
        return f"slurm/slurm-worker-{hostname}"

    def slurmd_pod(self, node: str) -> PodRef:
        """The NodeSet's slurmd pod on ``node``, as ``pods_on_node`` lists it (``pod_ref``)."""
        namespace, _, name = self._pod(self._hostname(node)).partition("/")
        return PodRef(namespace, name, owner_kind="NodeSet", nodeset_replica=self.mode == "StatefulSet")

    def _pod_left(self, hostname: str) -> bool:
        """The pod of Slurm node ``hostname`` is no longer on the node it ran on."""
        return hostname in self.gone

    async def pods_on_node(self, name: str) -> list[PodRef]:
        pods = await super().pods_on_node(name)
        if name in self.successors or self._pod_left(self._hostname(name)):
            return pods
        return [*pods, self.slurmd_pod(name)]

    async def evict(self, pod: PodRef) -> None:
        if not await self._remove_slurmd_pod(pod, "evict"):
            await super().evict(pod)

    async def delete_pod(self, pod: PodRef, *, force: bool) -> None:
        if not await self._remove_slurmd_pod(pod, "delete_pod", force=force):
            await super().delete_pod(pod, force=force)

    async def _remove_slurmd_pod(self, pod: PodRef, op: str, **data: Any) -> bool:
        """The slurmd pod evicted or deleted from its node: it terminates there (its slurmd
        container's preStop hook sets its Slurm node DOWN, its slurmd stops), and the NodeSet makes
        it again (``_made_again``). False: ``pod`` is no NodeSet pod standing on a node."""
        nodes, _ = self._world.state()
        node = next(
            (
                n
                for n in nodes
                if n not in self.successors
                and not self._pod_left(self._hostname(n))
                and self.slurmd_pod(n) == pod
            ),
            None,
        )
        if node is None:
            return False
        hostname = self._hostname(node)
        await self._world.write(op, node=node, pod=pod.ref, **data)
        await self._operator("prestop_down", hostname, SLINKY_PRESTOP_REASON)
        await self._world.journal.append({"op": "slurmd_gone", "node": hostname})
        await self._made_again(node, hostname)
        return True

    async def _made_again(self, node: str, hostname: str) -> None:
        """DaemonSet mode: made again on the same node only if it should run there
        (``PodShouldRunOnNode``): not while the node is cordoned or carries pitcrew's taint."""
        record = self._world.node_record(node)
        if record.unschedulable or record.tainted:
            self.gone[hostname] = node
            return
        await self._world.journal.append({"op": "slurmd_registered", "node": hostname})

    async def replace(
        self,
        name: str,
        *,
        strategy: str,
        incident_id: str,
        slurm_nodes: Sequence[str] = (),
        nodeset_pods: Sequence[str] = (),
    ) -> str:
        handle = await super().replace(
            name,
            strategy=strategy,
            incident_id=incident_id,
            slurm_nodes=slurm_nodes,
            nodeset_pods=nodeset_pods,
        )
        if strategy != "watch":
            new = f"{name}-x7b2n"
            old = self._hostname(name)
            if self.gone.pop(old, None) is None:
                # The Machine's (NodeClaim's) deletion drains the node: its slurmd pod terminates.
                await self._operator("prestop_down", old, SLINKY_PRESTOP_REASON)
                await self._world.journal.append({"op": "slurmd_gone", "node": old})
            self.successors[name] = new
            await self._world.journal.append({"op": "annotate", "node": new, "annotations": {}})  # registers
            await self._world.journal.append({"op": "slurmd_registered", "node": self._hostname(new)})
            await self._undrain(self._hostname(new))  # its pod, new, on an uncordoned node
        return handle

    async def reboot(self, name: str, *, incident_id: str, rung: str = "") -> None:
        """The node reboots where it stands. Shut down through systemd, with the kubelet's graceful
        node shutdown configured (``graceful_node_shutdown``), its pods are terminated first as on
        a deletion, preStop hooks included ("Kubelet ensures that pods follow the normal pod
        termination process during the node shutdown", Kubernetes' Node Shutdowns page;
        ``nodeshutdown_manager_linux.go`` kills each pod through ``killPodFunc``): the slurmd
        pod's hook sets its Slurm node DOWN. The slurmd stops with the node and, the node back,
        registers the same Slurm node (the same pod's container started again; in StatefulSet mode
        its replica, bound to the node again), which keeps the DOWN."""
        await super().reboot(name, incident_id=incident_id)
        hostname = self._hostname(name)
        if self.gone.get(hostname) == name:  # no slurmd pod on the node: none to stop or restart
            return
        if self.graceful_node_shutdown:
            await self._operator("prestop_down", hostname, SLINKY_PRESTOP_REASON)
        await self._world.journal.append({"op": "slurmd_gone", "node": hostname})
        await self._world.journal.append({"op": "slurmd_registered", "node": hostname})

    def _hostname(self, node: str) -> str:
        """The hostname of the NodeSet's pod on ``node``: the Slurm node its slurmd registers."""
        nodes, _ = self._world.state()
        annotations = self._facts(node, nodes[node]).annotations if node in nodes else {}
        return annotations.get(SLINKY_HOSTNAME_OVERRIDE) or node.split(".", 1)[0]

    async def successor(self, name: str, *, handle: str | None) -> ClusterNode | None:
        new = self.successors.get(name)
        return None if new is None else await self.node(new)

    async def slurmd_pods(self, namespace: str, selector: Mapping[str, str]) -> list[SlurmdPod]:
        nodes, _ = self._world.state()
        gone = set(self.successors)
        pods = []
        for name in nodes:
            hostname = self._hostname(name)
            if name in gone or self._pod_left(hostname):
                continue
            labels = {
                **DEFAULT_SLINKY_SELECTOR,
                SLINKY_POD_HOSTNAME: hostname,
                SLINKY_SCALING_MODE: self.mode,
            }
            pods.append(SlurmdPod(f"slurm-worker-{name}", name, hostname, labels, namespace))
        return pods


class StatefulSetNodeSet(DaemonSetNodeSet):
    """The same replacement under a NodeSet in StatefulSet scaling mode (slurm-operator's default):
    the slurmd pod is a replica named by its ordinal, also its hostname and Slurm node
    (``NewNodeSetStatefulSetPod``); made again and placed on the replacement, it registers the
    failed node's Slurm node there. Here a replica's ordinal name is the name of the node it first
    ran on."""

    mode = "StatefulSet"

    def __init__(self, world: SimulatedWorld, *, annotated: bool = False) -> None:
        super().__init__(world, annotated=annotated)
        #: Replicas evicted from a node that stays (cordoned, not replaced): the node each runs on now,
        #: None while pending. slurm-operator makes an evicted replica again under the same name,
        #: unbound (``NewNodeSetStatefulSetPod``); kube-scheduler cannot place it on the cordoned
        #: node, so it pends until a node has room, one Karpenter launches for it (pending, it is
        #: demand), and its slurmd registers the same Slurm node from there.
        self.moved: dict[str, str | None] = {}

    def replica(self, node: str) -> PodRef:
        """The NodeSet's replica pod on ``node``, as the drain lists it (``PodRef.nodeset_replica``)."""
        return self.slurmd_pod(node)

    def _pod_left(self, hostname: str) -> bool:
        return hostname in self.moved

    async def _made_again(self, node: str, hostname: str) -> None:
        """StatefulSet mode: made again unbound, and pending while no node takes it (``moved``)."""
        self.moved[hostname] = None

    async def replace(
        self,
        name: str,
        *,
        strategy: str,
        incident_id: str,
        slurm_nodes: Sequence[str] = (),
        nodeset_pods: Sequence[str] = (),
    ) -> str:
        """The pending replica (the replacement's demand) lands on the successor."""
        self.moved.pop(self._hostname(name), None)
        return await super().replace(
            name,
            strategy=strategy,
            incident_id=incident_id,
            slurm_nodes=slurm_nodes,
            nodeset_pods=nodeset_pods,
        )

    async def reboot(self, name: str, *, incident_id: str, rung: str = "") -> None:
        """The node reboots; a replica evicted from it before is no longer there to restart: while the
        node reboots, Karpenter's node for it comes up and its slurmd registers the Slurm node there."""
        hostname = self._hostname(name)
        if hostname not in self.moved:
            await super().reboot(name, incident_id=incident_id)
            return
        await SimulatedCluster.reboot(self, name, incident_id=incident_id)
        self.moved[hostname] = f"{name}-karpenter"
        await self._world.journal.append({"op": "slurmd_registered", "node": hostname})

    async def slurmd_pods(self, namespace: str, selector: Mapping[str, str]) -> list[SlurmdPod]:
        pods = await super().slurmd_pods(namespace, selector)  # a moved replica is not on its node
        for hostname, node in self.moved.items():
            if node is not None:
                labels = {
                    **DEFAULT_SLINKY_SELECTOR,
                    SLINKY_POD_HOSTNAME: hostname,
                    SLINKY_SCALING_MODE: self.mode,
                }
                pods.append(SlurmdPod(f"slurm-worker-{hostname}", node, hostname, labels, namespace))
        return pods

    def _hostname(self, node: str) -> str:
        replaced = {new: old for old, new in self.successors.items()}
        return replaced.get(node, node)


class SimulatedNotifier:
    far_side = "simulator"

    def __init__(self, world: SimulatedWorld) -> None:
        self._world = world
        self._count = 0

    async def post(self, notice: Notice) -> str | None:
        self._count += 1
        await self._world.write("notice", **notice.record())
        log.info("notice", extra={"incident": notice.incident_id, "kind": notice.kind, "title": notice.title})
        return f"simulated-{self._count}"
