"""What the emulator knows about each resource: its table row, Status bodies, and PDB and replacement maths.

Pure data and functions over JSON dicts; the HTTP and storage live in ``emulator.py``.
"""

from __future__ import annotations

import copy
import json
import math
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path
from typing import Any

from kubernetes.utils.quantity import parse_quantity

from proving_ground.kubernetes.selectors import selector_matches
from proving_ground.kubernetes.slinky import HOSTNAME_OVERRIDE

FIXTURES = Path(__file__).resolve().parent / "fixtures"


@dataclass(frozen=True)
class Resource:
    group: str
    version: str
    plural: str
    kind: str
    namespaced: bool
    crd: bool = False
    generation: bool = False

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version


RESOURCES = (
    Resource("", "v1", "nodes", "Node", namespaced=False),
    Resource("", "v1", "namespaces", "Namespace", namespaced=False),
    Resource("", "v1", "pods", "Pod", namespaced=True),
    Resource("policy", "v1", "poddisruptionbudgets", "PodDisruptionBudget", namespaced=True, generation=True),
    Resource(
        "cluster.x-k8s.io", "v1beta1", "machines", "Machine", namespaced=True, crd=True, generation=True
    ),
    Resource(
        "cluster.x-k8s.io", "v1beta1", "clusters", "Cluster", namespaced=True, crd=True, generation=True
    ),
    Resource("karpenter.sh", "v1", "nodeclaims", "NodeClaim", namespaced=False, crd=True, generation=True),
    Resource("batch", "v1", "jobs", "Job", namespaced=True, generation=True),
    Resource("", "v1", "events", "Event", namespaced=True),
    Resource("storage.k8s.io", "v1", "volumeattachments", "VolumeAttachment", namespaced=False),
    Resource("", "v1", "persistentvolumes", "PersistentVolume", namespaced=False),
    Resource(
        "authorization.k8s.io", "v1", "selfsubjectaccessreviews", "SelfSubjectAccessReview", namespaced=False
    ),
)
BY_PLURAL = {r.plural: r for r in RESOURCES}
BY_GROUP_PLURAL = {(r.group, r.plural): r for r in RESOURCES}
_REASONS = {
    400: "BadRequest",
    403: "Forbidden",
    404: "NotFound",
    409: "Conflict",
    422: "Invalid",
    429: "TooManyRequests",
}


def status_body(
    code: int, reason: str, message: str, details: dict[str, Any] | None = None
) -> dict[str, Any]:
    """A ``metav1.Status`` failure in the apiserver's key order; empty ``reason``/``details`` left out."""
    body: dict[str, Any] = {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure"}
    body["message"] = message
    if reason:
        body["reason"] = reason
    if details:
        body["details"] = details
    body["code"] = code
    return body


class ApiError(Exception):
    """A failure the emulator answers with; ``Retry-After`` only when ``retryAfterSeconds > 0``."""

    def __init__(self, code: int, reason: str, message: str, details: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.body = status_body(code, reason, message, details)
        retry = (details or {}).get("retryAfterSeconds") or 0
        self.headers = {"Retry-After": str(retry)} if retry > 0 else {}

    @classmethod
    def from_fixture(cls, name: str, *, cause: str | None = None, message: str | None = None) -> ApiError:
        body = json.loads((FIXTURES / name).read_text())
        details = copy.deepcopy(body.get("details"))
        if cause is not None and details:
            details["causes"][0]["message"] = cause
        return cls(body["code"], body.get("reason", ""), message or body["message"], details)

    @classmethod
    def not_found(cls, res: Resource, name: str, message: str | None = None) -> ApiError:
        return cls(
            404, "NotFound", message or f'{res.plural} "{name}" not found', {"name": name, "kind": res.plural}
        )

    @classmethod
    def conflict(cls, res: Resource, name: str) -> ApiError:
        message = (
            f'Operation cannot be fulfilled on {res.plural} "{name}": the object has been modified; '
            "please apply your changes to the latest version and try again"
        )
        return cls(409, "Conflict", message, {"name": name, "kind": res.plural})

    @classmethod
    def invalid(
        cls, res: Resource, name: str, field: str, detail: str, cause: str = "FieldValueInvalid"
    ) -> ApiError:
        where = f"{field}: " if field else ""
        return cls(
            422,
            "Invalid",
            f'{res.kind} "{name}" is invalid: {where}{detail}',
            {
                "name": name,
                "kind": res.kind,
                "causes": [{"reason": cause, "message": detail, "field": field}],
            },
        )

    @classmethod
    def injected(cls, code: int, res: Resource, name: str | None, retry_after: int | None) -> ApiError:
        if code == 500:
            return cls.from_fixture("status-500.json")
        if code == 404:
            return cls.not_found(res, name or "")
        if code == 409:
            return cls.conflict(res, name or "")
        details = {"retryAfterSeconds": retry_after} if retry_after else None
        return cls(code, _REASONS.get(code, ""), f"injected failure {code}", details)


def pdb_selects(pdb: dict[str, Any], labels: dict[str, str]) -> bool:
    selector = (pdb.get("spec") or {}).get("selector")
    return selector is not None and selector_matches(labels, selector)


def _resolve(value: int | str, expected: int, round_up: bool) -> int:
    if isinstance(value, str) and value.endswith("%"):
        exact = expected * int(value[:-1]) / 100
        return math.ceil(exact) if round_up else math.floor(exact)
    return int(value)


def ready(obj: dict[str, Any]) -> bool:
    """The object's Ready condition is True: a pod's (``podutil.IsPodReady``) or a node's (its
    kubelet's), the same shape in ``status.conditions``."""
    return any(
        c.get("type") == "Ready" and c.get("status") == "True"
        for c in (obj.get("status") or {}).get("conditions", [])
    )


def pdb_status(pdb: dict[str, Any], pods: list[dict[str, Any]]) -> dict[str, Any]:
    """The disruption controller's arithmetic: healthy = Running, Ready, not terminating, not just evicted."""
    old = pdb.get("status") or {}
    disrupted = old.get("disruptedPods") or {}
    selected = [p for p in pods if pdb_selects(pdb, p["metadata"].get("labels") or {})]
    expected = len(selected)
    healthy = sum(
        1
        for p in selected
        if not p["metadata"].get("deletionTimestamp")
        and p["metadata"]["name"] not in disrupted
        and (p.get("status") or {}).get("phase") == "Running"
        and ready(p)
    )
    spec = pdb.get("spec") or {}
    if "minAvailable" in spec:
        desired = _resolve(spec["minAvailable"], expected, round_up=True)
    else:
        desired = expected - _resolve(spec.get("maxUnavailable", 0), expected, round_up=True)
    return {
        "observedGeneration": old.get("observedGeneration", pdb["metadata"].get("generation", 1)),
        "disruptedPods": disrupted,
        "disruptionsAllowed": max(0, healthy - desired),
        "currentHealthy": healthy,
        "desiredHealthy": desired,
        "expectedPods": expected,
    }


def replacement_node(template: dict[str, Any] | None, name: str, suffix: str) -> dict[str, Any]:
    """A new Node cloned from the replaced one's labels and capacity, registered NotReady."""
    node = copy.deepcopy(template) if template else {"metadata": {}, "spec": {}, "status": {}}
    meta = node["metadata"]
    for key in ("uid", "creationTimestamp", "resourceVersion", "deletionTimestamp"):
        meta.pop(key, None)
    meta["name"] = name
    labels = meta.setdefault("labels", {})
    labels["kubernetes.io/hostname"] = name
    annotations = meta.get("annotations") or {}
    # Per-node annotations stay with the node replaced: pitcrew's, and Slinky's hostname-override,
    # which a MachineTemplate or NodePool (one template for every node) cannot give a new node.
    meta["annotations"] = {
        k: v for k, v in annotations.items() if not k.startswith("pitcrew.dev/") and k != HOSTNAME_OVERRIDE
    }
    spec = node.setdefault("spec", {})
    spec.pop("unschedulable", None)
    provider = spec.get("providerID", "aws:///us-east-1a/i-0")
    spec["providerID"] = f"{provider.rsplit('/', 1)[0]}/i-{suffix}"
    spec["taints"] = [
        t for t in spec.get("taints") or [] if not t["key"].startswith(("pitcrew.dev/", "node."))
    ]
    status = node.setdefault("status", {})
    status["conditions"] = [{"type": "Ready", "status": "False", "reason": "KubeletNotReady"}]
    return node


#: The conditions a MachineHealthCheck sets on a Machine it judged.
_HEALTH_CHECK = ("HealthCheckSucceeded", "OwnerRemediated")


def replacement_handle(old: dict[str, Any], node_name: str, suffix: str) -> dict[str, Any]:
    """The new Machine (MachineSet) or NodeClaim (NodePool) that owns the replacement node."""
    handle = copy.deepcopy(old)
    meta = handle["metadata"]
    for key in (
        "uid",
        "creationTimestamp",
        "resourceVersion",
        "deletionTimestamp",
        "deletionGracePeriodSeconds",
    ):
        meta.pop(key, None)
    meta["name"] = f"{meta['name'].rsplit('-', 1)[0]}-{suffix}"
    meta["generation"] = 1
    status = handle.setdefault("status", {})
    for conditions in (status.get("conditions"), (status.get("v1beta2") or {}).get("conditions")):
        if conditions is not None:  # a new Machine: no health check has judged it
            conditions[:] = [c for c in conditions if c.get("type") not in _HEALTH_CHECK]
    if "nodeRef" in status:
        status["nodeRef"] = {"apiVersion": "v1", "kind": "Node", "name": node_name}
    if "nodeName" in status:
        status["nodeName"] = node_name
    return handle


def _requests(pod: dict[str, Any]) -> dict[str, Decimal]:
    """A pod's effective requests (``resource.PodRequests``): its containers' sum, or an init
    container's if larger."""
    spec = pod.get("spec") or {}
    total: dict[str, Decimal] = {}
    for container in spec.get("containers") or []:
        for name, value in ((container.get("resources") or {}).get("requests") or {}).items():
            total[name] = total.get(name, Decimal(0)) + parse_quantity(value)
    for container in spec.get("initContainers") or []:
        for name, value in ((container.get("resources") or {}).get("requests") or {}).items():
            total[name] = max(total.get(name, Decimal(0)), parse_quantity(value))
    return total


def untolerated_no_execute(pod_spec: dict[str, Any], node: dict[str, Any] | None) -> list[dict[str, Any]]:
    """The node's ``NoExecute`` taints the pod does not tolerate: what the kubelet's admission
    checks of a pod bound to it (``pkg/kubelet/lifecycle/predicate.go``: "Kubelet is only
    interested in the NoExecute taint"), scheduler or not; a ``NoSchedule`` taint only the
    scheduler reads, so a pod given ``nodeName`` passes it."""
    taints = ((node or {}).get("spec") or {}).get("taints") or []
    tolerations = pod_spec.get("tolerations") or []
    return [t for t in taints if t.get("effect") == "NoExecute" and not _tolerated(t, tolerations)]


def _tolerated(taint: dict[str, Any], tolerations: list[dict[str, Any]]) -> bool:
    """``v1.Toleration.ToleratesTaint``: an empty key with ``Exists`` tolerates every taint; an
    empty effect every effect."""
    for t in tolerations:
        if t.get("effect") and t["effect"] != taint.get("effect"):
            continue
        if not t.get("key"):
            if t.get("operator") == "Exists":
                return True
            continue
        if t["key"] != taint.get("key"):
            continue
        if t.get("operator") == "Exists" or t.get("value", "") == taint.get("value", ""):
            return True
    return False


def unfit(pod: dict[str, Any], node: dict[str, Any], there: list[dict[str, Any]]) -> str | None:
    """Why kube-scheduler's default filters put ``pod`` on no ``node`` (None: it fits); ``there``:
    the pods bound to the node. NodeUnschedulable, NodeAffinity (``nodeSelector``), TaintToleration
    (NoSchedule and NoExecute; a NotReady node carries ``node.kubernetes.io/not-ready``, as the node
    lifecycle controller taints it) and NodeResourcesFit: each request within what the node's
    allocatable leaves after the requests of its pods not yet Succeeded or Failed."""
    spec, status = pod.get("spec") or {}, node.get("status") or {}
    tolerations = spec.get("tolerations") or []
    taints = list((node.get("spec") or {}).get("taints") or [])
    if (node.get("spec") or {}).get("unschedulable"):
        taints.append({"key": "node.kubernetes.io/unschedulable", "effect": "NoSchedule"})
    if not ready(node):
        taints.append({"key": "node.kubernetes.io/not-ready", "effect": "NoSchedule"})
    labels = node["metadata"].get("labels") or {}
    if any(labels.get(k) != v for k, v in (spec.get("nodeSelector") or {}).items()):
        return "node(s) didn't match Pod's node affinity/selector"
    for taint in taints:
        if taint.get("effect") in ("NoSchedule", "NoExecute") and not _tolerated(taint, tolerations):
            return f"node(s) had untolerated taint {{{taint.get('key')}: {taint.get('value', '')}}}"
    allocatable = status.get("allocatable") or {}
    used: dict[str, Decimal] = {}
    for other in there:
        if (other.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
            continue
        for name, amount in _requests(other).items():
            used[name] = used.get(name, Decimal(0)) + amount
    for name, amount in _requests(pod).items():
        if amount > parse_quantity(allocatable.get(name, "0")) - used.get(name, Decimal(0)):
            return f"Insufficient {name}"
    return None
