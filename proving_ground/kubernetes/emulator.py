"""A kube-apiserver stand-in: kmock's HTTP server and scaffold, with the apiserver rules pitcrew relies on.

kmock's own ``KubernetesEmulator`` merges every write as a plain dict and keeps no resourceVersion, so this
layer keeps its own store and serves the resources pitcrew touches (nodes, pods, pods/eviction, PDBs,
CAPI Machines, Karpenter NodeClaims) with the rules in ``fixtures/README.md``: Status errors, optimistic
concurrency, the PATCH content types, selectors, eviction against PDBs, and deletion with finalizers.
Everything else (discovery, unknown paths) falls through to kmock. It must never patch the client:
tests reach it only over HTTP with the real ``kubernetes.aio`` client.
"""

from __future__ import annotations

import asyncio
import copy
import functools
import json
import re
import uuid
from collections import Counter
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import aiohttp.web
import attrs
import kmock
from kubernetes import client as sync_client

from proving_ground.kubernetes import capi, karpenter, patching, podsecurity, resources, slinky
from proving_ground.kubernetes.faults import Fault, FaultPlan, LoggedRequest
from proving_ground.kubernetes.resources import ApiError, Resource
from proving_ground.kubernetes.selectors import SelectorError, field_matches, labels_match
from proving_ground.kubernetes.slinky import OPERATOR_PREFIX, MemorySlurm, SlurmSide, slurm_reason

FIXTURES = Path(__file__).resolve().parent / "fixtures"
Key = tuple[str, str | None, str]

_PATH = re.compile(
    r"^/(?:api/(?P<core>v1)|apis/(?P<group>[^/]+)/(?P<version>[^/]+))"
    r"(?:/namespaces/(?P<ns>[^/]+))?/(?P<plural>[^/]+)(?:/(?P<name>[^/]+))?(?:/(?P<sub>[^/]+))?$"
)
_CLOUD_TERMINATE = "/emulator/cloud/terminate/"
#: Where ``exec_credential.py`` (a kubeconfig exec plugin) gets a token that expires.
TOKEN_SERVICE = "/emulator/token"
#: The token of ``world.write_kubeconfig``'s user: accepted for ever (a legacy service-account token).
EMULATED_TOKEN = "emulated-token"
#: The header a raw HTTP client (a test, the demo) sends to be let in.
AUTH_HEADER = {"Authorization": f"Bearer {EMULATED_TOKEN}"}
_TAINT_EFFECTS = ("NoSchedule", "PreferNoSchedule", "NoExecute")
_MODELS = {
    "Node": "V1Node",
    "Namespace": "V1Namespace",
    "Pod": "V1Pod",
    "PodDisruptionBudget": "V1PodDisruptionBudget",
    "Job": "V1Job",
    "Event": "CoreV1Event",
    "Eviction": "V1Eviction",
    "SelfSubjectAccessReview": "V1SelfSubjectAccessReview",
}
#: Attributes of a SelfSubjectAccessReview the emulator can be told to deny: (verb, group, resource, sub).
Permission = tuple[str, str, str, str]
_validator = sync_client.ApiClient()
# The client imports each model lazily on its first use (over a second for the first pod): pay that
# here, once, not inside a request a test's client is timing.
for _model in ("V1Pod", "V1Job", "V1Node"):
    _validator._ApiClient__deserialize({"metadata": {"name": "warm"}}, _model)


def load_fixture(name: str) -> Any:
    return json.loads((FIXTURES / name).read_text())


#: The Job controller's finalizer on its pods, removed once it has counted them (terminal).
JOB_TRACKING = "batch.kubernetes.io/job-tracking"


def now_iso(offset: float = 0.0) -> str:
    return (datetime.now(UTC) + timedelta(seconds=offset)).strftime("%Y-%m-%dT%H:%M:%SZ")


@attrs.define(kw_only=True)
class KubeEmulator(kmock.KubernetesScaffold):
    """The apiserver state (``objects``), its request log, injectable faults and two tiny controllers."""

    objects: dict[Key, dict[str, Any]] = attrs.field(factory=dict)
    log: list[LoggedRequest] = attrs.field(factory=list)
    faults: FaultPlan = attrs.field(factory=FaultPlan)
    #: Seconds the kubelet stand-in takes to remove a terminating pod; None keeps it until a test finishes it.
    #: Only a node whose Ready condition is True has a kubelet to confirm: on any other node a
    #: terminating pod stays until it is force-deleted (grace 0), as on a real dead node.
    pod_termination_delay: float | None = 0.05
    #: Seconds after a Machine/NodeClaim delete until the replacement Node exists, then until it is Ready
    #: (None: it stays NotReady until someone flips its condition, as ``scripts/demo`` does).
    replace_delay: float = 0.05
    ready_delay: float | None = 0.1
    #: The cloud's instance groups (an AWS Auto Scaling group, a GCE managed instance group): deleting
    #: a Node object stops no instance and replaces nothing (the kubelet keeps running on the old one).
    #: Only a terminated instance (``POST /emulator/cloud/terminate/<node>``, what the provider's CLI
    #: does, ``cloud.py``) is replaced: cloud-controller-manager deletes its Node, a new instance
    #: registers, then turns Ready. ``terminated`` lists the instances terminated, in order.
    terminated: list[str] = attrs.field(factory=list)
    #: Bearer tokens the API server accepts, each with its expiry (``loop.time()``; None: never).
    #: A request with none, an unknown one or an expired one is answered 401 Unauthorized, as an
    #: expired EKS/GKE exec-plugin token is. ``issue_token(ttl)`` mints one (the exec plugin's job).
    tokens: dict[str, float | None] = attrs.field(factory=lambda: {EMULATED_TOKEN: None})
    #: Karpenter launches a node only for pending pods: a deleted NodeClaim takes its Node with it and
    #: is replaced by nothing unless a pod of its NodePool is pending. Leniency by name:
    #: ``karpenter_replaces_deleted_claims`` makes a new NodeClaim for every deleted one (what
    #: Karpenter's disruption controller does when it replaces a node itself: it launches first).
    karpenter_replaces_deleted_claims: bool = False
    #: Karpenter's consolidation (v1 NodePool defaults: ``WhenEmptyOrUnderutilized``, ``consolidateAfter``
    #: 0s): seconds after the last pod other than a DaemonSet's leaves a node Karpenter launched
    #: until it deletes that node and its NodeClaim, unless ``karpenter.sh/do-not-disrupt: "true"`` is
    #: on either. A node whose slurmd runs as a DaemonSet pod is empty to it. ``consolidated`` lists them.
    karpenter_consolidate_after: float = 0.2
    consolidated: list[str] = attrs.field(factory=list)
    #: Karpenter finds nothing to launch for a pending pod of a NodePool (no instance type or
    #: offering left for its GPU request, a NodePool limit reached): the error its provisioner
    #: gives, said on the pod as its recorder does (a Warning ``FailedScheduling`` from
    #: ``karpenter``: "Failed to schedule pod, <error>"), and nothing is launched. ``None``: it launches.
    #: Karpenter looks at the pending pods again, as its provisioner does in a loop, every
    #: ``karpenter_retry_after`` seconds while one is left pending so.
    karpenter_cannot_launch: str | None = None
    karpenter_retry_after: float = 0.5
    #: Karpenter's termination of a deleted NodeClaim's Node (``karpenter.py``): taint, drain through
    #: the Eviction API (PDBs honoured, ``do-not-disrupt`` pods left), again every
    #: ``karpenter_drain_retry`` seconds (Karpenter: 1 s) while a pod waits; the Node and NodeClaim
    #: go only once none is left, or its ``terminationGracePeriod`` forces them out.
    karpenter_drain_retry: float = 0.1
    #: Cluster API's Machine controller on a deleted Machine (``_capi_delete``): hooks, then drain
    #: through the Eviction API (PDBs honoured, DaemonSet and mirror pods skipped), looked at again
    #: every ``capi_drain_retry`` seconds (Cluster API: ``drainRetryInterval``, 20 s) while held.
    capi_drain_retry: float = 0.1
    #: Karpenter's recorder says one ``FailedDraining`` per node in this many seconds (its dedupe
    #: timeout, 2 min), dropping the others: ``_karpenter_event``.
    karpenter_dedupe: float = 120.0
    _karpenter_said: dict[str, datetime] = attrs.field(factory=dict)
    _karpenter_retrying: bool = False
    _karpenter_launched: set[str] = attrs.field(factory=set)
    _karpenter_pools: dict[str, dict[str, Any]] = attrs.field(factory=dict)
    #: Seconds after a StatefulSet-mode NodeSet pod is gone until its NodeSet makes it again
    #: (``_nodeset_recreates``). slurm-operator counts a terminating pod as one of its replicas and
    #: makes the new one only on a sync after the old one is removed; that sync is woken by the
    #: pod's delete event, but is skipped while the controller's expectations are unsatisfied
    #: (up to their 5-minute timeout), else comes with the 30-second periodic requeue, or when a
    #: stopped operator is back. Never at once: strict, a test lengthens it to show the gap.
    nodeset_recreate_delay: float = 0.1
    #: DaemonSet-mode NodeSet pods removed, by the node they ran on: what the NodeSet makes a
    #: replacement of that node from (``_nodeset_daemon``).
    _nodeset_gone: dict[str, list[dict[str, Any]]] = attrs.field(factory=dict)
    #: The versions of ``cluster.x-k8s.io`` served, preferred first (``capi.SERVED``: Cluster API
    #: v1.11 to v1.15; ``("v1beta2",)`` is v1.16 on, ``("v1beta1",)`` before v1.11). Any other is
    #: answered 404 as an API server does, and a Machine is given out in the version asked.
    capi_versions: tuple[str, ...] = capi.SERVED
    #: The Cluster API release whose Machine controller deletes Machines (``_capi_held_by``): from
    #: v1.9 (``capi.V1BETA2_CONDITIONS``) its v1beta2 ``Deleting`` condition (kept in
    #: ``status.v1beta2.conditions``, served as ``status.conditions`` in v1beta2), ``status.deletion``
    #: and its v1beta1 conditions; before it (v1.8: serve ``("v1beta1",)`` with it) v1beta1
    #: conditions only, as ``release-1.8``'s ``reconcileDelete`` writes them.
    capi_release: tuple[int, int] = (1, 11)
    #: The versions of ``cluster.x-k8s.io`` whose discovery document was asked for, in order.
    capi_discovered: list[str] = attrs.field(factory=list)
    #: Machines deleted while paused (their Cluster's ``spec.paused``, their own annotation): they
    #: keep their ``deletionTimestamp`` and finalizer, and nothing replaces them until unpaused.
    _capi_held: set[Key] = attrs.field(factory=set)
    #: Seconds a Job's pod runs; exit codes by Job name (default 0), as the kubelet would report them:
    #: one code for every attempt, or a list with one per attempt (the last repeats).
    job_exit_codes: dict[str, int | list[int]] = attrs.field(factory=dict)
    job_duration: float = 0.1
    #: Seconds a named Job's pods run instead (a reset that hangs: longer than its deadline).
    job_durations: dict[str, float] = attrs.field(factory=dict)
    #: Seconds after a reboot Job starts until the node comes back with a new boot id. A real reboot
    #: takes the Job's own pod down with the node: it ends Failed, never Succeeded. Leniency by name:
    #: ``reboot_job_reports_success`` lets the pod exit 0 first (a reboot scheduled after the exit).
    reboot_delay: float = 0.3
    reboot_job_reports_success: bool = False
    #: slurm-operator stand-in: seconds after a Node is cordoned until the operator reconciles it;
    #: None: no operator. It drains the Slurm node of each NodeSet pod there (reason
    #: ``slurm-operator: `` + the node's cordon-reason annotation) only when the Slurm node has no
    #: reason or one of its own: another's reason (an administrator's, pitcrew's own DRAIN) is kept
    #: and the node left as it is (``slinky_kept``). ``pod-protect`` follows the Slurm node's
    #: business only: a drain lets running jobs finish, so it stays until they end or leave, re-read
    #: every ``slinky_resync`` seconds while the Node is cordoned. ``slinky_reasons`` records, per
    #: node it drained, the annotation found (None: it was not there yet). ``slinky_slurm`` is the
    #: Slurm it reads and drains (``slinky.py``: in memory, or a real cluster through scontrol).
    #: As long after an uncordon it undrains the Node's pods' Slurm nodes (``_slinky_undrain``).
    slinky_drain_delay: float | None = None
    slinky_reasons: dict[str, str | None] = attrs.field(factory=dict)
    slinky_kept: dict[str, str] = attrs.field(factory=dict)
    slinky_slurm: SlurmSide = attrs.field(factory=MemorySlurm)
    #: Slurm nodes the slurmd container's preStop hook set DOWN, in order (``_slinky_prestop``).
    slinky_prestops: list[str] = attrs.field(factory=list)
    slinky_resync: float = 0.1
    #: slurm-operator's sync of a NodeSet pod bound to a Node that is not cordoned (its undrain,
    #: ``_slinky_bound``) is held while True, and runs once ``slinky_release`` is called: a test puts
    #: it after what it waits for (the operator's sync lags the bind by its reconcile, any length).
    slinky_sync_held: bool = False
    _slinky_held: list[str] = attrs.field(factory=list)
    #: Resources whose CRD this API server does not have: their paths answer 404 ``404 page not found``
    #: (text/plain), as for any group the server does not serve. A workload cluster managed from
    #: elsewhere has no ``machines``: Cluster API keeps them in the management cluster.
    absent: set[str] = attrs.field(factory=set)
    #: A management cluster's MachineSet controller acts on the Nodes of this workload cluster (its
    #: kubeconfig Secret); None: on this server's own Nodes (a self-hosted cluster).
    workload: KubeEmulator | None = None
    #: Permissions every SelfSubjectAccessReview answers "not allowed" for.
    denied: set[Permission] = attrs.field(factory=set)
    _rv: int = 48213377
    _tasks: set[asyncio.Task[None]] = attrs.field(factory=set)

    async def __aexit__(self, *exc: Any) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await super().__aexit__(*exc)

    # --- world set-up and inspection for tests (not over HTTP) ---------------------------------------

    @property
    def host(self) -> str:
        return str(self.servers[0].url).rstrip("/")

    def add(self, plural: str, obj: dict[str, Any]) -> dict[str, Any]:
        res = resources.BY_PLURAL[plural]
        obj = copy.deepcopy(obj)
        obj.setdefault("apiVersion", res.api_version)
        obj.setdefault("kind", res.kind)
        meta = obj.setdefault("metadata", {})
        meta.setdefault("uid", str(uuid.uuid4()))
        meta.setdefault("creationTimestamp", now_iso())
        if res.generation:
            meta.setdefault("generation", 1)
        meta["resourceVersion"] = self._bump()
        self.objects[self._key(res, meta.get("namespace"), meta["name"])] = obj
        return obj

    def seed_namespaces(self) -> None:
        """The namespaces of the fixtures and of pitcrew's manifests (``deploy/kubernetes``): ``pitcrew``
        enforces the restricted Pod Security level, ``pitcrew-jobs`` (the repair Jobs) privileged."""
        levels = {"pitcrew": "restricted", "pitcrew-jobs": "privileged"}
        for name in ("default", "kube-system", "gpu-operator", "slurm", "training", *levels):
            labels = {"kubernetes.io/metadata.name": name}
            if name in levels:
                labels[podsecurity.ENFORCE] = levels[name]
            if ("namespaces", None, name) not in self.objects:
                self.add("namespaces", {"metadata": {"name": name, "labels": labels}})

    def seed_fixture_world(self) -> None:
        """``gpu-node-02`` with the five pods of the fixtures, its CAPI Machine and Cluster and its
        Karpenter NodeClaim."""
        self.add("nodes", load_fixture("node-gpu.json"))
        for pod in load_fixture("pods-on-node-list.json")["items"]:
            self.add("pods", pod)
        self.add("machines", load_fixture("machine-capi.json"))
        self.add("clusters", capi.cluster("gpu-east", "gpu-east"))
        self.add("nodeclaims", load_fixture("nodeclaim-karpenter.json"))
        self.seed_namespaces()

    def set_pod_security(self, namespace: str, level: str) -> None:
        """Label ``namespace`` with the Pod Security ``enforce`` level, as an administrator would."""
        obj = self.objects[("namespaces", None, namespace)]
        obj["metadata"].setdefault("labels", {})[podsecurity.ENFORCE] = level
        self.bump(obj)

    # Shadows kmock's HTTP-client ``get``: nothing here fetches through it (clients use the real
    # ``kubernetes.aio`` over HTTP), and tests read the stored object by this name.
    def get(  # type: ignore[override]
        self, plural: str, name: str, namespace: str | None = None
    ) -> dict[str, Any] | None:
        return self.objects.get(self._key(resources.BY_PLURAL[plural], namespace, name))

    def set_node_condition(self, node: str, type_: str = "Ready", status: str = "True") -> None:
        """Flip a node condition as the kubelet would; a write, so the resourceVersion moves."""
        obj = self.objects[("nodes", None, node)]
        conditions = obj.setdefault("status", {}).setdefault("conditions", [])
        cond = next((c for c in conditions if c["type"] == type_), None)
        if cond is None:
            cond = {"type": type_}
            conditions.append(cond)
        cond.update(status=status, lastTransitionTime=now_iso(), reason=f"Emulator{type_}{status}")
        obj["metadata"]["resourceVersion"] = self._bump()

    def slurm_node_busy(self, hostname: str, busy: bool) -> None:
        """A job starts or ends on the Slurm node (in the in-memory Slurm), and slurm-operator's
        answer: ``pod-protect`` on the node's slurmd pods while the Slurm node is busy (allocated,
        mixed, completing), removed once it is not."""
        if isinstance(self.slinky_slurm, MemorySlurm):
            self.slinky_slurm.busy[hostname] = busy
        self._pod_protect(hostname, busy)

    def _pod_protect(self, hostname: str, busy: bool) -> None:
        for (plural, _, _), pod in self.objects.items():
            labels = pod["metadata"].get("labels") or {}
            if plural != "pods" or labels.get("nodeset.slinky.slurm.net/pod-hostname") != hostname:
                continue
            protected = labels.get("nodeset.slinky.slurm.net/pod-protect") == "true"
            if busy and not protected:
                labels["nodeset.slinky.slurm.net/pod-protect"] = "true"
            elif not busy and protected:
                labels.pop("nodeset.slinky.slurm.net/pod-protect", None)
            else:
                continue
            self.bump(pod)

    def machine_health_check_fails(self, namespace: str, name: str) -> None:
        """A MachineHealthCheck finds the Machine's node unhealthy: ``HealthCheckSucceeded`` False
        (``UnhealthyNode``) and ``OwnerRemediated`` False (``WaitingForRemediation``), set as Cluster
        API v1.11 on sets them, both as v1beta1 conditions (with a severity) and as v1beta2 ones
        (each version of the Machine shows its own: ``capi``). Its MachineSet acts on that when the
        test says (``machine_set_remediates``): a delay here would race the reads under test."""
        machine = self.objects[("machines", namespace, name)]
        status = machine.setdefault("status", {})
        legacy = status.setdefault("conditions", [])
        current = status.setdefault("v1beta2", {}).setdefault("conditions", [])
        for type_, reason in (
            ("HealthCheckSucceeded", "UnhealthyNode"),
            ("OwnerRemediated", "WaitingForRemediation"),
        ):
            at = now_iso()
            legacy[:] = [c for c in legacy if c.get("type") != type_]
            legacy.append(
                {
                    "type": type_,
                    "status": "False",
                    "severity": "Warning",
                    "lastTransitionTime": at,
                    "reason": reason,
                }
            )
            current[:] = [c for c in current if c.get("type") != type_]
            generation = machine["metadata"].get("generation", 1)
            current.append(
                {
                    "type": type_,
                    "status": "False",
                    "observedGeneration": generation,
                    "lastTransitionTime": at,
                    "reason": reason,
                }
            )
        self.bump(machine)

    def machine_set_remediates(self, namespace: str, name: str) -> None:
        """The Machine's MachineSet remediates it (``OwnerRemediated`` False): deletes it now and, as
        for any deleted Machine, makes a new one ``replace_delay`` later."""
        current = self.objects.get(("machines", namespace, name))
        if current is not None and not current["metadata"].get("deletionTimestamp"):
            self._delete(resources.BY_PLURAL["machines"], current, None)

    def _slinky_hostnames(self, node_name: str) -> set[str]:
        return {
            str(host)
            for (plural, _, _), pod in self.objects.items()
            if plural == "pods"
            and (pod.get("spec") or {}).get("nodeName") == node_name
            and (host := (pod["metadata"].get("labels") or {}).get("nodeset.slinky.slurm.net/pod-hostname"))
        }

    def _slinky_operator_sees_cordon(self, node: dict[str, Any]) -> None:
        assert self.slinky_drain_delay is not None
        name = node["metadata"]["name"]
        self._later(self.slinky_drain_delay, lambda: self._slinky_reconcile(name))

    async def _slinky_reconcile(self, name: str) -> None:
        """slurm-operator's syncCordon, then its pod-protect sync while the Node stays cordoned."""
        node = self.objects.get(("nodes", None, name))
        annotations = (node or {}).get("metadata", {}).get("annotations") or {}
        annotation = annotations.get("nodeset.slinky.slurm.net/node-cordon-reason")
        for hostname in sorted(self._slinky_hostnames(name)):
            _, reason = await self.slinky_slurm.state(hostname)
            if reason and not reason.startswith(OPERATOR_PREFIX):
                self.slinky_kept[hostname] = reason  # "externally set into a state, preserve it"
                continue
            default = f"Node ({name}) was cordoned, Pod ({hostname}) must be cordoned"
            await self.slinky_slurm.drain(hostname, OPERATOR_PREFIX + slurm_reason(annotation or default))
            self.slinky_reasons[name] = annotation
        while True:
            node = self.objects.get(("nodes", None, name))
            hostnames = self._slinky_hostnames(name)
            if node is None or not (node.get("spec") or {}).get("unschedulable") or not hostnames:
                return
            for hostname in hostnames:
                busy, _ = await self.slinky_slurm.state(hostname)
                self._pod_protect(hostname, busy)
            await asyncio.sleep(self.slinky_resync)

    def _slinky_bound(self, pod: dict[str, Any], node_name: str) -> None:
        """A NodeSet pod bound to a node: slurm-operator's next sync runs ``syncCordon`` for it as
        for each of its pods (every sync, not on a cordon or an uncordon only), so on a node that is
        not cordoned (a replica made again on its successor) it undrains the pod's Slurm node."""
        node = self.objects.get(("nodes", None, node_name))
        if self.slinky_drain_delay is None or slinky.scaling_mode(pod) is None or node is None:
            return
        if (node.get("spec") or {}).get("unschedulable"):
            return
        if self.slinky_sync_held:
            self._slinky_held.append(node_name)
        else:
            self._later(self.slinky_drain_delay, lambda: self._slinky_undrain(node_name))

    def slinky_release(self) -> None:
        """slurm-operator's syncs ``slinky_sync_held`` held run now, and later ones as they come."""
        self.slinky_sync_held = False
        held, self._slinky_held = self._slinky_held, []
        for name in held:
            self._later(0, functools.partial(self._slinky_undrain, name))

    async def _slinky_undrain(self, name: str) -> None:
        """slurm-operator's syncCordon for the NodeSet pods of an uncordoned Node: each one's Slurm
        node undrained (``MakeNodeUndrain``, reason ``Pod (<ns>/<pod>) was uncordoned`` under its
        prefix; ``SlurmSide.undrain`` says when it acts and what UNDRAIN leaves)."""
        node = self.objects.get(("nodes", None, name))
        if node is None or (node.get("spec") or {}).get("unschedulable"):
            return
        for (plural, namespace, pod_name), pod in list(self.objects.items()):
            meta = pod["metadata"]
            hostname = (meta.get("labels") or {}).get("nodeset.slinky.slurm.net/pod-hostname")
            if plural != "pods" or (pod.get("spec") or {}).get("nodeName") != name or not hostname:
                continue
            if meta.get("deletionTimestamp"):
                continue  # a terminating pod is not synced ("skipping further processing")
            reason = OPERATOR_PREFIX + f"Pod ({namespace}/{pod_name}) was uncordoned"
            await self.slinky_slurm.undrain(str(hostname), reason)

    def kubelet_gone(self, node: str, *, taint_manager: bool = True) -> None:
        """The node's kubelet stops posting status: the node lifecycle controller sets Ready to
        Unknown and adds the ``unreachable`` taints; with ``taint_manager`` the pods that do not
        tolerate ``unreachable:NoExecute`` forever (all but DaemonSet pods, whose controller adds
        that toleration) are marked for deletion by the taint manager, as after their
        ``tolerationSeconds`` (300 s by default). Its pods are marked not Ready (the controller's
        ``MarkPodsNotReady``), so their disruption budgets count them unhealthy, and an eviction of
        one is let through as the API server does. Nothing on the node is removed: no kubelet confirms."""
        self.set_node_condition(node, "Ready", "Unknown")
        for (plural, _, _), pod in self.objects.items():  # the node lifecycle controller's MarkPodsNotReady
            if plural == "pods" and (pod.get("spec") or {}).get("nodeName") == node:
                for condition in (pod.setdefault("status", {})).get("conditions", []):
                    if condition.get("type") == "Ready":
                        condition["status"] = "False"
                self.bump(pod)
        obj = self.objects[("nodes", None, node)]
        taints = obj["spec"].setdefault("taints", [])
        for effect in ("NoSchedule", "NoExecute"):
            taint = {"key": "node.kubernetes.io/unreachable", "effect": effect}
            if taint not in [{"key": t.get("key"), "effect": t.get("effect")} for t in taints]:
                taints.append({**taint, **({"timeAdded": now_iso()} if effect == "NoExecute" else {})})
        self.bump(obj)
        if not taint_manager:
            return
        for key, pod in list(self.objects.items()):
            owners = pod["metadata"].get("ownerReferences") or []
            if key[0] != "pods" or (pod.get("spec") or {}).get("nodeName") != node:
                continue
            if any(o.get("kind") == "DaemonSet" for o in owners) or pod["metadata"].get("deletionTimestamp"):
                continue
            grace = int((pod.get("spec") or {}).get("terminationGracePeriodSeconds", 30))
            pod["metadata"].update(deletionTimestamp=now_iso(grace), deletionGracePeriodSeconds=grace)
            conditions = pod.setdefault("status", {}).setdefault("conditions", [])
            conditions.append(
                {
                    "type": "DisruptionTarget",
                    "status": "True",
                    "reason": "DeletionByTaintManager",
                    "message": "Taint manager: deleting due to NoExecute taint",
                    "lastTransitionTime": now_iso(),
                }
            )
            self.bump(pod)

    def _kubelet_alive(self, pod: dict[str, Any]) -> bool:
        node = self.objects.get(("nodes", None, (pod.get("spec") or {}).get("nodeName") or ""))
        return node is not None and resources.ready(node)

    def bump(self, obj: dict[str, Any]) -> None:
        """A write by someone else than the client under test: the object's resourceVersion moves."""
        obj["metadata"]["resourceVersion"] = self._bump()

    def inject(self, status: int | None = None, **match: Any) -> Fault:
        """Make matching requests fail with ``status`` (or only ``delay``); see ``Fault``."""
        return self.faults.add(Fault(status=status, **match))

    # --- HTTP ------------------------------------------------------------------------------------------

    def issue_token(self, ttl: float | None) -> str:
        """A new bearer token valid for ``ttl`` seconds (None: for ever), as an exec plugin gets one."""
        token = f"k8s-aws-v1.{uuid.uuid4().hex}"
        self.tokens[token] = None if ttl is None else asyncio.get_running_loop().time() + ttl
        return token

    def expire_tokens(self) -> None:
        """Every token ``issue_token`` minted expires now (time passing, without the wait)."""
        for token, expiry in self.tokens.items():
            if expiry is not None:
                self.tokens[token] = 0.0

    def _authenticated(self, request: kmock.Request) -> bool:
        header = _header(request, "Authorization") or ""
        scheme, _, token = header.partition(" ")
        if scheme.lower() != "bearer" or token not in self.tokens:
            return False
        expiry = self.tokens[token]
        return expiry is None or asyncio.get_running_loop().time() < expiry

    def _cloud(self, request: kmock.Request) -> aiohttp.web.StreamResponse:
        """The cloud provider's API, as far as pitcrew's provider action reaches it: terminate the
        instance behind a node; its group launches a new one."""
        node = request.url.path.removeprefix(_CLOUD_TERMINATE)
        if request.method.value != "POST" or not node or "/" in node:
            return aiohttp.web.json_response({"error": "POST /emulator/cloud/terminate/<node>"}, status=400)
        self.terminated.append(node)
        template = copy.deepcopy(self.objects.get(("nodes", None, node)))

        async def replaced() -> None:
            self.objects.pop(("nodes", None, node), None)  # cloud-controller-manager: the instance is gone
            if template is not None:
                await self._new_instance(template)

        self._later(self.replace_delay, replaced)
        return aiohttp.web.json_response({"terminated": node}, status=202)

    def _versions(self, res: Resource) -> tuple[str, ...]:
        """The versions ``res`` is served in: Cluster API's as configured (``capi_versions``)."""
        return self.capi_versions if res.group == capi.GROUP else (res.version,)

    def _capi_discovery(self, request: kmock.Request, version: str) -> aiohttp.web.StreamResponse:
        """A version of Cluster API's group, where served (none in a cluster without its CRDs)."""
        self.capi_discovered.append(version)
        if not self._authenticated(request):
            body = resources.status_body(401, "Unauthorized", "Unauthorized")
            return aiohttp.web.json_response(body, status=401)
        if request.method.value != "GET" or "machines" in self.absent or version not in self.capi_versions:
            return aiohttp.web.Response(status=404, text="404 page not found\n")
        return aiohttp.web.json_response(capi.api_resources(version))

    def _token_service(self, request: kmock.Request) -> aiohttp.web.StreamResponse:
        """The identity provider an exec plugin asks (STS for EKS, Google's for GKE): a token the API
        server accepts for ``ttl`` seconds, and its expiry as the plugin reports it."""
        ttl = float(request.params.get("ttl", "900"))
        token = self.issue_token(ttl)
        return aiohttp.web.json_response({"token": token, "expirationTimestamp": now_iso(ttl)}, status=201)

    async def _handle(self, request: kmock.Request) -> aiohttp.web.StreamResponse:
        if request.url.path.startswith(_CLOUD_TERMINATE):
            return self._cloud(request)
        if request.url.path == TOKEN_SERVICE and request.method.value == "POST":
            return self._token_service(request)
        if request.url.path.startswith(f"/apis/{capi.GROUP}/") and request.url.path.count("/") == 3:
            return self._capi_discovery(request, request.url.path.rpartition("/")[2])
        match = _PATH.match(request.url.path)
        group = "" if match is None or match["core"] else match["group"]
        res = resources.BY_GROUP_PLURAL.get((group, match["plural"])) if match else None
        if match is None or res is None:
            return await super()._handle(request)
        version = match["core"] or match["version"]
        if res.plural in self.absent or version not in self._versions(res):
            return aiohttp.web.Response(status=404, text="404 page not found\n")
        entry = LoggedRequest.of(request, res, match["ns"], match["name"], match["sub"])
        self.log.append(entry)
        try:
            if not self._authenticated(request):
                raise ApiError(401, "Unauthorized", "Unauthorized")
            fault = self.faults.take(entry)
            if fault is not None:
                if fault.before is not None:
                    fault.before()
                if fault.delay:
                    await asyncio.sleep(fault.delay)
                if fault.status is not None:
                    raise fault.error(res, match["name"])
            if version != res.version and request.method.value in ("POST", "PUT"):
                raise ApiError(405, "MethodNotAllowed", f"writing {res.plural} as {version} is not emulated")
            body, code = self._serve(request, res, match["ns"], match["name"], match["sub"])
            body = capi.as_served(body, version) if res.group == capi.GROUP else body
            entry.status = code
            if fault is not None and fault.delay_after:
                await asyncio.sleep(fault.delay_after)
            if fault is not None and fault.lost_answer is not None:
                raise ApiError.injected(fault.lost_answer, res, match["name"], fault.retry_after)
            return aiohttp.web.json_response(body, status=code)
        except ApiError as exc:
            entry.status = exc.code
            return aiohttp.web.json_response(exc.body, status=exc.code, headers=exc.headers)

    def _serve(
        self, request: kmock.Request, res: Resource, ns: str | None, name: str | None, sub: str | None
    ) -> tuple[dict[str, Any], int]:
        method = request.method.value
        if sub == "eviction" and res.plural == "pods" and method == "POST" and name:
            return self._evict(ns, name, request)
        if sub is not None:
            raise ApiError.not_found(res, name or "", f"the subresource {sub} is not emulated")
        if method == "GET" and request.params.get("watch") in ("true", "1"):
            raise ApiError(405, "MethodNotAllowed", "watch is not emulated")
        if method == "GET" and name is None:
            return self._list(res, ns, request.params), 200
        if method == "POST" and name is None and res.plural == "selfsubjectaccessreviews":
            return self._review(res, _json(request)), 201
        if method == "POST" and name is None:
            dry_run = request.params.get("dryRun") == "All"
            return self._create(res, ns, _json(request), dry_run=dry_run), 201
        if name is None:
            raise ApiError(405, "MethodNotAllowed", f"{method} on a collection is not emulated")
        current = self._existing(res, ns, name)
        if method == "GET":
            return copy.deepcopy(current), 200
        if method == "PATCH":
            return self._patch(res, current, request), 200
        if method == "PUT":
            return self._update(res, current, _json(request)), 200
        if method == "DELETE":
            return self._delete(res, current, _grace(request))
        raise ApiError(405, "MethodNotAllowed", f"{method} is not allowed")

    # --- verbs -----------------------------------------------------------------------------------------

    def _list(self, res: Resource, ns: str | None, params: Any) -> dict[str, Any]:
        items = []
        for (plural, obj_ns, _), obj in sorted(
            self.objects.items(), key=lambda kv: (kv[0][1] or "", kv[0][2])
        ):
            if plural != res.plural or (ns is not None and obj_ns != ns):
                continue
            try:
                if params.get("labelSelector") and not labels_match(
                    obj["metadata"].get("labels") or {}, params["labelSelector"]
                ):
                    continue
                if params.get("fieldSelector") and not field_matches(
                    obj, params["fieldSelector"], res.plural
                ):
                    continue
            except SelectorError as exc:
                raise ApiError(400, "BadRequest", str(exc)) from exc
            item = copy.deepcopy(self._refreshed(res, obj))
            item.pop("kind", None)
            item.pop("apiVersion", None)
            items.append(item)
        return {
            "kind": f"{res.kind}List",
            "apiVersion": res.api_version,
            "metadata": {"resourceVersion": str(self._rv)},
            "items": items,
        }

    def _admit_pod(self, ns: str | None, name: str, spec: dict[str, Any]) -> None:
        """Pod Security admission: the namespace's ``enforce`` level refuses the pod with 403."""
        level = podsecurity.level_of(self.objects.get(("namespaces", None, ns or "")))
        found = podsecurity.violations(level, spec)
        if found:
            message = podsecurity.forbidden_message(name, level, found)
            raise ApiError(403, "Forbidden", message, {"name": name, "kind": "pods"})

    def _create(self, res: Resource, ns: str | None, body: Any, *, dry_run: bool = False) -> dict[str, Any]:
        meta = (body.get("metadata") or {}) if isinstance(body, dict) else {}
        name = meta.get("name")
        if not name and meta.get("generateName"):
            name = body["metadata"]["name"] = f"{meta['generateName']}{uuid.uuid4().hex[:5]}"
        if not name:
            raise ApiError.invalid(
                res, "", "metadata.name", "Required value: name or generateName is required"
            )
        if res.namespaced:
            body["metadata"]["namespace"] = ns
        if res.plural == "pods":
            self._admit_pod(ns, name, body.get("spec") or {})
        if self._key(res, ns, name) in self.objects and not dry_run:
            raise ApiError(
                409,
                "AlreadyExists",
                f'{res.plural} "{name}" already exists',
                {"name": name, "kind": res.plural},
            )
        self._validate(res, body)
        if dry_run:  # admitted and validated, not stored (``?dryRun=All``)
            return copy.deepcopy(body)
        created = copy.deepcopy(self.add(res.plural, body))
        if res.plural == "pods" and not (body.get("spec") or {}).get("nodeName"):
            self._later(0, self._kube_schedule)
            self._later(self.replace_delay, self._karpenter_provision)
        if res.plural == "jobs":
            self._later(0, lambda: self._run_job(ns, name))
        return created

    def _patch(self, res: Resource, current: dict[str, Any], request: kmock.Request) -> dict[str, Any]:
        content_type = (_header(request, "Content-Type") or "").split(";")[0].strip()
        if content_type == patching.STRATEGIC_MERGE_PATCH and res.crd:
            raise ApiError.from_fixture("status-415-unsupported-media-type.json")
        body = _json(request)
        try:
            if content_type == patching.MERGE_PATCH:
                patched = patching.merge_patch(current, body)
            elif content_type == patching.STRATEGIC_MERGE_PATCH:
                patched = patching.strategic_merge_patch(current, body)
            elif content_type == patching.JSON_PATCH:
                patched = patching.json_patch(current, body)
            else:
                raise ApiError.from_fixture(
                    "status-415-unsupported-media-type.json",
                    message="the body of the request was in an unknown format - accepted media types include: "
                    "application/json-patch+json, application/merge-patch+json, "
                    "application/strategic-merge-patch+json (apply-patch+yaml is not emulated)",
                )
        except patching.PatchError as exc:
            raise ApiError(400, "BadRequest", str(exc)) from exc
        return self._update(res, current, patched)

    def _update(self, res: Resource, current: dict[str, Any], new: Any) -> dict[str, Any]:
        """Store ``new`` over ``current``: the RV precondition, validation, then a bumped RV."""
        if not isinstance(new, dict):
            raise ApiError(400, "BadRequest", "the body must be a JSON object")
        meta = current["metadata"]
        sent_rv = (new.get("metadata") or {}).get("resourceVersion")
        if sent_rv is not None and sent_rv != meta["resourceVersion"]:
            raise ApiError.conflict(res, meta["name"])
        new = copy.deepcopy(new)
        new["metadata"] = {**new.get("metadata", {}), "name": meta["name"], "uid": meta["uid"]}
        if res.namespaced:
            new["metadata"]["namespace"] = meta["namespace"]
        new.setdefault("kind", res.kind)
        new.setdefault("apiVersion", res.api_version)
        self._validate(res, new)
        if res.generation and new.get("spec") != current.get("spec"):
            new["metadata"]["generation"] = meta.get("generation", 1) + 1
        new["metadata"]["resourceVersion"] = self._bump()
        key = self._key(res, meta.get("namespace"), meta["name"])
        if new["metadata"].get("deletionTimestamp") and not new["metadata"].get("finalizers"):
            self.objects.pop(key, None)
        else:
            self.objects[key] = new
        cordoned = (new.get("spec") or {}).get("unschedulable") and not (current.get("spec") or {}).get(
            "unschedulable"
        )
        if res.plural == "nodes" and cordoned and self.slinky_drain_delay is not None:
            self._slinky_operator_sees_cordon(new)
        uncordoned = (current.get("spec") or {}).get("unschedulable") and not (new.get("spec") or {}).get(
            "unschedulable"
        )
        if res.plural == "nodes" and uncordoned and self.slinky_drain_delay is not None:
            name = new["metadata"]["name"]
            self._later(self.slinky_drain_delay, lambda: self._slinky_undrain(name))
        if res.group == capi.GROUP:  # a Cluster or Machine unpaused
            self._capi_resume()
        return copy.deepcopy(new)

    def _delete(
        self, res: Resource, current: dict[str, Any], grace: int | None
    ) -> tuple[dict[str, Any], int]:
        meta = current["metadata"]
        key = self._key(res, meta.get("namespace"), meta["name"])
        if res.plural == "pods":
            if grace is None:
                grace = int((current.get("spec") or {}).get("terminationGracePeriodSeconds", 30))
            return self._delete_pod(key, grace), 200
        if meta.get("finalizers"):
            if not meta.get("deletionTimestamp"):
                meta.update(deletionTimestamp=now_iso(), deletionGracePeriodSeconds=0)
                if res.generation:
                    meta["generation"] = meta.get("generation", 1) + 1
                meta["resourceVersion"] = self._bump()
                self._on_deleting(res, current)
            return copy.deepcopy(current), 200
        del self.objects[key]
        if res.crd:
            return copy.deepcopy(current), 200
        details = {"name": meta["name"], "kind": res.plural, "uid": meta["uid"]}
        return {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Success",
            "details": details,
        }, 200

    def _delete_pod(self, key: Key, grace: int) -> dict[str, Any]:
        """Graceful delete: ``deletionTimestamp`` = now + grace; 0 (force) removes it unless finalizers hold it."""
        pod = self.objects[key]
        meta = pod["metadata"]
        node_name = (pod.get("spec") or {}).get("nodeName")
        if node_name in self._karpenter_launched:
            delay = self.karpenter_consolidate_after + (self.pod_termination_delay or 0) * (grace > 0)
            self._later(delay, lambda: self._karpenter_consolidate(str(node_name)))
        if grace == 0 and not meta.get("finalizers"):
            del self.objects[key]
            self._nodeset_recreates(pod)
            return copy.deepcopy(pod)
        if not meta.get("deletionTimestamp"):
            self._slinky_prestop(pod, grace)
        if not meta.get("deletionTimestamp") or grace < meta.get("deletionGracePeriodSeconds", grace + 1):
            meta.update(deletionTimestamp=now_iso(grace), deletionGracePeriodSeconds=grace)
            meta["resourceVersion"] = self._bump()
        if self.pod_termination_delay is not None:
            self._later(self.pod_termination_delay, lambda: self._kubelet_remove(key))
        return copy.deepcopy(pod)

    def _slinky_prestop(self, pod: dict[str, Any], grace: int) -> None:
        """A NodeSet pod starts terminating on a live kubelet: its slurmd container's preStop hook
        sets the pod's Slurm node DOWN with ``slinky.TERMINATING``, whatever reason it had (the
        operator's drain included). The kubelet runs a preStop hook only with a grace period left
        (``killContainer``: ``PreStop != nil && gracePeriod > 0``): a force delete runs none, and a
        dead kubelet runs nothing. ``slinky_prestops`` lists the Slurm nodes, in order."""
        hostname = (pod["metadata"].get("labels") or {}).get("nodeset.slinky.slurm.net/pod-hostname")
        if slinky.scaling_mode(pod) is None or not hostname or grace <= 0 or not self._kubelet_alive(pod):
            return
        self.slinky_prestops.append(hostname)
        self._later(0, lambda: self.slinky_slurm.down(hostname, slinky.TERMINATING))

    async def _kubelet_remove(self, key: Key) -> None:
        if key in self.objects:
            self._kubelet_remove_now(key)

    def finish_terminating(self) -> None:
        """Remove every terminating pod whose finalizers are gone (the kubelet when the delay is None)."""
        for key in [k for k in self.objects if k[0] == "pods"]:
            self._kubelet_remove_now(key)

    def _kubelet_remove_now(self, key: Key) -> None:
        pod = self.objects[key]
        meta = pod["metadata"]
        if meta.get("deletionTimestamp") and not meta.get("finalizers") and self._kubelet_alive(pod):
            del self.objects[key]
            self._nodeset_recreates(pod)

    def _nodeset_recreates(self, gone: dict[str, Any]) -> None:
        """slurm-operator's NodeSet controller in StatefulSet scaling mode (the CRD's default,
        ``api/v1beta1/nodeset_types.go``; the pod says its mode in ``slinky.NODESET_SCALING_MODE``):
        a pod of its replicas that is gone is made again under the same name (the ordinal, which is
        also the Slurm node's name), unbound, for kube-scheduler to place anywhere its template
        allows (``NewNodeSetStatefulSetPod`` clears ``nodeName``; "may be rescheduled freely",
        ``docs/usage/nodeset-operations.md``). Pending, it is demand Karpenter launches a node for
        (``IsProvisionable`` skips DaemonSet-owned pods only). DaemonSet-mode pods are made per
        node, pinned to it, and never so. A terminating pod still counts as its replica: the new
        one comes on a sync after the old one is removed, ``nodeset_recreate_delay`` later."""
        if slinky.daemonset_mode(gone) and (on := gone["spec"].get("nodeName")):
            self._nodeset_gone.setdefault(on, []).append(gone)
        again = slinky.recreated(gone)
        if again is None:
            return

        async def recreate() -> None:
            key = self._key(
                resources.BY_PLURAL["pods"], again["metadata"]["namespace"], again["metadata"]["name"]
            )
            if key not in self.objects:
                self.add("pods", again)
                await self._kube_schedule()
                self._later(self.replace_delay, self._karpenter_provision)

        self._later(self.nodeset_recreate_delay, recreate)

    # --- eviction and PDBs -----------------------------------------------------------------------------

    def _evict(self, ns: str | None, name: str, request: kmock.Request) -> tuple[dict[str, Any], int]:
        body = _json(request)
        if not isinstance(body, dict) or (body.get("metadata") or {}).get("name") != name:
            raise ApiError(400, "BadRequest", "name in URL does not match name in Eviction object")
        pods = resources.BY_PLURAL["pods"]
        self._validate(pods, {**body, "kind": "Eviction"}, model="V1Eviction")
        pod = self.objects.get(self._key(pods, ns, name))
        if pod is None:
            raise ApiError.not_found(pods, name)
        options = body.get("deleteOptions") or {}
        grace = options.get("gracePeriodSeconds")
        if grace is None:
            grace = int(pod["spec"].get("terminationGracePeriodSeconds", 30))
        return self._eviction(ns, name, pod, grace)

    def _eviction(
        self, ns: str | None, name: str, pod: dict[str, Any], grace: int
    ) -> tuple[dict[str, Any], int]:
        """The eviction subresource's decision on ``pod``: evicted (201), or refused by its budget."""
        pods = resources.BY_PLURAL["pods"]
        success = {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 201}
        phase = (pod.get("status") or {}).get("phase")
        if phase in ("Succeeded", "Failed", "Pending") or pod["metadata"].get("deletionTimestamp"):
            self._delete_pod(self._key(pods, ns, name), grace)
            return success, 201
        budgets = [
            pdb
            for (plural, pdb_ns, _), pdb in self.objects.items()
            if plural == "poddisruptionbudgets"
            and pdb_ns == ns
            and resources.pdb_selects(pdb, pod["metadata"].get("labels") or {})
        ]
        if len(budgets) > 1:
            # Not an error: eviction.go returns this Status with a nil error, and handlers/create.go
            # writes it with the create's own 201 (it fills ``code`` only when it is 0, and this one is
            # 500). client-go's ``Result.Into`` makes any non-Success Status an error; a client that
            # looks only at the status line takes the pod for evicted.
            message = "This pod has more than one PodDisruptionBudget, which the eviction subresource does not support."
            return resources.status_body(500, "", message), 201
        if budgets:
            pdb = self._refreshed(resources.BY_PLURAL["poddisruptionbudgets"], budgets[0])
            pdb_status, pdb_name = pdb["status"], pdb["metadata"]["name"]
            if not resources.ready(pod) and (
                (pdb.get("spec") or {}).get("unhealthyPodEvictionPolicy") == "AlwaysAllow"
                or 0 < pdb_status["desiredHealthy"] <= pdb_status["currentHealthy"]
            ):
                # An unready pod counts for nothing in the budget: the API server evicts it without
                # taking a disruption (pkg/registry/core/pod/storage/eviction.go), and decides so
                # before ``checkAndDecrement``, whose first test is a stale status: a stale budget
                # holds only the pods that count.
                self._delete_pod(self._key(pods, ns, name), grace)
                return success, 201
            if pdb_status.get("observedGeneration", 0) < pdb["metadata"].get("generation", 1):
                raise ApiError.from_fixture(
                    "status-429-eviction-pdb-retryafter.json",
                    cause=f"The disruption budget {pdb_name} is still being processed by the server.",
                )
            if pdb_status["disruptionsAllowed"] <= 0:
                raise ApiError.from_fixture(
                    "status-429-eviction-pdb.json",
                    cause=f"The disruption budget {pdb_name} needs {pdb_status['desiredHealthy']} healthy pods "
                    f"and has {pdb_status['currentHealthy']} currently",
                )
            budgets[0].setdefault("status", {}).setdefault("disruptedPods", {})[name] = now_iso()
            budgets[0]["metadata"]["resourceVersion"] = self._bump()
        self._delete_pod(self._key(pods, ns, name), grace)
        return success, 201

    def _refreshed(self, res: Resource, obj: dict[str, Any]) -> dict[str, Any]:
        """PDB status as the disruption controller would compute it now; other objects unchanged."""
        if res.plural != "poddisruptionbudgets":
            return obj
        ns = obj["metadata"]["namespace"]
        pods = [p for (pl, pns, _), p in self.objects.items() if pl == "pods" and pns == ns]
        obj["status"] = resources.pdb_status(obj, pods)
        return obj

    # --- controllers: CAPI MachineSet and Karpenter --------------------------------------------------

    def _on_deleting(self, res: Resource, obj: dict[str, Any]) -> None:
        if res.plural == "machines" and self._capi_paused(obj):
            # The Machine controller returns before its deletion while paused: the Machine keeps its
            # finalizer (and the Node), and the MachineSet, which counts deleting Machines, makes
            # no other. ``_capi_resume`` goes on once nothing pauses it.
            self._capi_held.add(self._key(res, obj["metadata"].get("namespace"), obj["metadata"]["name"]))
            return
        if res.plural == "nodeclaims":
            if karpenter.annotate_termination_time(obj):
                obj["metadata"]["resourceVersion"] = self._bump()
            snapshot = copy.deepcopy(obj)
            self._later(self.replace_delay, lambda: self._karpenter_terminate(res, snapshot))
        elif res.plural == "machines":
            snapshot = copy.deepcopy(obj)
            self._later(self.replace_delay, lambda: self._capi_delete(res, snapshot))

    def _capi_paused(self, machine: dict[str, Any]) -> str | None:
        """Why Cluster API leaves ``machine`` alone: its Cluster (``spec.clusterName``, in its
        namespace) paused, or its own paused annotation (``capi.paused``)."""
        meta = machine["metadata"]
        name = (machine.get("spec") or {}).get("clusterName") or (meta.get("labels") or {}).get(
            capi.CLUSTER_NAME_LABEL
        )
        cluster = self.objects.get(("clusters", meta.get("namespace"), name)) if name else None
        return capi.paused(cluster, machine)

    def _capi_resume(self) -> None:
        """Deleted Machines held while paused whose Cluster and selves are no longer paused: the
        Machine controller deletes them now, and the MachineSet replaces them."""
        for key in sorted(self._capi_held):
            machine = self.objects.get(key)
            if machine is None or not machine["metadata"].get("deletionTimestamp"):
                self._capi_held.discard(key)
            elif not self._capi_paused(machine):
                self._capi_held.discard(key)
                self._on_deleting(resources.BY_PLURAL["machines"], machine)

    async def _capi_delete(self, res: Resource, old: dict[str, Any]) -> None:
        """The Machine controller's ``reconcileDelete`` of deleted Machine ``old``: while a hook or
        its drain (``_capi_held_by``) holds it, it stays, with its Node and instance, saying why in
        its conditions, looked at again every ``capi_drain_retry`` seconds (Cluster API: 20 s); and
        its MachineSet, which counts a deleting Machine toward its replicas, makes no new one. Then
        the Node and Machine go and the MachineSet makes the new one (``_replace``)."""
        key = self._key(res, old["metadata"].get("namespace"), old["metadata"]["name"])
        machine = self.objects.get(key)
        if machine is None or not machine["metadata"].get("deletionTimestamp"):
            return
        node_name = str(((machine.get("status") or {}).get("nodeRef") or {}).get("name") or "")
        node = (self.workload or self).objects.get(("nodes", None, node_name)) if node_name else None
        if self._capi_held_by(machine, node):
            self._later(self.capi_drain_retry, lambda: self._capi_delete(res, old))
            return
        await self._replace(res, old)

    @property
    def _capi_recorded(self) -> bool:
        """Whether ``capi_release`` writes the v1beta2 ``Deleting`` condition and
        ``status.deletion`` (v1.9+, ``capi.V1BETA2_CONDITIONS``), or v1beta1 conditions only."""
        return self.capi_release >= capi.V1BETA2_CONDITIONS

    def _capi_held_by(self, machine: dict[str, Any], node: dict[str, Any] | None) -> bool:
        """One ``reconcileDelete`` pass up to the infrastructure's delete: whether a pre-drain hook,
        the drain, the volumes or a pre-terminate hook holds the Machine, said as ``capi_release``
        says it. From v1.9: its v1beta1 conditions and its v1beta2 ``Deleting`` (reason and message
        as v1.9+ word them). Before v1.9 (``release-1.8`` machine_controller.go ``reconcileDelete``,
        lines 365-449): v1beta1 conditions only, ``PreDrainDeleteHookSucceeded`` /
        ``PreTerminateDeleteHookSucceeded`` False ``WaitingExternalHook`` with no message,
        ``DrainingSucceeded`` False ``Draining`` "Draining the node before deletion" set once and left
        so while the drain fails (``drainNode`` logs "Drain failed, retry in 20s" and requeues, no
        error), ``VolumeDetachSucceeded`` False ``WaitingForVolumeDetach`` "Waiting for node volumes
        to be detached" while the Node's ``status.volumesAttached`` is not empty
        (``shouldWaitForNodeVolumes``); the timeouts counted from those conditions'
        ``lastTransitionTime``. No node (no ``nodeRef``, or gone): no drain."""
        annotations = machine["metadata"].get("annotations") or {}
        recorded = self._capi_recorded
        changed = False

        def hooked(prefix: str, condition: str, reason: str, which: str) -> bool:
            """Delete hooks of ``prefix`` still on the Machine: the wait for them said in its
            conditions (v1beta1 ``condition``, and the ``Deleting`` ``reason`` where recorded)."""
            nonlocal changed
            hooks = sorted(k for k in annotations if k.startswith(prefix))
            if not hooks:
                return False
            changed |= capi.set_v1beta1(machine, condition, "False", "WaitingExternalHook")
            if recorded:
                message = f"Waiting for {which} hooks to succeed (hooks: {','.join(hooks)})"
                changed |= capi.set_deleting(machine, reason, message)
            return True

        try:
            if node is not None:
                if hooked(
                    capi.PRE_DRAIN_HOOK, "PreDrainDeleteHookSucceeded", "WaitingForPreDrainHook", "pre-drain"
                ):
                    return True
                changed |= capi.set_v1beta1(machine, "PreDrainDeleteHookSucceeded", "True")
                if capi.EXCLUDE_DRAIN not in annotations and not self._capi_timed_out(
                    machine, "nodeDrainTimeout", "nodeDrainStartTime", "DrainingSucceeded"
                ):
                    started, began = capi.wait_began(
                        machine,
                        "nodeDrainStartTime",
                        "DrainingSucceeded",
                        "Draining",
                        "Draining the node before deletion",
                        now_iso(),
                        recorded=recorded,
                    )
                    changed |= began
                    drained = self._capi_drain(node, started, labels=recorded)
                    if drained is not None:
                        if recorded:
                            said = drained
                            changed |= capi.set_v1beta1(
                                machine, "DrainingSucceeded", "False", "Draining", said
                            )
                            changed |= capi.set_deleting(machine, "DrainingNode", said)
                        return True
                    changed |= capi.set_v1beta1(machine, "DrainingSucceeded", "True")
                if capi.EXCLUDE_VOLUME_WAIT not in annotations and not self._capi_timed_out(
                    machine,
                    "nodeVolumeDetachTimeout",
                    "waitForNodeVolumeDetachStartTime",
                    "VolumeDetachSucceeded",
                ):
                    started, began = capi.wait_began(
                        machine,
                        "waitForNodeVolumeDetachStartTime",
                        "VolumeDetachSucceeded",
                        "WaitingForVolumeDetach",
                        "Waiting for node volumes to be detached",
                        now_iso(),
                        recorded=recorded,
                    )
                    changed |= began
                    if recorded:
                        attached = self._capi_volumes(node, started)
                        if attached is not None:
                            changed |= capi.set_deleting(machine, "WaitingForVolumeDetach", attached)
                            return True
                    elif not capi.unreachable(node) and (node.get("status") or {}).get("volumesAttached"):
                        return True
                    changed |= capi.set_v1beta1(machine, "VolumeDetachSucceeded", "True")
            return hooked(
                capi.PRE_TERMINATE_HOOK,
                "PreTerminateDeleteHookSucceeded",
                "WaitingForPreTerminateHook",
                "pre-terminate",
            )
        finally:
            if changed:
                self.bump(machine)

    def _capi_timed_out(self, machine: dict[str, Any], field: str, began_at: str, condition: str) -> bool:
        """``nodeDrainTimeoutExceeded`` / ``nodeVolumeDetachTimeoutExceeded``: the Machine's ``field``
        set and passed since the wait began (``capi.began_at``: ``status.deletion.<began_at>``, or
        before v1.9 the v1beta1 ``condition``'s ``lastTransitionTime``)."""
        timeout = capi.deletion_timeout(machine, field)
        began = capi.began_at(machine, began_at, condition, recorded=self._capi_recorded)
        if timeout is None or not began:
            return False
        started = datetime.strptime(began, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC)
        return (datetime.now(UTC) - started).total_seconds() >= timeout

    def _capi_volumes(self, node: dict[str, Any], started: str) -> str | None:
        """``shouldWaitForNodeVolumes`` (v1.9+, its VolumeAttachments gate on by default): the
        condition message while a VolumeAttachment to the Node has ``status.attached`` true, naming
        its PersistentVolume's claim (or the volume); None when none is (or the Node is unreachable:
        it does not wait then). ``status.volumesAttached`` and the claims of pods the drain skipped
        are not modelled."""
        cluster = self.workload or self
        if capi.unreachable(node):
            return None
        name = node["metadata"]["name"]
        volumes = sorted(
            {
                str(((va.get("spec") or {}).get("source") or {}).get("persistentVolumeName"))
                for (kind, _, _), va in cluster.objects.items()
                if kind == "volumeattachments"
                and (va.get("spec") or {}).get("nodeName") == name
                and (va.get("status") or {}).get("attached") is True
            }
        )
        if not volumes:
            return None
        claims, unclaimed, missing = [], [], []
        for volume in volumes:
            pv = cluster.objects.get(("persistentvolumes", None, volume))
            ref = ((pv or {}).get("spec") or {}).get("claimRef") or {}
            if pv is None:
                missing.append(volume)
            elif ref.get("kind") != "PersistentVolumeClaim":
                unclaimed.append(volume)
            else:
                claims.append(f"{ref.get('namespace')}/{ref.get('name')}")
        return capi.volume_message(started, claims, unclaimed, missing)

    def _capi_drain(self, node: dict[str, Any], started: str, *, labels: bool = True) -> str | None:
        """One pass of the Machine controller's ``drainNode`` (``drain/drain.go``, v1.9+): cordon the
        Node; of the pods on it, skip DaemonSet pods (not finished), mirror pods, pods labelled
        ``cluster.x-k8s.io/drain: skip`` and, on an unreachable node (Ready Unknown), pods deleted
        over a second ago; wait for ``wait-completed`` ones; evict the rest through the Eviction API
        (PDBs honoured). The condition message while any is left (``ConditionMessage``), else None.
        Before v1.9 (not ``labels``) the kubectl drain library (``kubedrain.RunNodeDrain``) drains,
        with no ``cluster.x-k8s.io/drain`` label (MachineDrainRules came with v1.9): only whether
        any is left counts, its message never said."""
        cluster = self.workload or self
        name, now = node["metadata"]["name"], datetime.now(UTC)
        if not node.setdefault("spec", {}).get("unschedulable"):
            node["spec"]["unschedulable"] = True
            cluster.bump(node)
        unreachable = capi.unreachable(node)
        deleting: list[str] = []
        failed: dict[str, list[str]] = {}
        waiting: list[str] = []
        pods = sorted(
            (key, pod)
            for key, pod in list(cluster.objects.items())
            if key[0] == "pods" and (pod.get("spec") or {}).get("nodeName") == name
        )
        for key, pod in pods:
            meta, ref = pod["metadata"], f"{key[1]}/{key[2]}"
            finished = (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed")
            gone_at = meta.get("deletionTimestamp")
            if (
                unreachable
                and gone_at
                and (
                    now - datetime.strptime(gone_at, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC)
                ).total_seconds()
                > 1
            ):
                continue
            daemon = any(
                o.get("kind") == "DaemonSet" and o.get("controller")
                for o in meta.get("ownerReferences") or []
            )
            label = str((meta.get("labels") or {}).get(capi.DRAIN_LABEL, "")).lower() if labels else ""
            if (
                (daemon and not finished)
                or karpenter.MIRROR in (meta.get("annotations") or {})
                or label == "skip"
            ):
                continue
            if label == "wait-completed":
                if not finished:
                    waiting.append(ref)
                continue
            if gone_at:
                if not self._terminated(cluster, key, now):
                    deleting.append(ref)
                continue
            grace = 1 if unreachable else int(pod["spec"].get("terminationGracePeriodSeconds", 30))
            try:
                answer, _ = cluster._eviction(key[1], key[2], pod, grace)
            except ApiError as exc:
                failed.setdefault(capi.eviction_error(exc.body), []).append(ref)
                continue
            if answer.get("code") == 500:  # more than one budget: a Status client-go makes an error
                failed.setdefault(capi.eviction_error(answer), []).append(ref)
                continue
            if key in cluster.objects:
                deleting.append(ref)
        if not (deleting or failed or waiting):
            return None
        return capi.drain_message(started, deleting, failed, waiting)

    @staticmethod
    def _terminated(cluster: KubeEmulator, key: Key, now: datetime) -> bool:
        """Whether a deleting pod is gone by now, time having passed that the stand-ins do not run on
        their own: past its ``deletionTimestamp`` on a live kubelet its containers are killed, and a
        Job's pod, then terminal, loses its ``batch.kubernetes.io/job-tracking`` finalizer (the Job
        controller's ``trackJobStatusAndRemoveFinalizers``); with no finalizer left it is removed."""
        pod = cluster.objects[key]
        meta = pod["metadata"]
        due = datetime.strptime(meta["deletionTimestamp"], "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC)
        if now < due or not cluster._kubelet_alive(pod):
            return False
        if any(o.get("kind") == "Job" for o in meta.get("ownerReferences") or []):
            meta["finalizers"] = [f for f in meta.get("finalizers") or [] if f != JOB_TRACKING]
        cluster._kubelet_remove_now(key)
        return key not in cluster.objects

    async def _karpenter_terminate(self, res: Resource, old: dict[str, Any]) -> None:
        """Karpenter's termination controller on the Node of deleted NodeClaim ``old``: taint it
        ``karpenter.sh/disrupted``, mark it deleting, drain it; while a pod waits, say so on the
        Node and look again; once none is left, the Node and NodeClaim go (``_replace``)."""
        claim = self.objects.get(self._key(res, None, old["metadata"]["name"]))
        node_name = (old.get("status") or {}).get("nodeName")
        node = self.objects.get(("nodes", None, node_name)) if node_name else None
        if claim is not None and node is not None:
            spec, meta = node.setdefault("spec", {}), node["metadata"]
            if not any(t.get("key") == karpenter.DISRUPTED for t in spec.get("taints") or []):
                spec.setdefault("taints", []).append({"key": karpenter.DISRUPTED, "effect": "NoSchedule"})
                meta.setdefault("deletionTimestamp", now_iso())
                meta["finalizers"] = [*(meta.get("finalizers") or []), karpenter.FINALIZER]
                self.bump(node)
            deadline = karpenter.termination_time(claim)
            if self._karpenter_drain(node, deadline) or self._karpenter_volumes(claim, node, deadline):
                self._later(self.karpenter_drain_retry, lambda: self._karpenter_terminate(res, old))
                return
        await self._replace(res, old)

    def _karpenter_drain(self, node: dict[str, Any], deadline: datetime | None) -> int:
        """One pass of ``terminator.Drain``: the pods waiting eviction, said on the Node as waiting
        (``awaitDrain``'s ``FailedDraining``, before any eviction's answer: the queue evicts after
        the pass), then each evicted, leaving those whose ``do-not-disrupt`` is active and those a
        PDB protects (said on the Node, unless the recorder's dedupe drops it); past ``deadline``
        (the NodeClaim's termination time) delete them whatever protects them. How many still wait."""
        name, now = node["metadata"]["name"], datetime.now(UTC)
        forced = deadline is not None and now >= deadline
        pods = [
            (key, pod)
            for key, pod in list(self.objects.items())
            if key[0] == "pods"
            and (pod.get("spec") or {}).get("nodeName") == name
            and karpenter.waiting_eviction(pod)
        ]
        # On a dead kubelet a deleting pod never goes: Karpenter gives up too (IsStuckTerminating).
        waiting = sum(
            1 for _, p in pods if not p["metadata"].get("deletionTimestamp") or self._kubelet_alive(p)
        )
        if waiting:
            self._karpenter_event(node, f"Failed to drain node, {waiting} pods are waiting to be evicted")
        for key, pod in pods:
            if pod["metadata"].get("deletionTimestamp"):
                continue
            if forced:
                self._delete_pod(key, 1)
            elif not karpenter.do_not_disrupt(pod, now):
                try:
                    answer, _ = self._eviction(
                        key[1], key[2], pod, int(pod["spec"].get("terminationGracePeriodSeconds", 30))
                    )
                except ApiError as exc:
                    if exc.code != 429:
                        raise
                    answer = {"code": 429}
                if answer.get("code") in (429, 500):
                    why = (
                        "evicting pod violates a PDB"
                        if answer["code"] == 429
                        else "eviction does not support multiple PDBs"
                    )
                    self._karpenter_event(node, f"Failed to drain node, {why} (Pod={key[1]}/{key[2]})")
        return waiting

    def _karpenter_volumes(
        self, claim: dict[str, Any], node: dict[str, Any], deadline: datetime | None
    ) -> bool:
        """``awaitVolumeDetachment``: whether it still waits for the node's VolumeAttachments of a
        PersistentVolume to go, said on the NodeClaim (``VolumesDetached``); past ``deadline`` no more."""
        name = node["metadata"]["name"]
        pending = [
            va
            for (kind, _, _), va in self.objects.items()
            if kind == "volumeattachments"
            and (va.get("spec") or {}).get("nodeName") == name
            and ((va.get("spec") or {}).get("source") or {}).get("persistentVolumeName")
        ]
        if not pending:
            status, reason = "True", karpenter.VOLUMES_DETACHED
        elif deadline is not None and datetime.now(UTC) >= deadline:
            status, reason = "False", "TerminationGracePeriodElapsed"
        else:
            status, reason = "Unknown", "AwaitingVolumeDetachment"
        if karpenter.set_condition(claim, karpenter.VOLUMES_DETACHED, status, reason):
            self.bump(claim)
        return status == "Unknown"

    def _karpenter_event(self, node: dict[str, Any], message: str) -> None:
        """Karpenter's ``FailedDraining`` on ``node``, through its recorder's dedupe: one per node
        every ``karpenter_dedupe`` seconds, whatever the message (``pkg/events/recorder.go``)."""
        name, now = node["metadata"]["name"], datetime.now(UTC)
        said = self._karpenter_said.get(name)
        if said is not None and (now - said).total_seconds() < self.karpenter_dedupe:
            return
        self._karpenter_said[name] = now
        self._warn(node, "Node", "v1", "FailedDraining", message, "karpenter")

    async def _replace(self, res: Resource, old: dict[str, Any]) -> None:
        """Delete the old Node, release the old handle, create a new handle and a NotReady Node, then Ready."""
        status = old.get("status") or {}
        old_node_name = (status.get("nodeRef") or {}).get("name") or status.get("nodeName")
        nodes = (self.workload or self).objects
        template = nodes.pop(("nodes", None, old_node_name), None) if old_node_name else None
        key = self._key(res, old["metadata"].get("namespace"), old["metadata"]["name"])
        self.objects.pop(key, None)
        if res.plural == "nodeclaims" and not self.karpenter_replaces_deleted_claims:
            pool = (old["metadata"].get("labels") or {}).get("karpenter.sh/nodepool")
            if pool and template is not None:
                self._karpenter_pools[pool] = {"claim": old, "node": template}
            await self._karpenter_provision()
            return
        await self._new_handle_and_node(res, old, old_node_name, template)

    def _pending_in_pools(self) -> list[dict[str, Any]]:
        """Pods not bound, not terminating, that select a NodePool (``karpenter.sh/nodepool``)."""
        return [
            pod
            for key, pod in self.objects.items()
            if key[0] == "pods"
            and not (pod.get("spec") or {}).get("nodeName")
            and not pod["metadata"].get("deletionTimestamp")
            and "karpenter.sh/nodepool" in ((pod.get("spec") or {}).get("nodeSelector") or {})
        ]

    async def _kube_schedule(self) -> None:
        """kube-scheduler, for pods that select a NodePool: each binds at once to an existing node
        its default filters pass (``resources.unfit``), the first by name. Karpenter provisions only
        for pods the scheduler could place nowhere (marked Unschedulable), so a pod that fits an
        existing node is no demand for a new one, whatever it was made for."""
        nodes = sorted(
            (n for (plural, _, _), n in self.objects.items() if plural == "nodes"),
            key=lambda n: str(n["metadata"]["name"]),
        )
        for pod in self._pending_in_pools():
            why: Counter[str] = Counter()
            for node in nodes:
                name = node["metadata"]["name"]
                there = [
                    p
                    for (plural, _, _), p in self.objects.items()
                    if plural == "pods" and (p.get("spec") or {}).get("nodeName") == name
                ]
                unfit = resources.unfit(pod, node, there)
                if unfit is None:
                    pod["spec"]["nodeName"] = name
                    pod.setdefault("status", {})["phase"] = "Running"
                    self.bump(pod)
                    self._slinky_bound(pod, name)
                    break
                why[unfit] += 1
            else:  # as kube-scheduler says it on the pod it marks Unschedulable (Karpenter's cue)
                said = ", ".join(f"{count} {reason}" for reason, count in sorted(why.items()))
                message = (
                    f"0/{len(nodes)} nodes are available: {said}."
                    if said
                    else "no nodes available to schedule pods"
                )
                self._warn(pod, "Pod", "v1", "FailedScheduling", message, "default-scheduler")

    async def _karpenter_provision(self) -> None:
        """Karpenter's provisioner: one new NodeClaim and Node per pending pod that selects a known
        NodePool (``nodeSelector`` ``karpenter.sh/nodepool``) and that the scheduler placed on no
        existing node (``_kube_schedule``, run first); once Ready the scheduler binds the pod."""
        await self._kube_schedule()
        for key, pod in list(self.objects.items()):
            spec = pod.get("spec") or {}
            pool = (spec.get("nodeSelector") or {}).get("karpenter.sh/nodepool")
            if key[0] != "pods" or spec.get("nodeName") or pod["metadata"].get("deletionTimestamp"):
                continue
            known = self._karpenter_pool(pool)
            if known is None or pod["metadata"].get("annotations", {}).get("emulator/nominated"):
                continue
            if self.karpenter_cannot_launch is not None:
                failed = f"Failed to schedule pod, {self.karpenter_cannot_launch}"
                self._warn(pod, "Pod", "v1", "FailedScheduling", failed, "karpenter")
                if not self._karpenter_retrying:
                    self._karpenter_retrying = True
                    self._later(self.karpenter_retry_after, self._karpenter_retry)
                continue
            pod["metadata"].setdefault("annotations", {})["emulator/nominated"] = "true"
            name = await self._new_handle_and_node(
                resources.BY_PLURAL["nodeclaims"],
                known["claim"],
                known["node"]["metadata"]["name"],
                known["node"],
            )
            if name is not None:
                self._karpenter_launched.add(name)
            stored = self.objects.get(key)
            if name is not None and stored is not None and not stored["metadata"].get("deletionTimestamp"):
                stored["spec"]["nodeName"] = name
                stored.setdefault("status", {})["phase"] = "Running"
                self.bump(stored)
                self._slinky_bound(stored, name)

    def _karpenter_pool(self, pool: str | None) -> dict[str, Any] | None:
        """A NodePool Karpenter launches for (its NodeClaim and Node templates): one a NodeClaim was
        deleted from, or one whose NodeClaim and Node stand (Karpenter knows its NodePools before
        anything is deleted, so a pod pending for one is launched for at once)."""
        if pool is None or pool in self._karpenter_pools:
            return self._karpenter_pools.get(pool) if pool is not None else None
        for key in sorted(k for k in self.objects if k[0] == "nodeclaims"):
            claim = self.objects[key]
            node = self.objects.get(("nodes", None, str((claim.get("status") or {}).get("nodeName"))))
            if (
                node is not None
                and (claim["metadata"].get("labels") or {}).get("karpenter.sh/nodepool") == pool
            ):
                known = {"claim": copy.deepcopy(claim), "node": copy.deepcopy(node)}
                self._karpenter_pools[pool] = known
                return known
        return None

    async def _karpenter_retry(self) -> None:
        self._karpenter_retrying = False
        await self._karpenter_provision()

    async def _karpenter_consolidate(self, node_name: str) -> None:
        """Consolidation's empty-node delete: no pod but DaemonSet pods left, nothing opting out."""
        node = self.objects.get(("nodes", None, node_name))
        if node is None:
            return
        busy = [
            pod
            for (plural, _, _), pod in self.objects.items()
            if plural == "pods"
            and (pod.get("spec") or {}).get("nodeName") == node_name
            and not any(o.get("kind") == "DaemonSet" for o in pod["metadata"].get("ownerReferences") or [])
        ]
        claims = [
            (key, claim)
            for key, claim in self.objects.items()
            if key[0] == "nodeclaims" and (claim.get("status") or {}).get("nodeName") == node_name
        ]
        opted_out = [
            obj
            for obj in [node, *(c for _, c in claims)]
            if (obj["metadata"].get("annotations") or {}).get("karpenter.sh/do-not-disrupt") == "true"
        ]
        if busy or opted_out:
            return
        self.consolidated.append(node_name)
        for key, _ in claims:
            self.objects.pop(key, None)
        self.objects.pop(("nodes", None, node_name), None)

    async def _new_handle_and_node(
        self, res: Resource, old: dict[str, Any], old_node_name: str | None, template: dict[str, Any] | None
    ) -> str | None:
        """A new handle (Machine or NodeClaim) and its NotReady Node, Ready after ``ready_delay``."""
        suffix = uuid.uuid4().hex[:5]
        node_name = f"{old_node_name or 'node'}-{suffix}"
        node = resources.replacement_node(template, node_name, suffix)
        handle = resources.replacement_handle(old, node_name, suffix)
        annotations = node["metadata"].get("annotations") or {}
        if res.plural == "machines" and "cluster.x-k8s.io/machine" in annotations:
            annotations["cluster.x-k8s.io/machine"] = handle["metadata"]["name"]  # its own Machine
        cluster = self.workload or self
        cluster.add("nodes", node)
        self.add(res.plural, handle)
        if self.ready_delay is None:
            return None
        await asyncio.sleep(self.ready_delay)
        if ("nodes", None, node_name) in cluster.objects:
            cluster.set_node_condition(node_name, "Ready", "True")
            cluster._nodeset_daemon(node_name, old_node_name)
            return node_name
        return None

    async def _new_instance(self, old: dict[str, Any]) -> None:
        """The instance group's answer to a terminated instance: a new one registers, then turns Ready."""
        suffix = uuid.uuid4().hex[:5]
        name = f"{old['metadata']['name']}-{suffix}"
        self.add("nodes", resources.replacement_node(old, name, suffix))
        if self.ready_delay is None:
            return
        await asyncio.sleep(self.ready_delay)
        if ("nodes", None, name) in self.objects:
            self.set_node_condition(name, "Ready", "True")
            self._nodeset_daemon(name, old["metadata"]["name"])

    def _nodeset_daemon(self, node_name: str, replaced: str | None) -> None:
        """slurm-operator's NodeSet in DaemonSet scaling mode on a Ready replacement: each NodeSet that
        ran a pod on the node it replaces (same pool, so its selector matches) makes one on it
        (``syncNodeSetPods`` DaemonSet mode, ``NewNodeSetDaemonSetPod``), named after the new node
        unless the node carries a ``hostname-override``, which a replacement does not: its template
        (MachineTemplate, NodePool) has no per-node value (``resources.replacement_node``)."""
        node = self.objects.get(("nodes", None, node_name))
        if node is None or replaced is None:
            return
        pods = [
            obj
            for (plural, _, _), obj in self.objects.items()
            if plural == "pods" and slinky.daemonset_mode(obj) and obj["spec"].get("nodeName") == replaced
        ]
        made: set[str] = set()
        for template in [*pods, *self._nodeset_gone.pop(replaced, [])]:
            nodeset = next(
                o["name"] for o in template["metadata"]["ownerReferences"] if o.get("kind") == "NodeSet"
            )
            if nodeset not in made:
                made.add(nodeset)
                self.add("pods", slinky.daemonset_pod(template, node))

    # --- the Job controller and kubelet ---------------------------------------------------------------

    async def _run_job(self, ns: str | None, name: str) -> None:
        """The Job controller: one pod at a time on the template's ``nodeName`` until one succeeds or
        ``backoffLimit`` + 1 have failed; then ``SuccessCriteriaMet``/``FailureTarget`` and, once no
        pod is left running, ``Complete``/``Failed`` (the 1.31+ order). A pod Pod Security refuses
        is never created: the controller records a ``FailedCreate`` Warning event on the Job and
        writes no condition (it retries the create with backoff, forever). A Job still running
        ``activeDeadlineSeconds`` after it started is failed (``_deadline_exceeded``)."""
        job = self.objects.get(("jobs", ns, name))
        if job is None:
            return
        limit = int(job["spec"].get("backoffLimit", 6))
        deadline = job["spec"].get("activeDeadlineSeconds")
        ends = None if deadline is None else asyncio.get_running_loop().time() + float(deadline)
        codes = self.job_exit_codes.get(name, 0)
        failed = 0
        while True:
            attempt = failed
            code = codes if isinstance(codes, int) else codes[min(attempt, len(codes) - 1)]
            try:
                async with asyncio.timeout_at(ends):
                    outcome = await self._job_pod(ns, name, job, code)
            except TimeoutError:
                self._deadline_exceeded(ns, name)
                return
            job = self.objects.get(("jobs", ns, name))
            if job is None or outcome is None:
                return
            status = job.setdefault("status", {})
            if outcome:
                status["succeeded"] = status.get("succeeded", 0) + 1
                self._job_conditions(job, "SuccessCriteriaMet", "Complete", "CompletionsReached",
                                     "Reached expected number of succeeded pods")  # fmt: skip
                self._expire_finished(job)
                return
            failed += 1
            status["failed"] = failed
            if failed > limit:
                self._job_conditions(job, "FailureTarget", "Failed", "BackoffLimitExceeded",
                                     "Job has reached the specified backoff limit")  # fmt: skip
                self._expire_finished(job)
                return
            self.bump(job)

    def _deadline_exceeded(self, ns: str | None, name: str) -> None:
        """The Job controller past ``activeDeadlineSeconds``: its running pods deleted (each counted
        failed), a ``DeadlineExceeded`` Warning event, ``FailureTarget`` then ``Failed`` with that
        reason; then the TTL, if any."""
        job = self.objects.get(("jobs", ns, name))
        if job is None:
            return
        uid, status = job["metadata"]["uid"], job.setdefault("status", {})
        for key, pod in self._pods_of(uid):
            if (pod.get("status") or {}).get("phase") not in ("Succeeded", "Failed"):
                del self.objects[key]
                status["failed"] = status.get("failed", 0) + 1
        status.pop("active", None)
        message = "Job was active longer than specified deadline"
        self._job_event(job, "DeadlineExceeded", message)
        self._job_conditions(job, "FailureTarget", "Failed", "DeadlineExceeded", message)
        self._expire_finished(job)

    def _expire_finished(self, job: dict[str, Any]) -> None:
        """The TTL-after-finished controller: a finished Job with ``spec.ttlSecondsAfterFinished`` is
        deleted that many seconds after it finished, its pods with it (a background cascade of the
        garbage collector, by their ``ownerReferences``). Unset: kept until someone deletes it."""
        ttl = job["spec"].get("ttlSecondsAfterFinished")
        if ttl is None:
            return
        meta = job["metadata"]
        namespace, name, uid = meta.get("namespace"), meta["name"], meta["uid"]

        async def expire() -> None:
            current = self.objects.get(("jobs", namespace, name))
            if current is None or current["metadata"]["uid"] != uid:
                return
            del self.objects[("jobs", namespace, name)]
            for key, _ in self._pods_of(uid):
                del self.objects[key]

        self._later(float(ttl), expire)

    def _pods_of(self, uid: str) -> list[tuple[Key, dict[str, Any]]]:
        """The pods whose ``ownerReferences`` name the object ``uid`` (a Job's), as a list: the
        caller may delete them as it goes."""
        return [
            (key, pod)
            for key, pod in self.objects.items()
            if key[0] == "pods"
            and any(o.get("uid") == uid for o in pod["metadata"].get("ownerReferences") or [])
        ]

    def _job_conditions(
        self, job: dict[str, Any], interim: str, final: str, reason: str, message: str
    ) -> None:
        conditions = job["status"].setdefault("conditions", [])
        for type_ in (interim, final):
            conditions.append(
                {
                    "type": type_,
                    "status": "True",
                    "reason": reason,
                    "message": message,
                    "lastProbeTime": now_iso(),
                    "lastTransitionTime": now_iso(),
                }
            )
        self.bump(job)

    async def _job_pod(self, ns: str | None, name: str, job: dict[str, Any], code: int) -> bool | None:
        """One pod of the Job runs to its end: True succeeded, False failed, None never created."""
        pod_spec = copy.deepcopy(job["spec"]["template"]["spec"])
        pod_name = f"{name}-{uuid.uuid4().hex[:5]}"
        try:
            self._admit_pod(ns, pod_name, pod_spec)
        except ApiError as exc:
            self._job_event(job, "FailedCreate", f"Error creating: {exc}")
            return None
        containers = [c["name"] for c in pod_spec.get("containers") or []]
        pod = {
            "metadata": {
                "name": pod_name,
                "namespace": ns,
                "labels": {"job-name": name, "batch.kubernetes.io/job-name": name},
                "ownerReferences": [
                    {
                        "apiVersion": "batch/v1",
                        "kind": "Job",
                        "name": name,
                        "uid": job["metadata"]["uid"],
                        "controller": True,
                        "blockOwnerDeletion": True,
                    }
                ],
            },
            "spec": pod_spec,
            "status": {"phase": "Running"},
        }
        self.add("pods", pod)
        job_status = job.setdefault("status", {})
        job_status.setdefault("startTime", now_iso())
        job_status["active"] = 1
        self.bump(job)
        node = self.objects.get(("nodes", None, pod_spec.get("nodeName") or ""))
        if resources.untolerated_no_execute(pod_spec, node):
            job_status.pop("active", None)
            self._kubelet_rejects(ns, pod_name)
            return False
        try:
            duration = self.job_durations.get(name, self.job_duration)
            return await self._job_pod_runs(ns, pod_name, pod_spec, containers, code, duration)
        finally:
            job_status.pop("active", None)

    async def _job_pod_runs(
        self,
        ns: str | None,
        pod_name: str,
        pod_spec: dict[str, Any],
        containers: list[str],
        code: int,
        duration: float,
    ) -> bool:
        actions = {
            e.get("value")
            for c in pod_spec.get("containers") or []
            for e in c.get("env") or []
            if e.get("name") == "PITCREW_ACTION"
        }
        reboot = code == 0 and "reboot" in actions
        if reboot and not self.reboot_job_reports_success:
            # The node goes down under its own Job: it comes back with a new boot id and its kubelet
            # reports the pod's container gone (ContainerStatusUnknown, 137); the pod ends Failed.
            await asyncio.sleep(self.reboot_delay)
            await self._booted(pod_spec.get("nodeName"))
            self._pod_ended(ns, pod_name, containers, 137, "ContainerStatusUnknown")
            return False
        await asyncio.sleep(duration)
        self._pod_ended(ns, pod_name, containers, code, "Completed" if code == 0 else "Error")
        if reboot:
            self._later(self.reboot_delay, lambda: self._booted(pod_spec.get("nodeName")))
        return code == 0

    def _kubelet_rejects(self, ns: str | None, pod_name: str) -> None:
        """The kubelet's admission refuses a pod bound to a node with a ``NoExecute`` taint it does
        not tolerate (``rejectPod``): Failed with the predicate's name and message, no container
        run, and a Warning event on the pod."""
        pod = self.objects[("pods", ns, pod_name)]
        message = "Predicate TaintToleration failed: node(s) had taints that the pod didn't tolerate"
        pod["status"] = {
            "phase": "Failed",
            "reason": "TaintToleration",
            "message": f"Pod was rejected: {message}",
        }
        self.bump(pod)
        self._warn(pod, "Pod", "v1", "TaintToleration", message, "kubelet")

    def _pod_ended(
        self, ns: str | None, pod_name: str, containers: list[str], code: int, reason: str
    ) -> None:
        stored = self.objects.get(("pods", ns, pod_name))
        if stored is None:
            return
        stored["status"] = {
            "phase": "Succeeded" if code == 0 else "Failed",
            "containerStatuses": [
                {
                    "name": c,
                    "ready": False,
                    "restartCount": 0,
                    "image": "emulated",
                    "imageID": "",
                    "state": {"terminated": {"exitCode": code, "reason": reason}},
                }
                for c in containers
            ],
        }
        self.bump(stored)

    def _job_event(self, job: dict[str, Any], reason: str, message: str) -> None:
        """A Warning event on the Job, as the Job controller's recorder writes it."""
        self._warn(job, "Job", "batch/v1", reason, message, "job-controller")

    def _warn(
        self, obj: dict[str, Any], kind: str, api_version: str, reason: str, message: str, component: str
    ) -> None:
        """A Warning event on ``obj`` as a client-go recorder writes it: the same one again (same
        object, reason, source and message) counted on the first (``count``, ``lastTimestamp``)."""
        meta = obj["metadata"]
        for key, event in self.objects.items():
            if (
                key[0] == "events"
                and event["involvedObject"].get("uid") == meta["uid"]
                and (event["reason"], event["message"], event["source"]["component"])
                == (reason, message, component)
            ):
                event["count"] += 1
                event["lastTimestamp"] = now_iso()
                self.bump(event)
                return
        self.add(
            "events",
            {
                "metadata": {
                    # A cluster-scoped object's events go to ``default``, as client-go's recorder puts them.
                    "name": f"{meta['name']}.{uuid.uuid4().hex[:16]}",
                    "namespace": meta.get("namespace") or "default",
                },
                "involvedObject": {
                    "kind": kind,
                    "namespace": meta.get("namespace", ""),
                    "name": meta["name"],
                    "uid": meta["uid"],
                    "apiVersion": api_version,
                    "resourceVersion": meta["resourceVersion"],
                },
                "reason": reason,
                "message": message,
                "source": {"component": component},
                "firstTimestamp": now_iso(),
                "lastTimestamp": now_iso(),
                "count": 1,
                "type": "Warning",
                "reportingComponent": component,
                "reportingInstance": "",
            },
        )

    async def _booted(self, node_name: str | None) -> None:
        """The node comes back from its reboot: a new boot id (the kubelet reports it)."""
        node = self.objects.get(("nodes", None, node_name or ""))
        if node is not None:
            node.setdefault("status", {}).setdefault("nodeInfo", {})["bootID"] = str(uuid.uuid4())
            self.bump(node)

    # --- SelfSubjectAccessReview -----------------------------------------------------------------------

    def _review(self, res: Resource, body: Any) -> dict[str, Any]:
        if not isinstance(body, dict):
            raise ApiError(400, "BadRequest", "the body must be a JSON object")
        body.setdefault("metadata", {})
        self._validate(res, {**body, "metadata": {"name": "review", **body["metadata"]}})
        attrs_ = (body.get("spec") or {}).get("resourceAttributes") or {}
        wanted = (attrs_.get("verb", ""), attrs_.get("group", ""), attrs_.get("resource", ""))
        allowed = (*wanted, attrs_.get("subresource", "")) not in self.denied
        return {
            "kind": "SelfSubjectAccessReview",
            "apiVersion": "authorization.k8s.io/v1",
            "metadata": {},
            "spec": body.get("spec") or {},
            "status": {"allowed": allowed, **({} if allowed else {"reason": "denied by the emulator"})},
        }

    # --- helpers ---------------------------------------------------------------------------------------

    def _later(self, delay: float, action: Callable[[], Awaitable[None]]) -> None:
        async def run() -> None:
            await asyncio.sleep(delay)
            await action()

        task = asyncio.get_running_loop().create_task(run())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _existing(self, res: Resource, ns: str | None, name: str) -> dict[str, Any]:
        obj = self.objects.get(self._key(res, ns, name))
        if obj is None:
            raise ApiError.not_found(res, name)
        return self._refreshed(res, obj)

    def _validate(self, res: Resource, obj: dict[str, Any], model: str | None = None) -> None:
        for i, taint in enumerate(
            (obj.get("spec") or {}).get("taints") or [] if res.plural == "nodes" else []
        ):
            effect = taint.get("effect") if isinstance(taint, dict) else None
            if effect not in _TAINT_EFFECTS:
                supported = ", ".join(f'"{e}"' for e in _TAINT_EFFECTS)
                raise ApiError.invalid(
                    res,
                    obj["metadata"]["name"],
                    f"spec.taints[{i}].effect",
                    f'Unsupported value: "{effect}": supported values: {supported}',
                    cause="FieldValueNotSupported",
                )
        if res.plural == "jobs":
            _validate_job(res, obj)
        model = model or _MODELS.get(res.kind)
        if model is not None:
            try:
                _validator._ApiClient__deserialize(copy.deepcopy(obj), model)
            except (ValueError, TypeError) as exc:
                raise ApiError.invalid(
                    res, obj["metadata"]["name"], "", f"not a valid {model}: {exc}"
                ) from exc

    def _bump(self) -> str:
        self._rv += 1
        return str(self._rv)

    @staticmethod
    def _key(res: Resource, ns: str | None, name: str) -> Key:
        return (res.plural, ns if res.namespaced else None, name)


def _validate_job(res: Resource, job: dict[str, Any]) -> None:
    """What the API server's Job validation refuses of a Job (``validateJobSpec`` and the pod
    template's own): a negative ``ttlSecondsAfterFinished``; no container, and a ``restartPolicy``
    other than ``OnFailure`` or ``Never``.
    Unset is refused too: the pod template's default is ``Always``, which a Job never takes
    (``Required value``); with a ``podFailurePolicy`` only ``Never``."""
    name = job["metadata"]["name"]
    spec = _mapping(job.get("spec"))
    pod = _mapping(_mapping(spec.get("template")).get("spec"))
    ttl = spec.get("ttlSecondsAfterFinished")
    if ttl is not None and (not isinstance(ttl, int) or ttl < 0):
        raise ApiError.invalid(
            res,
            name,
            "spec.ttlSecondsAfterFinished",
            f"Invalid value: {ttl}: must be greater than or equal to 0",
        )
    where = "spec.template.spec"
    if not pod.get("containers"):
        raise ApiError.invalid(res, name, f"{where}.containers", "Required value", cause="FieldValueRequired")
    policy = pod.get("restartPolicy") or ""
    allowed = ("OnFailure", "Never")
    if policy in ("", "Always"):
        raise ApiError.invalid(
            res,
            name,
            f"{where}.restartPolicy",
            f'Required value: valid values: "{allowed[0]}", "{allowed[1]}"',
            cause="FieldValueRequired",
        )
    if policy not in allowed:
        raise ApiError.invalid(
            res,
            name,
            f"{where}.restartPolicy",
            f'Unsupported value: "{policy}": supported values: "{allowed[0]}", "{allowed[1]}"',
            cause="FieldValueNotSupported",
        )
    if spec.get("podFailurePolicy") is not None and policy != "Never":
        raise ApiError.invalid(
            res,
            name,
            f"{where}.restartPolicy",
            f'Invalid value: "{policy}": only "Never" is supported when podFailurePolicy is specified',
        )


def _mapping(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _header(request: kmock.Request, name: str) -> str | None:
    return next((v for k, v in request.headers.items() if k.lower() == name.lower()), None)


def _json(request: kmock.Request) -> Any:
    try:
        return json.loads(request.body or b"null")
    except ValueError as exc:
        raise ApiError(400, "BadRequest", f"the request body is not JSON: {exc}") from exc


def _grace(request: kmock.Request) -> int | None:
    if "gracePeriodSeconds" in request.params:
        return int(request.params["gracePeriodSeconds"])
    body = json.loads(request.body) if request.body else {}
    value = body.get("gracePeriodSeconds") if isinstance(body, dict) else None
    return None if value is None else int(value)
