"""Cluster API's two served versions of a Machine, as its conversion webhook makes one from the other.

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
from typing import Any

from bot.domain.durations import parse_duration

GROUP = "cluster.x-k8s.io"
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
        ],
    }


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


def as_served(body: dict[str, Any], version: str) -> dict[str, Any]:
    """A Machine, a MachineList or anything else answered for ``version``: converted when v1beta2."""
    if version != "v1beta2":
        return body
    if body.get("kind") == "Machine":
        return machine_v1beta2(body)
    if body.get("kind") == "MachineList":
        return {
            **body,
            "apiVersion": f"{GROUP}/v1beta2",
            "items": [machine_v1beta2(item) for item in body.get("items") or []],
        }
    return body
