"""Cluster API's two served versions of a Machine (and a Cluster), as its conversion webhook makes one
from the other, and when its controllers are paused.

Cluster API v1.11 made ``cluster.x-k8s.io/v1beta2`` the storage version and kept serving v1beta1;
v1.16 (April 2027) serves v1beta2 only (cluster-api issue 11920, the removal timeline). The emulator
keeps each Machine in its v1beta1 shape (the fixture, with ``status.v1beta2.conditions``) and gives
it out as v1beta2 when asked so, as ``Convert_v1beta1_Machine{Spec,Status}_To_v1beta2_*`` and
``ConvertTo`` in ``api/core/v1beta1/conversion.go`` do for the fields a Machine of ours has:

- ``status.conditions`` are the v1beta2 conditions (from ``status.v1beta2.conditions``); the
  v1beta1 ones, ``failureReason`` and ``failureMessage`` move to ``status.deprecated.v1beta1``;
- ``status.nodeRef`` keeps its ``name`` only (``MachineNodeReference``);
- ``status.bootstrapReady`` / ``infrastructureReady`` become ``status.initialization``'s
  ``bootstrapDataSecretCreated`` / ``infrastructureProvisioned``;
- ``spec.bootstrap.configRef`` and ``spec.infrastructureRef`` become contract-versioned references
  (``apiGroup``, ``kind``, ``name``);
- ``spec.nodeDrainTimeout``, ``nodeVolumeDetachTimeout`` and ``nodeDeletionTimeout`` become whole
  seconds under ``spec.deletion``.
"""

from __future__ import annotations

import copy
from datetime import UTC, datetime
from typing import Any

from bot.domain.durations import parse_duration

GROUP = "cluster.x-k8s.io"
#: On any Cluster API object: its controller leaves it alone (``util/annotations`` ``HasPaused``: the
#: key is enough, whatever its value).
PAUSED_ANNOTATION = "cluster.x-k8s.io/paused"
#: On a Machine, beside ``spec.clusterName``: the Cluster it belongs to, in its namespace.
CLUSTER_NAME_LABEL = "cluster.x-k8s.io/cluster-name"
#: What Cluster API v1.11 to v1.15 serve (v1beta2 preferred); v1.16 drops v1beta1, before v1.11
#: there is no v1beta2.
SERVED = ("v1beta2", "v1beta1")
_TIMEOUTS = {
    "nodeDrainTimeout": "nodeDrainTimeoutSeconds",
    "nodeVolumeDetachTimeout": "nodeVolumeDetachTimeoutSeconds",
    "nodeDeletionTimeout": "nodeDeletionTimeoutSeconds",
}


def api_resources(version: str) -> dict[str, Any]:
    """``GET /apis/cluster.x-k8s.io/<version>``: the version's discovery document (its Machines)."""
    verbs = ["delete", "deletecollection", "get", "list", "patch", "create", "update", "watch"]
    return {
        "kind": "APIResourceList",
        "apiVersion": "v1",
        "groupVersion": f"{GROUP}/{version}",
        "resources": [
            {
                "name": "machines",
                "singularName": "machine",
                "namespaced": True,
                "kind": "Machine",
                "verbs": verbs,
                "shortNames": ["ma"],
                "categories": ["cluster-api"],
            },
            {
                "name": "machines/status",
                "singularName": "",
                "namespaced": True,
                "kind": "Machine",
                "verbs": ["get", "patch", "update"],
            },
            {
                "name": "clusters",
                "singularName": "cluster",
                "namespaced": True,
                "kind": "Cluster",
                "verbs": verbs,
                "shortNames": ["cl"],
                "categories": ["cluster-api"],
            },
            {
                "name": "clusters/status",
                "singularName": "",
                "namespaced": True,
                "kind": "Cluster",
                "verbs": ["get", "patch", "update"],
            },
        ],
    }


def cluster(name: str, namespace: str, *, paused: bool = False) -> dict[str, Any]:
    """A v1beta1 Cluster as the emulator keeps it: its references to the control plane and the
    infrastructure (what ``clusterctl generate cluster`` writes) and ``spec.paused``, a bool left out
    when false (``omitempty``; v1beta2 makes it a ``*bool`` under the same name)."""
    spec: dict[str, Any] = {"paused": True} if paused else {}
    spec["controlPlaneRef"] = {
        "apiVersion": "controlplane.cluster.x-k8s.io/v1beta1",
        "kind": "KubeadmControlPlane",
        "name": f"{name}-control-plane",
        "namespace": namespace,
    }
    spec["infrastructureRef"] = {
        "apiVersion": "infrastructure.cluster.x-k8s.io/v1beta2",
        "kind": "AWSCluster",
        "name": name,
        "namespace": namespace,
    }
    return {
        "apiVersion": f"{GROUP}/v1beta1",
        "kind": "Cluster",
        "metadata": {"name": name, "namespace": namespace, "finalizers": ["cluster.cluster.x-k8s.io"]},
        "spec": spec,
    }


def paused(cluster: dict[str, Any] | None, obj: dict[str, Any]) -> str | None:
    """Why Cluster API's controllers leave ``obj`` alone (None: they do not), in the words of the
    ``Paused`` condition ``util/paused/paused.go`` sets: its Cluster's ``spec.paused`` is true, or
    it carries the paused annotation (the Machine controller returns before anything else, deletion
    included, and the MachineSet controller likewise for the MachineSet's own)."""
    said = []
    if cluster is not None and (cluster.get("spec") or {}).get("paused") is True:
        said.append("Cluster spec.paused is set to true")
    if PAUSED_ANNOTATION in ((obj.get("metadata") or {}).get("annotations") or {}):
        said.append(f"{obj.get('kind', 'Object')} has the {PAUSED_ANNOTATION} annotation")
    return ", ".join(said) or None


def _reference(ref: dict[str, Any]) -> dict[str, Any]:
    """An ``ObjectReference`` as a ``ContractVersionedObjectReference``: its group, kind and name."""
    group = str(ref.get("apiVersion", "")).rpartition("/")[0]
    return {"apiGroup": group, "kind": ref.get("kind", ""), "name": ref.get("name", "")}


def machine_v1beta2(stored: dict[str, Any]) -> dict[str, Any]:
    """The v1beta2 Machine of a stored v1beta1 one (list items carry no ``apiVersion``)."""
    machine = copy.deepcopy(stored)
    if "apiVersion" in machine:
        machine["apiVersion"] = f"{GROUP}/v1beta2"
    spec = machine.get("spec") or {}
    bootstrap = spec.get("bootstrap") or {}
    if "configRef" in bootstrap:
        bootstrap["configRef"] = _reference(bootstrap["configRef"])
    if "infrastructureRef" in spec:
        spec["infrastructureRef"] = _reference(spec["infrastructureRef"])
    # A Go ``metav1.Duration`` (``10m0s``) in whole seconds, as ``ConvertToSeconds`` truncates.
    deletion = {
        new: int(parse_duration(spec.pop(old)).total_seconds())
        for old, new in _TIMEOUTS.items()
        if old in spec
    }
    if deletion:
        spec["deletion"] = deletion
    status = machine.get("status")
    if status is None:
        return machine
    legacy = {k: status.pop(k) for k in ("conditions", "failureReason", "failureMessage") if k in status}
    conditions = (status.pop("v1beta2", None) or {}).get("conditions")
    if conditions is not None:
        status["conditions"] = conditions
    if legacy:
        status["deprecated"] = {"v1beta1": legacy}
    if "nodeRef" in status:
        status["nodeRef"] = {"name": status["nodeRef"].get("name", "")}
    ready = {
        new: status.pop(old)
        for old, new in (
            ("bootstrapReady", "bootstrapDataSecretCreated"),
            ("infrastructureReady", "infrastructureProvisioned"),
        )
        if old in status
    }
    if ready:
        status["initialization"] = ready
    return machine


def cluster_v1beta2(stored: dict[str, Any]) -> dict[str, Any]:
    """The v1beta2 Cluster of a stored v1beta1 one: its references contract-versioned (``spec.paused``
    keeps its name and value)."""
    found = copy.deepcopy(stored)
    if "apiVersion" in found:
        found["apiVersion"] = f"{GROUP}/v1beta2"
    spec = found.get("spec") or {}
    for ref in ("controlPlaneRef", "infrastructureRef"):
        if ref in spec:
            spec[ref] = _reference(spec[ref])
    return found


def as_served(body: dict[str, Any], version: str) -> dict[str, Any]:
    """A Machine, a Cluster, a list of either or anything else answered for ``version``: converted
    when v1beta2."""
    if version != "v1beta2":
        return body
    convert = {"Machine": machine_v1beta2, "Cluster": cluster_v1beta2}
    kind = str(body.get("kind", ""))
    if kind in convert:
        return convert[kind](body)
    if kind.removesuffix("List") in convert:
        return {
            **body,
            "apiVersion": f"{GROUP}/v1beta2",
            "items": [convert[kind.removesuffix("List")](item) for item in body.get("items") or []],
        }
    return body


# --- the Machine controller's deletion (``reconcileDelete``, v1.9+ drain) ----------------------------

#: The first release that writes the v1beta2 ``Deleting`` condition (``setDeletingCondition``),
#: ``status.deletion``'s start times and a drain message naming the pods; before it, v1beta1
#: conditions only (``release-1.8`` ``reconcileDelete``).
V1BETA2_CONDITIONS = (1, 9)

#: On a Machine: its Node is not drained, its volumes not waited for (``machine_types.go``).
EXCLUDE_DRAIN = "machine.cluster.x-k8s.io/exclude-node-draining"
EXCLUDE_VOLUME_WAIT = "machine.cluster.x-k8s.io/exclude-wait-for-node-volume-detach"
#: Annotation prefixes of the delete lifecycle hooks: while one is on the Machine, its deletion waits
#: before the drain (pre-drain) or before the infrastructure's delete (pre-terminate), for ever.
PRE_DRAIN_HOOK = "pre-drain.delete.hook.machine.cluster.x-k8s.io"
PRE_TERMINATE_HOOK = "pre-terminate.delete.hook.machine.cluster.x-k8s.io"
#: On a pod: ``skip`` (not drained) or ``wait-completed`` (waited for, never evicted) (``drainLabelFilter``).
DRAIN_LABEL = "cluster.x-k8s.io/drain"
_PDB_REFUSAL = "Cannot evict pod as it would violate the pod's disruption budget."


def unreachable(node: dict[str, Any]) -> bool:
    """``noderefutil.IsNodeUnreachable``: the Node's Ready condition Unknown (its kubelet gone)."""
    conditions = (node.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "Unknown" for c in conditions)


def pod_list(refs: list[str], n: int = 3) -> str:
    """``PodListToString``: the first ``n`` pods, comma-separated, then "... (N more)"."""
    shown = refs[:n] + ([f"... ({len(refs) - n} more)"] if len(refs) > n else [])
    return ", ".join(shown)


def drain_message(started: str, deleting: list[str], failed: dict[str, list[str]], waiting: list[str]) -> str:
    """``EvictionResult.ConditionMessage`` (``drain/drain.go``, v1.9+): the drain's start, then one
    line per kind of pod still there; a budget's refusal said as "cannot evict pod as it would
    violate the pod's disruption budget. <its cause>", any other failure "failed to evict Pod, <error>"."""
    message = f"Drain not completed yet (started at {started}):"
    if deleting:
        kind = "Pods" if len(deleting) > 1 else "Pod"
        message += (
            f"\n* {kind} {pod_list(deleting)}: deletionTimestamp set, but still not removed from the Node"
        )
    errors = sorted(failed)
    for error in errors[:5]:
        pods = failed[error]
        said = error.replace(_PDB_REFUSAL, _PDB_REFUSAL[0].lower() + _PDB_REFUSAL[1:])
        if not said.startswith(_PDB_REFUSAL[0].lower() + _PDB_REFUSAL[1:]):
            said = "failed to evict Pod, " + said
        message += f"\n* {'Pods' if len(pods) > 1 else 'Pod'} {pod_list(pods)}: {said}"
    others = sum(len(failed[error]) for error in errors[5:])
    if others:
        message += "\n* 1 Pod with other issues" if others == 1 else f"\n* {others} Pods with other issues"
    if waiting:
        message += f"\n* {'Pods' if len(waiting) > 1 else 'Pod'} {pod_list(waiting)}: waiting for completion"
    return message


def eviction_error(body: dict[str, Any]) -> str:
    """The error a refused eviction is to the drain: the Status message, then its causes (a 429's),
    as ``EvictPods`` joins them ("%s %v", comma-separated)."""
    causes = [str(c.get("message", "")) for c in (body.get("details") or {}).get("causes") or []]
    message = str(body.get("message", ""))
    return f"{message} {','.join(causes)}" if causes else message


def set_v1beta1(
    machine: dict[str, Any], type_: str, status: str, reason: str = "", message: str = ""
) -> bool:
    """A v1beta1 condition (``v1beta1conditions.MarkFalse`` / ``MarkTrue``: severity Info while False,
    its time moved only when its status does). Whether anything changed."""
    conditions = machine.setdefault("status", {}).setdefault("conditions", [])
    return _set(conditions, {"type": type_, "status": status, "reason": reason, "message": message})


def wait_began(
    machine: dict[str, Any],
    start: str,
    condition: str,
    reason: str,
    message: str,
    now: str,
    *,
    recorded: bool = True,
) -> tuple[str, bool]:
    """A wait of ``reconcileDelete`` (the drain, the volumes' detach) under way: its start time in
    ``status.deletion.<start>``, set once (``now``), and its v1beta1 ``condition`` False the first
    time. Before v1.9 (not ``recorded``) there is no ``status.deletion`` (v1.9 added
    ``MachineDeletionStatus``): the start is the condition's ``lastTransitionTime``, as v1.8's
    ``nodeDrainTimeoutExceeded`` / ``nodeVolumeDetachTimeoutExceeded`` read it. The start time, and
    whether anything changed."""
    changed = False
    if recorded:
        deletion = machine.setdefault("status", {}).setdefault("deletion", {})
        changed = not deletion.get(start)
        if changed:
            deletion[start] = now
    if v1beta1_condition(machine, condition) is None:
        changed |= set_v1beta1(machine, condition, "False", reason, message)
    began = began_at(machine, start, condition, recorded=recorded)
    return str(began), changed


def v1beta1_condition(machine: dict[str, Any], type_: str) -> dict[str, Any] | None:
    """The stored Machine's v1beta1 condition ``type_`` (``status.conditions``), if set."""
    conditions = (machine.get("status") or {}).get("conditions") or []
    return next((c for c in conditions if c.get("type") == type_), None)


def began_at(machine: dict[str, Any], start: str, condition: str, *, recorded: bool = True) -> str | None:
    """When a wait of ``reconcileDelete`` began, as the release reads it for its timeout:
    ``status.deletion.<start>`` (v1.9+, ``recorded``) or the v1beta1 ``condition``'s
    ``lastTransitionTime`` (before v1.9). None: not begun."""
    if recorded:
        return ((machine.get("status") or {}).get("deletion") or {}).get(start)
    found = v1beta1_condition(machine, condition)
    return None if found is None else found.get("lastTransitionTime")


def set_deleting(machine: dict[str, Any], reason: str, message: str) -> bool:
    """The v1beta2 ``Deleting`` condition, True while deleting (``setDeletingCondition``), kept in
    ``status.v1beta2.conditions`` (served as ``status.conditions`` in v1beta2: ``machine_v1beta2``)."""
    v1beta2 = machine.setdefault("status", {}).setdefault("v1beta2", {})
    conditions = v1beta2.setdefault("conditions", [])
    generation = machine["metadata"].get("generation", 1)
    wanted = {"type": "Deleting", "status": "True", "observedGeneration": generation, "reason": reason}
    return _set(conditions, {**wanted, "message": message})


def _set(conditions: list[dict[str, Any]], wanted: dict[str, Any]) -> bool:
    found = next((c for c in conditions if c.get("type") == wanted["type"]), None)
    wanted = {k: v for k, v in wanted.items() if v != ""}
    if "observedGeneration" not in wanted and wanted["status"] == "False":
        wanted["severity"] = "Info"
    now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    if found is None:
        conditions.append({**wanted, "lastTransitionTime": now})
        return True
    if {k: v for k, v in found.items() if k != "lastTransitionTime"} == wanted:
        return False
    when = now if found.get("status") != wanted["status"] else found.get("lastTransitionTime", now)
    found.clear()
    found.update({**wanted, "lastTransitionTime": when})
    return True


def volume_message(started: str, claims: list[str], unclaimed: list[str], missing: list[str]) -> str:
    """``attachedVolumeInformation.conditionMessage`` (machine_controller.go, v1.9+): the wait's start,
    then the attached volumes' claims, PersistentVolumes with no claim, and VolumeAttachments whose
    PersistentVolume is not there, each list sorted and ``StringListToString``'s five at most."""
    message = f"Waiting for Node volumes to be detached (started at {started})"
    for title, names in (
        ("PersistentVolumeClaims", claims),
        ("PersistentVolumes without a .spec.claimRef to a PersistentVolumeClaim", unclaimed),
        ("VolumeAttachment with .spec.source.persistentVolumeName not matching a PersistentVolume", missing),
    ):
        if names:
            message += f"\n* {title}: {pod_list(sorted(names), 5)}"
    return message


def deletion_timeout(machine: dict[str, Any], field: str = "nodeDrainTimeout") -> float | None:
    """The Machine's ``spec.<field>`` (``nodeDrainTimeout``, ``nodeVolumeDetachTimeout``) in seconds
    (unset or 0: it waits for ever)."""
    value = (machine.get("spec") or {}).get(field)
    seconds = parse_duration(value).total_seconds() if value else 0.0
    return seconds if seconds > 0 else None
