"""Replacing a node, one strategy per setting, and finding what replaced it.

Before it deletes anything the strategy writes the handle it is about to delete onto the
node (``bot.domain.ownership.REPLACE_ANNOTATION``), so a resumed step sees that the
replacement was started and never deletes twice. The handle also carries what is needed
later, when the old node is gone: when the replacement started, the node's pool labels and
its GPU count, from which ``successor`` recognises the new node. Another repair system
already at work on the node (its Machine or NodeClaim deleting, a Karpenter disruption taint,
a cluster-autoscaler deletion taint) is reported by ``repair_owner`` and no second replacement
is started. A Machine whose Cluster API is paused is not deleted: the attempt fails, to be retried.
Karpenter launches a node only for a pending pod: a slurmd pod of a StatefulSet-mode NodeSet,
made again unbound once the drain evicted it (known by its Slurm node's name), already is that
demand, and the node it lands on the successor; otherwise pitcrew's placeholder pod is the demand.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from kubernetes.aio import client

from bot.config import KubernetesSettings
from bot.domain.nodemap import SLINKY_POD_HOSTNAME, SLINKY_SCALING_MODE
from bot.domain.ownership import OWNER_ANNOTATION, REPLACE_ANNOTATION, replacement_mark, replacement_owner
from bot.engine.errors import PermanentError, PitcrewError, Reason, TransientError
from bot.engine.ports import ClusterNode
from bot.integrations.kubernetes.client import call
from bot.integrations.kubernetes.nodes import Nodes, facts

#: What pitcrew itself can do to replace a node (``none`` hands it to humans).
STRATEGIES = ("cluster-api", "karpenter", "delete-node", "command")
#: The handle of a reboot (not a replacement): the same node must come back with a new boot id.
REBOOT = "reboot"
#: Not a strategy of pitcrew's: another system is replacing the node and pitcrew waits for its result.
WATCH = "watch"
CAPI_GROUP = "cluster.x-k8s.io"
#: Cluster API's versions, in the order tried: v1beta2 is served from v1.11 on and alone from v1.16
#: (April 2027), where a v1beta1 path answers 404 (a delete pitcrew would take for done).
CAPI_VERSIONS = ("v1beta2", "v1beta1")
KARPENTER = ("karpenter.sh", "v1", "nodeclaims")
CAPI_MACHINE = "cluster.x-k8s.io/machine"
#: The component Karpenter's events come from (its recorder, ``GetEventRecorderFor("karpenter")``).
KARPENTER_COMPONENT = "karpenter"
NODEPOOL_LABEL = "karpenter.sh/nodepool"
#: On a replacement's new node: the target (``machine/<ns>/<name>``, ``nodeclaim/<name>``) it replaces.
SUCCESSOR_ANNOTATION = "pitcrew.dev/successor-of"
#: The placeholder pod's image: it only holds the GPU request until the successor is Ready.
PLACEHOLDER_IMAGE = "registry.k8s.io/pause:3.10"
CAPI_NAMESPACE = "cluster.x-k8s.io/cluster-namespace"
#: On a Cluster API object: its controller leaves it alone, whatever the value (``util/annotations``).
CAPI_PAUSED = "cluster.x-k8s.io/paused"
#: On a Machine, beside ``spec.clusterName``: its Cluster, in the Machine's namespace.
CAPI_CLUSTER_NAME = "cluster.x-k8s.io/cluster-name"
#: Asks Cluster API's MachineHealthCheck to remediate a Machine (it is then flagged unhealthy).
REMEDIATE_MACHINE = "cluster.x-k8s.io/remediate-machine"
#: Karpenter's opt-out of voluntary disruption (consolidation, drift) on a Node, NodeClaim or Pod.
DO_NOT_DISRUPT = "karpenter.sh/do-not-disrupt"
#: Taints by which another system announces it is taking the node away.
FOREIGN_REPAIR_TAINTS = {
    "karpenter.sh/disrupted": "karpenter (disruption taint karpenter.sh/disrupted)",
    "karpenter.sh/disruption": "karpenter (disruption taint karpenter.sh/disruption)",
    "ToBeDeletedByClusterAutoscaler": "cluster-autoscaler (taint ToBeDeletedByClusterAutoscaler)",
}


@dataclass(frozen=True, slots=True)
class Handle:
    """What a replacement deleted (``kind/namespace/name``) and how to recognise the new node."""

    strategy: str
    target: str
    since: datetime
    gpus: int | None = None
    pool: dict[str, str] = field(default_factory=dict)
    #: A reboot: the node's boot id before it, which must change.
    boot: str | None = None
    #: What makes the new handle: ``machineset/<ns>/<name>`` (CAPI) or ``nodepool/<name>`` (Karpenter).
    owner: str | None = None
    #: Karpenter: the pending pod that makes it launch the successor, when not pitcrew's placeholder
    #: (``pod/<ns>/<name>``, a StatefulSet-mode NodeSet's slurmd pod): the node it lands on is the successor.
    demand: str | None = None

    def render(self) -> str:
        words = [self.strategy, self.target, f"since={self.since.strftime('%Y-%m-%dT%H:%M:%SZ')}"]
        words += [f"gpus={self.gpus}"] if self.gpus is not None else []
        words += [f"boot={self.boot}"] if self.boot else []
        words += [f"owner={self.owner}"] if self.owner else []
        words += [f"demand={self.demand}"] if self.demand else []
        words += [f"pool={k}={v}" for k, v in sorted(self.pool.items())]
        return " ".join(words)

    @classmethod
    def parse(cls, text: str) -> Handle | None:
        words = text.split()
        if len(words) < 3 or not words[2].startswith("since="):
            return None
        since = datetime.strptime(words[2][6:], "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC)
        gpus, pool, boot, owner, demand = None, {}, None, None, None
        for word in words[3:]:
            key, _, value = word.partition("=")
            if key == "gpus":
                gpus = int(value)
            elif key == "boot":
                boot = value
            elif key == "owner":
                owner = value
            elif key == "demand":
                demand = value
            elif key == "pool":
                label, _, label_value = value.partition("=")
                pool[label] = label_value
        return cls(words[0], words[1], since, gpus, pool, boot, owner, demand)

    def demand_pod(self, placeholders: str) -> tuple[str, str]:
        """The namespace and name of the pod Karpenter launches the successor for: ``demand``, or
        pitcrew's placeholder in ``placeholders``."""
        if self.demand:
            _, namespace, name = self.demand.split("/", 2)
            return namespace, name
        return placeholders, placeholder_name(self.target)


def placeholder_name(target: str) -> str:
    """The placeholder pod of a replacement, named after what it replaces (``nodeclaim/<name>``)."""
    return f"pitcrew-successor-{target.rsplit('/', 1)[-1]}"[:63].rstrip("-")


def node_of(handle: dict[str, Any]) -> str | None:
    """The node a Machine (``status.nodeRef``) or a NodeClaim (``status.nodeName``) became."""
    status = handle.get("status") or {}
    name = (status.get("nodeRef") or {}).get("name") or status.get("nodeName")
    return str(name) if name else None


def _remediation(machine: dict[str, Any]) -> str | None:
    """A MachineHealthCheck handed the Machine to its owner for remediation (its MachineSet deletes
    it, and makes a new one): ``OwnerRemediated`` False (v1beta1 or v1beta2 conditions), or the
    ``cluster.x-k8s.io/remediate-machine`` annotation the health check acts on."""
    status = machine.get("status") or {}
    conditions = [*(status.get("conditions") or []), *((status.get("v1beta2") or {}).get("conditions") or [])]
    for condition in conditions:
        if condition.get("type") == "OwnerRemediated" and condition.get("status") == "False":
            why = condition.get("reason") or "WaitingForRemediation"
            return f"is marked for remediation by its owner: OwnerRemediated False, {why}"
    if REMEDIATE_MACHINE in ((machine.get("metadata") or {}).get("annotations") or {}):
        return f"carries {REMEDIATE_MACHINE}"
    return None


def karpenter_said(events: Iterable[Any], since: datetime) -> list[tuple[datetime, str]]:
    """What Karpenter's own recorder (``KARPENTER_COMPONENT``) said in ``events`` (``CoreV1Event``)
    at or after ``since``: (when last said, message)."""
    said = []
    for event in events:
        component = event.reporting_component or (event.source and event.source.component) or ""
        when = event.last_timestamp or event.event_time or event.first_timestamp
        if KARPENTER_COMPONENT in component and when is not None and when >= since:
            said.append((when, str(event.message or "").strip()))
    return said


def deleting(obj: dict[str, Any] | None) -> bool:
    """A Machine or NodeClaim the API server is deleting (its ``deletionTimestamp`` set)."""
    return obj is not None and bool((obj.get("metadata") or {}).get("deletionTimestamp"))


class Replacer:
    """``machines``: the management cluster's client, where Cluster API keeps the Machines
    (``kubernetes.cluster_api``), or why there is none; ``None``: the workload cluster's own."""

    def __init__(
        self,
        api: client.ApiClient,
        nodes: Nodes,
        settings: KubernetesSettings,
        machines: client.ApiClient | str | None = None,
    ) -> None:
        self._custom = client.CustomObjectsApi(api)
        self._machines_error = machines if isinstance(machines, str) else None
        self._machines = client.CustomObjectsApi(
            api if machines is None or isinstance(machines, str) else machines
        )
        self._core = client.CoreV1Api(api)
        self._nodes = nodes
        self._settings = settings
        self._timeout = settings.request_timeout
        #: Cluster API's Machines as the management cluster serves them (``_capi``), once found.
        self._capi_version: str | None = None

    def strategy(self, asked: str) -> str:
        return self._settings.replace.strategy if asked in ("", "configured") else asked

    # ------------------------------------------------------------ the far side's handles
    def machine_ref(self, node: client.V1Node) -> tuple[str, str] | None:
        """The namespace and name of the node's Machine, from the annotations Cluster API's machine
        controller writes on the Node (``cluster.x-k8s.io/machine``, ``…/cluster-namespace``);
        ``kubernetes.cluster_api.namespace`` wins over the annotation."""
        annotations = node.metadata.annotations or {}
        name = annotations.get(CAPI_MACHINE)
        namespace = self._settings.cluster_api.namespace or annotations.get(CAPI_NAMESPACE)
        return (namespace, name) if name and namespace else None

    def _management_reachable(self) -> None:
        if self._machines_error is not None:
            raise PermanentError(self._machines_error, reason=Reason.MISCONFIGURED)

    def machine_missing(self, node: client.V1Node) -> str:
        """Why ``machine`` found nothing, naming where it looked."""
        ref = self.machine_ref(node)
        if ref is None:
            return (
                f"node {node.metadata.name} has no Cluster API Machine: no {CAPI_MACHINE} and "
                f"{CAPI_NAMESPACE} annotations (nor kubernetes.cluster_api.namespace)"
            )
        where = (
            "the management cluster (kubernetes.cluster_api)"
            if self._settings.cluster_api.separate
            else "the workload cluster (Machines usually live in the management cluster: set "
            "kubernetes.cluster_api.kubeconfig or context)"
        )
        return f"Machine {ref[0]}/{ref[1]} of node {node.metadata.name} not found in {where}"

    async def _capi(self) -> tuple[str, str, str]:
        """Machines' group, version and plural: the first of ``CAPI_VERSIONS`` the management
        cluster serves, asked once (its discovery document) and kept, as Cluster API serves a
        version once added until it is removed, years later; v1beta1 while it serves neither (no
        Cluster API there: a Machine read then answers 404, said as the Machine not found)."""
        self._management_reachable()
        if self._capi_version is None:
            for version in CAPI_VERSIONS:
                try:
                    await call(
                        f"discover {CAPI_GROUP}/{version}",
                        self._machines.get_api_resources(CAPI_GROUP, version, _request_timeout=self._timeout),
                    )
                except PermanentError as exc:
                    if exc.reason != Reason.NOT_FOUND:
                        raise
                    continue
                self._capi_version = version
                break
            else:
                return CAPI_GROUP, CAPI_VERSIONS[-1], "machines"
        return CAPI_GROUP, self._capi_version, "machines"

    async def machine(self, node: client.V1Node) -> dict[str, Any] | None:
        ref = self.machine_ref(node)
        return None if ref is None else await self.machine_named(*ref)

    async def machine_named(self, namespace: str, name: str) -> dict[str, Any] | None:
        """The Machine ``namespace``/``name`` as the management cluster serves it (``_capi``), or
        None when it is not there."""
        group, version, plural = await self._capi()
        try:
            found: dict[str, Any] = await call(
                f"read Machine {namespace}/{name}",
                self._machines.get_namespaced_custom_object(
                    group, version, namespace, plural, name, _request_timeout=self._timeout
                ),
            )
        except PermanentError as exc:
            if exc.reason == Reason.NOT_FOUND:
                return None
            raise
        return found

    async def machines_not_found(self, fleet_selector: str, sample: int = 5) -> tuple[list[str], int]:
        """For ``check-config --live``: of the first ``sample`` fleet nodes, each whose Machine cannot
        be read where pitcrew would look for it (a verb allowed proves nothing about that), and how
        many nodes were checked."""
        missing = []
        nodes = (await self._nodes.fleet(fleet_selector))[:sample]
        for node in nodes:
            try:
                found = await self.machine(node)
            except PitcrewError as exc:
                missing.append(f"{node.metadata.name}: {exc}")
                continue
            if found is None:
                missing.append(self.machine_missing(node))
        return missing, len(nodes)

    async def nodeclaim(self, node_name: str) -> dict[str, Any] | None:
        listed = await call(
            "list NodeClaims",
            self._custom.list_cluster_custom_object(*KARPENTER, _request_timeout=self._timeout),
        )
        return next(
            (c for c in listed["items"] if (c.get("status") or {}).get("nodeName") == node_name), None
        )

    # ------------------------------------------------------------ questions
    async def repair_owner(self, name: str) -> str | None:
        node = await self._nodes.read(name)
        if node is None:
            return None
        mark = replacement_owner(node.metadata.annotations or {})
        if mark is not None and not mark[1].startswith(f"{WATCH} "):
            return None  # pitcrew's own replacement: the step knows it from its record
        return await self._foreign(node)

    async def _foreign(self, node: client.V1Node) -> str | None:
        """Another system's repair of the node, ignoring pitcrew's own mark."""
        name = node.metadata.name
        for taint in node.spec.taints or []:
            if taint.key in FOREIGN_REPAIR_TAINTS:
                return FOREIGN_REPAIR_TAINTS[taint.key]
        if node.metadata.deletion_timestamp is not None:
            return "the Node is already being deleted"
        strategy = self._settings.replace.strategy
        if strategy == "cluster-api" and (machine := await self.machine(node)) is not None:
            if deleting(machine):
                return f"cluster-api (Machine {machine['metadata']['name']} is deleting)"
            remediation = _remediation(machine)
            if remediation:
                return f"cluster-api MachineHealthCheck (Machine {machine['metadata']['name']} {remediation})"
        if strategy == "karpenter" and deleting(claim := await self.nodeclaim(name)):
            return f"karpenter (NodeClaim {claim['metadata']['name']} is deleting)"  # type: ignore[index]
        return None

    async def _repaired_in_place(self, node: client.V1Node) -> bool:
        """No other system repairs the node any more, and it is still the node that was read. It is
        read again after its Machine or NodeClaim: Cluster API and Karpenter delete the Node first and
        let the Machine or NodeClaim go after (their finalizers), so a Node read just before both went
        has no owner left to show, yet is the old node on its way out, not one repaired in place."""
        if await self._foreign(node) is not None:
            return False
        again = await self._nodes.read(node.metadata.name)
        return (
            again is not None
            and again.metadata.uid == node.metadata.uid
            and again.metadata.deletion_timestamp is None
        )

    async def started(self, name: str, *, incident_id: str) -> bool:
        """The replacement this incident marked on the node reached the far side (or the node is gone)."""
        node = await self._nodes.read(name)
        if node is None:
            return True
        mark = replacement_owner(node.metadata.annotations or {})
        if mark is None or mark[0] != incident_id:
            return False
        handle = Handle.parse(mark[1])
        if handle is None or handle.strategy in ("command", "delete-node", WATCH):
            # A command (delete-node's provider action too) cannot be asked: assume it ran rather
            # than run it twice. Another system's replacement was under way before pitcrew marked it.
            return True
        if handle.strategy == "cluster-api":
            machine = await self.machine(node)
            return machine is None or deleting(machine)
        claim = await self.nodeclaim(name)
        return claim is None or deleting(claim)

    async def cancel(self, name: str, *, incident_id: str) -> bool:
        """Withdraw a marked replacement that has not reached the far side."""
        node = await self._nodes.read(name)
        mark = replacement_owner((node.metadata.annotations or {}) if node else {})
        if node is None or mark is None or mark[0] != incident_id:
            return False
        if await self.started(name, incident_id=incident_id):
            return False
        await self._nodes.annotate(name, {REPLACE_ANNOTATION: None})
        return True

    async def handle(self, name: str, *, strategy: str) -> str | None:
        """The handle ``replace`` (or, for ``reboot``, the reboot) would record now, read-only
        (``None``: no node, or strategy none)."""
        if strategy == REBOOT:
            return await self.reboot_handle(name)
        strategy = self.strategy(strategy)
        node = await self._nodes.read(name)
        if node is None or strategy == "none":
            return None
        return self._handle(strategy, node).render()

    async def reboot_handle(self, name: str) -> str:
        """What a reboot of ``name`` must change: its boot id, read before the reboot."""
        node = await self._nodes.read(name)
        if node is None:
            raise PermanentError(
                f"node {name} is not in Kubernetes: nothing to reboot", reason=Reason.NOT_FOUND
            )
        boot = node.status.node_info.boot_id if node.status and node.status.node_info else None
        return Handle(REBOOT, f"node/{name}", datetime.now(UTC), boot=boot or "unknown").render()

    # ------------------------------------------------------------ the act
    async def rebooted(self, name: str, handle: str) -> bool:
        """The node reports a boot id other than the one ``handle`` recorded before the reboot."""
        parsed = Handle.parse(handle)
        node = await self._nodes.read(name)
        info = node.status.node_info if node is not None and node.status else None
        return parsed is not None and info is not None and bool(info.boot_id) and info.boot_id != parsed.boot

    async def replace(
        self,
        name: str,
        *,
        strategy: str,
        incident_id: str,
        slurm_nodes: Sequence[str] = (),
        nodeset_pods: Sequence[str] = (),
    ) -> str:
        strategy = self.strategy(strategy)
        node = await self._nodes.read(name)
        if node is None:
            raise PermanentError(
                f"node {name} is not in Kubernetes: nothing to replace", reason=Reason.NOT_FOUND
            )
        if strategy == "none":
            raise PermanentError(
                f"replace strategy none: replacing {name} is for humans", reason=Reason.NOT_ALLOWED
            )
        if strategy not in (*STRATEGIES, WATCH):
            raise PermanentError(f"unknown replace strategy {strategy!r}", reason=Reason.MISCONFIGURED)
        if strategy == "delete-node" and not self._settings.replace.command:
            raise PermanentError(
                f"replace strategy delete-node for {name} needs kubernetes.replace.command, the provider "
                "action that terminates the instance: deleting the Node alone replaces nothing",
                reason=Reason.MISCONFIGURED,
            )
        mark = replacement_owner(node.metadata.annotations or {})
        if mark is not None and mark[0] == incident_id:
            handle = Handle.parse(mark[1])
        else:
            handle = self._handle(strategy, node)
        if handle is None:
            raise PermanentError(f"unreadable replacement mark on {name}: {mark}", reason=Reason.BAD_RESPONSE)
        if strategy == WATCH:  # another system replaces the node: only record what to wait for
            await self._nodes.annotate(
                name, {REPLACE_ANNOTATION: replacement_mark(incident_id, handle.render())}
            )
            return handle.render()
        target, owner = await self._target(strategy, node)
        if owner and not handle.owner and (mark is None or mark[0] != incident_id):
            handle = dataclasses.replace(handle, owner=owner)
            if strategy == "karpenter":  # the real NodeClaim, not the node it became
                handle = dataclasses.replace(
                    handle,
                    target=f"nodeclaim/{target[1]}",
                    demand=await self._nodeset_demand(node, slurm_nodes, nodeset_pods),
                )
        # The mark goes on first: a crash after it and before the delete is seen by ``started``.
        await self._nodes.annotate(name, {REPLACE_ANNOTATION: replacement_mark(incident_id, handle.render())})
        if strategy == "cluster-api":
            await self._delete_custom(await self._capi(), target, self._machines)
        elif strategy == "karpenter":
            if handle.demand is None:
                await self._placeholder(node, handle, incident_id)
            await self._delete_custom(KARPENTER, target, self._custom)
        elif strategy == "delete-node":
            # The provider action first: a Node object deleted before it would leave the instance
            # running, unseen, with nothing replacing it if the action then failed.
            await self._command(name, incident_id)
            try:
                await self._nodes.delete(name)
            except PermanentError as exc:
                if exc.reason != Reason.NOT_FOUND:  # gone already (a retried delete that had landed): done
                    raise
        else:
            await self._command(name, incident_id)
        return handle.render()

    def _handle(self, strategy: str, node: client.V1Node) -> Handle:
        labels = node.metadata.labels or {}
        pool = {k: labels[k] for k in self._settings.replace.pool_labels if k in labels}
        machine = self.machine_ref(node) or ("", "")
        target = {
            "cluster-api": f"machine/{machine[0]}/{machine[1]}",
            "karpenter": f"nodeclaim/{node.metadata.name}",  # replace() names the real NodeClaim once read
            "delete-node": f"node/{node.metadata.name}",
            "command": f"command/{node.metadata.name}",
            WATCH: f"node/{node.metadata.name}",
        }.get(strategy, strategy)
        gpus = facts(node, self._settings.gpu_resource).gpus
        return Handle(strategy, target, datetime.now(UTC), gpus, pool)

    async def _target(self, strategy: str, node: client.V1Node) -> tuple[tuple[str | None, str], str | None]:
        """What to delete, and what will make its successor (``Handle.owner``)."""
        if strategy == "cluster-api":
            machine = await self.machine(node)
            if machine is None:
                raise PermanentError(self.machine_missing(node), reason=Reason.NOT_FOUND)
            meta = machine["metadata"]
            paused = await self._paused(machine)
            if paused is not None:
                raise TransientError(
                    f"Cluster API is paused for Machine {meta['namespace']}/{meta['name']} of node "
                    f"{node.metadata.name}: {paused}; it would not replace the node until unpaused",
                    reason=Reason.UNAVAILABLE,
                )
            sets = [o["name"] for o in meta.get("ownerReferences") or [] if o.get("kind") == "MachineSet"]
            owner = f"machineset/{meta['namespace']}/{sets[0]}" if sets else None
            return (meta["namespace"], meta["name"]), owner
        if strategy == "karpenter":
            claim = await self.nodeclaim(node.metadata.name)
            if claim is None:
                raise PermanentError(
                    f"node {node.metadata.name} has no Karpenter NodeClaim", reason=Reason.NOT_FOUND
                )
            pool = (claim["metadata"].get("labels") or {}).get(NODEPOOL_LABEL)
            return (None, claim["metadata"]["name"]), (f"nodepool/{pool}" if pool else None)
        return (None, node.metadata.name), None

    async def _paused(self, machine: dict[str, Any]) -> str | None:
        """Why Cluster API would leave ``machine`` alone if it were deleted (None: it would not).
        Its Machine controller returns before anything else, deletion included, while the Machine's
        Cluster has ``spec.paused`` true or the Machine carries the paused annotation (cluster-api
        ``util/paused/paused.go``); its MachineSet counts a deleting Machine and makes no other. A
        Machine deleted then stays deleting and no node comes, so the wait would run out its budget.
        The Cluster is ``spec.clusterName`` (or the cluster-name label) in the Machine's namespace;
        one that is not there (404) pauses nothing. ``spec.paused`` is a bool in v1beta1 and a
        pointer to one in v1beta2, under the same name."""
        meta = machine["metadata"]
        said = []
        name = (machine.get("spec") or {}).get("clusterName") or (meta.get("labels") or {}).get(
            CAPI_CLUSTER_NAME
        )
        if name:
            group, version, _ = await self._capi()
            try:
                found: dict[str, Any] = await call(
                    f"read Cluster {meta['namespace']}/{name}",
                    self._machines.get_namespaced_custom_object(
                        group, version, meta["namespace"], "clusters", name, _request_timeout=self._timeout
                    ),
                )
            except PermanentError as exc:
                if exc.reason != Reason.NOT_FOUND:
                    raise
            else:
                if (found.get("spec") or {}).get("paused") is True:
                    said.append(f"its Cluster {meta['namespace']}/{name} is paused (spec.paused: true)")
        if CAPI_PAUSED in (meta.get("annotations") or {}):
            said.append(f"it carries the {CAPI_PAUSED} annotation")
        return " and ".join(said) or None

    async def _delete_custom(
        self, kind: tuple[str, str, str], target: tuple[str | None, str], api: client.CustomObjectsApi
    ) -> None:
        group, version, plural = kind
        namespace, name = target
        what = f"delete {plural} {namespace + '/' if namespace else ''}{name}"
        request = (
            api.delete_namespaced_custom_object(
                group, version, namespace, plural, name, _request_timeout=self._timeout
            )
            if namespace
            else api.delete_cluster_custom_object(
                group, version, plural, name, _request_timeout=self._timeout
            )
        )
        try:
            await call(what, request)
        except PermanentError as exc:
            if exc.reason != Reason.NOT_FOUND:  # gone already (a retried delete that had landed): done
                raise

    async def _command(self, name: str, incident_id: str) -> None:
        argv = self._settings.replace.command
        if not argv:
            raise PermanentError(
                "replace strategy command needs kubernetes.replace.command", reason=Reason.MISCONFIGURED
            )
        await run_command(
            argv, name, incident_id, "replace", self._settings.replace.command_timeout.total_seconds()
        )

    # ------------------------------------------------------------ the result
    async def successor(self, name: str, *, handle: str | None, fleet_selector: str) -> ClusterNode | None:
        """The same node (not being replaced), or a fleet node of the same pool registered after the
        replacement started; ``None`` while there is none."""
        parsed = Handle.parse(handle) if handle else None
        node = await self._nodes.read(name)
        if parsed is not None and parsed.strategy == REBOOT:
            # The same node, once it has booted again: Ready before the reboot proves nothing.
            booted = node is not None and node.status.node_info.boot_id != parsed.boot
            return facts(node, self._settings.gpu_resource) if node is not None and booted else None
        if node is not None and node.metadata.deletion_timestamp is None:
            created = node.metadata.creation_timestamp
            if (
                parsed is None
                or parsed.strategy == "command"
                or (parsed.strategy == WATCH and await self._repaired_in_place(node))
                or (created and created >= parsed.since)
            ):
                return facts(node, self._settings.gpu_resource)
        if parsed is None:
            return None
        if parsed.demand:
            return await self._landed(parsed, name)
        if parsed.owner:
            return await self._bound_successor(parsed)
        candidates = [
            n
            for n in await self._nodes.fleet(fleet_selector)
            if n.metadata.name != name
            and n.metadata.creation_timestamp is not None
            and n.metadata.creation_timestamp >= parsed.since
            and all((n.metadata.labels or {}).get(k) == v for k, v in parsed.pool.items())
        ]
        ready = [facts(n, self._settings.gpu_resource) for n in candidates]
        ready.sort(key=lambda f: (not f.ready, f.name))
        return ready[0] if ready else None

    async def _nodeset_demand(
        self, node: client.V1Node, slurm_nodes: Sequence[str], nodeset_pods: Sequence[str]
    ) -> str | None:
        """The slurmd pod of one of ``slurm_nodes`` that a StatefulSet-mode NodeSet (slurm-operator's
        default scaling mode) made again off this node: ``pod/<ns>/<name>``; None when there is none.
        Such a NodeSet makes a pod the drain evicted again under the same name (its ordinal, which is
        the Slurm node's name and its ``pod-hostname``) for kube-scheduler to place anywhere its
        template allows. Pending, Karpenter launches a node for it (``IsProvisionable`` skips only
        DaemonSet and mirror pods); bound, it found room on a node already. Either way it is where
        the Slurm node runs again, and a placeholder beside it would launch a second node, left idle.
        It may not be there yet: slurm-operator counts a terminating pod as a replica and makes the
        new one on a sync after the old one is removed (``syncNodeSetPods``, ``processNodeSetPod``:
        "New pod should be generated on the next sync after the current pod is removed from etcd"),
        which comes late while its expectations are unsatisfied or the operator is down. Then the
        pod the drain evicted (``nodeset_pods``), or one still terminating, names it all the same."""
        if not slurm_nodes and not nodeset_pods:
            return None
        listed = await call(
            "list StatefulSet-mode NodeSet pods",
            self._core.list_pod_for_all_namespaces(
                label_selector=f"{SLINKY_SCALING_MODE}=StatefulSet", _request_timeout=self._timeout
            ),
        )
        serving = [
            p
            for p in listed.items
            if (p.metadata.labels or {}).get(SLINKY_POD_HOSTNAME) in slurm_nodes
            and any(o.kind == "NodeSet" and o.controller for o in p.metadata.owner_references or [])
        ]
        moved = sorted(
            f"{p.metadata.namespace}/{p.metadata.name}"
            for p in serving
            if p.metadata.deletion_timestamp is None
            and (p.spec.node_name if p.spec else None) != node.metadata.name
        )
        # Not made again yet: the one still terminating, or the one the drain saw go.
        coming = sorted(
            f"{p.metadata.namespace}/{p.metadata.name}" for p in serving if p.metadata.deletion_timestamp
        )
        found = [*moved, *coming, *sorted(nodeset_pods)]
        return f"pod/{found[0]}" if found else None

    async def _landed(self, parsed: Handle, name: str) -> ClusterNode | None:
        """The node the demand pod was placed on, other than ``name``: the Slurm node runs there
        again. None while it waits, while it is gone before its NodeSet makes it again, or while the
        old one still terminates on ``name`` (``held_up`` says so)."""
        namespace, pod_name = parsed.demand_pod(self._settings.jobs.namespace)
        pod = await self._pod(namespace, pod_name)
        if pod is None:
            return None
        where = pod.spec.node_name if pod.spec else None
        node = await self._nodes.read(where) if where and where != name else None
        return facts(node, self._settings.gpu_resource) if node is not None else None

    async def _placeholder(self, node: client.V1Node, handle: Handle, incident_id: str) -> None:
        """Karpenter launches nodes only for pending pods, and a DaemonSet-mode slurmd pod is never
        pending: deleting the NodeClaim alone starts nothing. A pending pod asking for the node's
        GPUs in its NodePool is the demand that does; it is removed once the successor is Ready.
        (A StatefulSet-mode NodeSet's own pending pod, ``_nodeset_demand``, needs none.)"""
        pool = (handle.owner or "").removeprefix("nodepool/")
        if not handle.owner or not handle.owner.startswith("nodepool/") or not handle.gpus:
            raise PermanentError(
                f"node {node.metadata.name}: its NodeClaim names no NodePool or the node no GPUs, so "
                "nothing would make Karpenter replace it",
                reason=Reason.UNSUPPORTED,
            )
        gpus = {self._settings.gpu_resource: str(handle.gpus)}
        tolerations = [
            {"key": t.key, "operator": "Exists", "effect": t.effect}
            for t in node.spec.taints or []
            if not t.key.startswith(("pitcrew.dev/", "node.kubernetes.io/"))
        ]
        pod: dict[str, Any] = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": placeholder_name(handle.target),
                "labels": {"app.kubernetes.io/name": "pitcrew", "app.kubernetes.io/component": "placeholder"},
                "annotations": {OWNER_ANNOTATION: incident_id},
            },
            "spec": {
                "nodeSelector": {NODEPOOL_LABEL: pool},
                "tolerations": tolerations,
                "terminationGracePeriodSeconds": 0,
                "automountServiceAccountToken": False,
                "securityContext": {
                    "runAsNonRoot": True,
                    "runAsUser": 65535,
                    "seccompProfile": {"type": "RuntimeDefault"},
                },
                "containers": [
                    {
                        "name": "placeholder",
                        "image": PLACEHOLDER_IMAGE,
                        "resources": {"requests": gpus, "limits": gpus},
                        "securityContext": {
                            "allowPrivilegeEscalation": False,
                            "capabilities": {"drop": ["ALL"]},
                        },
                    }
                ],
            },
        }
        namespace = self._settings.jobs.namespace
        try:
            await call(
                f"create placeholder pod {namespace}/{placeholder_name(handle.target)}",
                self._core.create_namespaced_pod(namespace, pod, _request_timeout=self._timeout),
            )
        except TransientError as exc:
            if exc.reason != "conflict":  # 409 AlreadyExists: created before a retry or restart
                raise

    async def _guard_from_consolidation(self, node: client.V1Node) -> None:
        """Once the placeholder is gone, a node whose only pods are DaemonSet pods (slurmd in
        DaemonSet mode) is empty to Karpenter, and its consolidation would take it while Slurm runs
        jobs there: ``karpenter.sh/do-not-disrupt: "true"`` on the Node blocks consolidation and
        drift (not expiration or repair). Set before the placeholder goes; kept afterwards, as the
        NodePool's own template should set it for such a fleet."""
        if (node.metadata.annotations or {}).get(DO_NOT_DISRUPT) == "true":
            return
        await self._nodes.annotate(node.metadata.name, {DO_NOT_DISRUPT: "true"})

    async def _drop_placeholder(self, parsed: Handle) -> None:
        namespace, name = self._settings.jobs.namespace, placeholder_name(parsed.target)
        try:
            await call(
                f"delete placeholder pod {namespace}/{name}",
                self._core.delete_namespaced_pod(name, namespace, _request_timeout=self._timeout),
            )
        except PermanentError as exc:
            if exc.reason != "not_found":
                raise

    async def _bound_successor(self, parsed: Handle) -> ClusterNode | None:
        """The node a Machine of the same MachineSet (``status.nodeRef``) or a NodeClaim of the same
        NodePool (``status.nodeName``) made after the replacement started became — never a node
        merely alike. Two replacements in one pool each take a different one: the first to claim a
        node (a guarded annotation naming what it replaces) keeps it."""
        made, launched = await self._made_since(parsed)
        nodes = []
        for name in made:
            node = await self._nodes.read(name)
            if node is not None:
                nodes.append(node)
        mine = [n for n in nodes if (n.metadata.annotations or {}).get(SUCCESSOR_ANNOTATION) == parsed.target]
        if mine:
            return await self._bound(mine[0], parsed)
        for node in nodes:
            if (node.metadata.annotations or {}).get(SUCCESSOR_ANNOTATION):
                continue  # another replacement's successor
            body = {
                "metadata": {
                    "resourceVersion": node.metadata.resource_version,
                    "annotations": {SUCCESSOR_ANNOTATION: parsed.target},
                }
            }
            if await self._nodes.write(node.metadata.name, body, "claim successor"):
                return await self._bound(node, parsed)
        if parsed.strategy == "karpenter" and not launched:
            await self._demand_placed(parsed)
        return None

    async def _pod(self, namespace: str, name: str) -> client.V1Pod | None:
        """The pod, or ``None`` if it is gone."""
        try:
            pod: client.V1Pod = await call(
                f"read pod {namespace}/{name}",
                self._core.read_namespaced_pod(name, namespace, _request_timeout=self._timeout),
            )
        except PermanentError as exc:
            if exc.reason != Reason.NOT_FOUND:
                raise
            return None
        return pod

    async def _demand_placed(self, parsed: Handle) -> None:
        """The placeholder is demand only while it is pending: kube-scheduler binds a pod that fits
        an existing node at once, and Karpenter provisions only for pods the scheduler marked
        unschedulable. One bound to a node older than the replacement (a node of the NodePool with
        the GPUs free, as every node looks where slurmd pods request none) makes Karpenter launch
        nothing, and the wait would run out its budget. It is removed, as it holds those GPUs on a
        node it was not made for, and the replacement fails at once, naming the node; so it does
        when the placeholder is gone before any successor came. Asked only while no NodeClaim of
        the pool was made since the replacement began: one launching (the placeholder may have
        found an older node freed meanwhile) is awaited as any successor is."""
        namespace, name = self._settings.jobs.namespace, placeholder_name(parsed.target)
        pod = await self._pod(namespace, name)
        if pod is None:
            raise PermanentError(
                f"Karpenter will launch no node for {parsed.target}: pitcrew's placeholder pod "
                f"{namespace}/{name} is gone and no node made for it stands (deleted by someone, or "
                "with the node it was bound to). Replace the node by hand",
                reason=Reason.UNSUPPORTED,
            )
        where = pod.spec.node_name if pod.spec else None
        if not where:
            return
        node = await self._nodes.read(where)
        created = node.metadata.creation_timestamp if node is not None else None
        if created is not None and created >= parsed.since:
            return  # a node made since: the successor on its way, or another replacement's
        await self._drop_placeholder(parsed)
        pool = (parsed.owner or "").removeprefix("nodepool/")
        raise PermanentError(
            f"Karpenter will launch no node for {parsed.target}: the scheduler put pitcrew's "
            f"placeholder pod on existing node {where}, which had {parsed.gpus} GPUs free in NodePool "
            f"{pool}, so nothing was pending (placeholder removed). Replace the node by hand; where "
            "slurmd pods request no GPUs, every node of the pool looks free and this strategy cannot work",
            reason=Reason.UNSUPPORTED,
        )

    async def held_up(self, name: str, *, handle: str) -> str | None:
        """Karpenter's last ``FailedScheduling`` on the demand pod (the placeholder, or the NodeSet's
        pending slurmd pod) since the replacement began: why
        it launches no node for it (no instance type or offering left for the GPU request, a
        NodePool limit reached), which it says on the pod and retries. kube-scheduler's own
        ``FailedScheduling`` on the same pod ("0/N nodes are available") is what makes it demand,
        so it is not said. A NodeSet's slurmd pod not made again yet is said instead: nothing is
        pending, so Karpenter launches nothing until slurm-operator makes it. With ``cluster-api``,
        the old Machine still deleting: its MachineSet counts a deleting Machine toward its replicas
        ("Machines in deleted state are deliberately not excluded", machineset_controller.go), so no
        new Machine comes until Cluster API has finished it (its drain, its volumes' detach, its
        delete hooks: ``Termination.held`` says what holds it). ``None`` for any other strategy, or
        while nothing is said."""
        parsed = Handle.parse(handle)
        if parsed is not None and parsed.strategy == "cluster-api":
            return await self._old_machine_still_deleting(parsed)
        if parsed is None or parsed.strategy != "karpenter":
            return None
        namespace, pod = parsed.demand_pod(self._settings.jobs.namespace)
        if parsed.demand:
            found = await self._pod(namespace, pod)
            if found is None or found.metadata.deletion_timestamp is not None:
                state = "gone" if found is None else f"still terminating on {found.spec.node_name}"
                return (
                    f"slurm-operator has not made its NodeSet's slurmd pod {namespace}/{pod} again yet "
                    f"(the old one {state}); Karpenter launches the successor for it once it is pending"
                )
        listed = await call(
            f"list events of placeholder pod {namespace}/{pod}",
            self._core.list_namespaced_event(
                namespace,
                field_selector=f"involvedObject.kind=Pod,involvedObject.name={pod},reason=FailedScheduling",
                _request_timeout=self._timeout,
            ),
        )
        said = karpenter_said(listed.items, parsed.since)
        return f"Karpenter: {max(said)[1]}" if said else None

    async def _old_machine_still_deleting(self, parsed: Handle) -> str | None:
        found = await self.old_machine(parsed)
        if found is None or not deleting(found[1]):
            return None
        return (
            f"Cluster API has not deleted the old Machine {found[0]} yet, and its MachineSet makes "
            "the new Machine only once the old one is gone (it counts a deleting Machine toward its replicas)"
        )

    async def old_machine(self, parsed: Handle) -> tuple[str, dict[str, Any]] | None:
        """The Machine a ``cluster-api`` replacement deleted (its handle's ``machine/<ns>/<name>``),
        read where and as Machines are read: ``<ns>/<name>`` and the Machine; None once it is gone."""
        namespace, _, name = parsed.target.removeprefix("machine/").partition("/")
        machine = await self.machine_named(namespace, name) if name else None
        return None if machine is None else (f"{namespace}/{name}", machine)

    async def _bound(self, node: client.V1Node, parsed: Handle) -> ClusterNode:
        """The successor's facts; a Ready Karpenter successor is guarded, then its demand removed
        (at the claim too: a node Ready when first found is never asked for again)."""
        found = facts(node, self._settings.gpu_resource)
        if found.ready and parsed.strategy == "karpenter":
            await self._guard_from_consolidation(node)
            await self._drop_placeholder(parsed)  # the demand has done its work
        return found

    async def _made_since(self, parsed: Handle) -> tuple[list[str], bool]:
        """Node names of the handles ``parsed.owner`` created since the replacement, oldest first,
        and whether any such handle exists, with its node or still launching."""
        kind, _, rest = (parsed.owner or "").partition("/")
        if kind == "machineset":
            group, version, plural = await self._capi()
            namespace, _, machineset = rest.partition("/")
            listed: dict[str, Any] = await call(
                f"list Machines in {namespace}",
                self._machines.list_namespaced_custom_object(
                    group, version, namespace, plural, _request_timeout=self._timeout
                ),
            )
            handles = [
                m
                for m in listed["items"]
                if any(
                    o.get("kind") == "MachineSet" and o.get("name") == machineset
                    for o in m["metadata"].get("ownerReferences") or []
                )
            ]
        else:
            listed = await call(
                f"list NodeClaims of NodePool {rest}",
                self._custom.list_cluster_custom_object(
                    *KARPENTER, label_selector=f"{NODEPOOL_LABEL}={rest}", _request_timeout=self._timeout
                ),
            )
            handles = listed["items"]
        since = parsed.since.strftime("%Y-%m-%dT%H:%M:%SZ")
        fresh = [
            h
            for h in handles
            if h["metadata"].get("creationTimestamp", "") >= since
            and not deleting(h)
            and not parsed.target.endswith(f"/{h['metadata']['name']}")
        ]
        fresh.sort(key=lambda h: (h["metadata"].get("creationTimestamp", ""), h["metadata"]["name"]))
        return [str(node_of(h)) for h in fresh if node_of(h)], bool(fresh)


async def run_command(argv: Sequence[str], node: str, incident_id: str, action: str, limit: float) -> str:
    """Run an operator's executable without a shell; its output (stdout and stderr). Exit code 0
    is success, anything else a permanent failure naming the output's last lines."""
    env = {**os.environ, "PITCREW_NODE": node, "PITCREW_INCIDENT": incident_id, "PITCREW_ACTION": action}
    process = await asyncio.create_subprocess_exec(
        *argv, env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT
    )
    try:
        # Not ``asyncio.wait_for``: on Python 3.11 it swallows a cancellation that comes as the
        # command ends (CPython gh-86296), and a stopped step would go on as if never stopped.
        async with asyncio.timeout(limit):
            output, _ = await process.communicate()
    except TimeoutError as exc:
        process.kill()
        await process.wait()
        raise TransientError(
            f"{action} command for {node} timed out after {limit:g}s", reason=Reason.TIMEOUT
        ) from exc
    if process.returncode != 0:
        tail = output.decode(errors="replace").strip().splitlines()[-3:]
        raise PermanentError(
            f"{action} command for {node} exited {process.returncode}: {' | '.join(tail)}",
            reason=Reason.COMMAND_FAILED,
        )
    return output.decode(errors="replace")
