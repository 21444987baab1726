"""Nodes: what pitcrew reads of a node, and its one guarded write for cordon and for uncordon.

A cordon is a single merge patch carrying the node's ``resourceVersion``: ``spec.unschedulable``,
the whole taint list (the taints read plus pitcrew's, since merge patch replaces the list) and
the ownership annotations, so the node is never half-written and a taint someone added since
the read makes the write fail with 409 instead of being dropped; a 409 re-reads and tries
again. Uncordon writes the same way and only on a node carrying this incident's annotation,
restoring ``spec.unschedulable`` as it was and removing only pitcrew's taint and annotations.
The marks themselves are ``bot.domain.ownership``'s; this module must not spell them out.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from kubernetes.aio import client
from kubernetes.aio.client.exceptions import ApiException

from bot.domain.ownership import (
    OWNER_ANNOTATION,
    PRIOR_UNSCHEDULABLE_ANNOTATION,
    SLINKY_CORDON_REASON,
    Taint,
    cordon_marks,
    fault_taint,
    is_own_taint,
    owns_node,
    owns_slurm_reason,
    prior_unschedulable,
)
from bot.engine.errors import PermanentError, Reason, TransientError
from bot.engine.ports import ClusterNode
from bot.integrations.kubernetes.client import call

MERGE_PATCH = "application/merge-patch+json"
#: Re-reads after a 409 inside one call; beyond that the step's own retry takes over.
CONFLICT_RETRIES = 5


def facts(node: client.V1Node, gpu_resource: str) -> ClusterNode:
    meta, spec, status = node.metadata, node.spec, node.status
    conditions = (status.conditions if status else None) or []
    ready = any(c.type == "Ready" and c.status == "True" for c in conditions)
    allocatable = (status.allocatable if status else None) or {}
    gpus = allocatable.get(gpu_resource)
    return ClusterNode(
        name=meta.name,
        unschedulable=bool(spec and spec.unschedulable),
        ready=ready,
        taints=tuple(Taint(t.key, t.value or "", t.effect) for t in (spec.taints if spec else None) or []),
        labels=dict(meta.labels or {}),
        annotations=dict(meta.annotations or {}),
        gpus=int(gpus) if gpus is not None and str(gpus).isdigit() else None,
    )


def raw_facts(node: Mapping[str, Any], gpu_resource: str) -> ClusterNode:
    """``facts`` of a node as the API's JSON has it (a list read without the client's models)."""
    meta, spec, status = node.get("metadata") or {}, node.get("spec") or {}, node.get("status") or {}
    conditions = status.get("conditions") or []
    gpus = (status.get("allocatable") or {}).get(gpu_resource)
    return ClusterNode(
        name=meta.get("name", ""),
        unschedulable=bool(spec.get("unschedulable")),
        ready=any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions),
        taints=tuple(
            Taint(t.get("key", ""), t.get("value") or "", t.get("effect", ""))
            for t in spec.get("taints") or []
        ),
        labels=dict(meta.get("labels") or {}),
        annotations=dict(meta.get("annotations") or {}),
        gpus=int(gpus) if gpus is not None and str(gpus).isdigit() else None,
    )


def _taint_dicts(node: client.V1Node) -> list[dict[str, Any]]:
    """The node's taints as sent back in a patch (``timeAdded`` kept, so nothing changes but ours)."""
    out = []
    for t in (node.spec.taints if node.spec else None) or []:
        taint: dict[str, Any] = {"key": t.key, "effect": t.effect}
        if t.value is not None:
            taint["value"] = t.value
        if t.time_added is not None:
            taint["timeAdded"] = t.time_added.strftime("%Y-%m-%dT%H:%M:%SZ")
        out.append(taint)
    return out


class Nodes:
    def __init__(self, api: client.ApiClient, *, gpu_resource: str, timeout: float) -> None:
        self._core = client.CoreV1Api(api)
        self._gpu = gpu_resource
        self._timeout = timeout

    async def read(self, name: str) -> client.V1Node | None:
        try:
            node: client.V1Node = await call(
                f"read node {name}", self._core.read_node(name, _request_timeout=self._timeout)
            )
        except PermanentError as exc:
            if exc.reason == Reason.NOT_FOUND:
                return None
            raise
        return node

    async def node(self, name: str) -> ClusterNode | None:
        node = await self.read(name)
        return None if node is None else facts(node, self._gpu)

    async def fleet_facts(self, selector: str) -> list[ClusterNode]:
        """The GPU fleet as ``ClusterNode`` records, from the raw JSON of one list: turning 10,000
        nodes into client model objects costs seconds, reading the few fields needed does not."""

        async def listed() -> Any:
            response = await self._core.list_node_without_preload_content(
                label_selector=selector, _request_timeout=self._timeout
            )
            try:
                if response.status >= 400:  # the status body says why, as the client's own error would
                    raise ApiException(
                        status=response.status, reason=response.reason, body=await response.text()
                    )
                return json.loads(await response.read())
            finally:
                response.release()

        body = await call("list the GPU fleet", listed())
        return [raw_facts(item, self._gpu) for item in body.get("items") or ()]

    async def fleet(self, selector: str) -> list[client.V1Node]:
        listed = await call(
            "list the GPU fleet",
            self._core.list_node(label_selector=selector, _request_timeout=self._timeout),
        )
        return list(listed.items)

    async def cordon(self, name: str, *, incident_id: str) -> bool:
        """Unschedulable + pitcrew's taint + ownership, in one guarded write; nothing (``False``) if
        this incident's cordon is already on the node."""
        for _ in range(CONFLICT_RETRIES):
            node = await self._existing(name)
            annotations = node.metadata.annotations or {}
            taints = _taint_dicts(node)
            has_taint = any(is_own_taint(t["key"]) for t in taints)
            if node.spec.unschedulable and owns_node(annotations, incident_id) and has_taint:
                return False  # a resumed step: this incident's cordon is already on the node
            if not owns_node(annotations, incident_id):
                marks = cordon_marks(incident_id, node.spec.unschedulable)
            else:  # our annotations landed with a half-finished write of our own: keep the recorded prior
                marks = {OWNER_ANNOTATION: incident_id}
            if not has_taint:
                taint = fault_taint()
                taints.append({"key": taint.key, "value": taint.value, "effect": taint.effect})
            body = {
                "metadata": {"resourceVersion": node.metadata.resource_version, "annotations": marks},
                "spec": {"unschedulable": True, "taints": taints},
            }
            if await self._write(name, body, "cordon"):
                return True
        raise TransientError(f"cordon of {name}: the node kept changing under us", reason=Reason.CONFLICT)

    async def uncordon(self, name: str, *, incident_id: str) -> bool:
        """Undo this incident's cordon exactly; ``False`` (no write) if the node is not ours."""
        for _ in range(CONFLICT_RETRIES):
            node = await self.read(name)
            annotations = (node.metadata.annotations or {}) if node else {}
            if node is None or not owns_node(annotations, incident_id):
                return False
            drop: dict[str, str | None] = {OWNER_ANNOTATION: None, PRIOR_UNSCHEDULABLE_ANNOTATION: None}
            if owns_slurm_reason(annotations.get(SLINKY_CORDON_REASON, ""), incident_id):
                drop[SLINKY_CORDON_REASON] = None
            body = {
                "metadata": {"resourceVersion": node.metadata.resource_version, "annotations": drop},
                "spec": {
                    "unschedulable": prior_unschedulable(annotations),
                    "taints": [t for t in _taint_dicts(node) if not is_own_taint(t["key"])] or None,
                },
            }
            if await self._write(name, body, "uncordon"):
                return True
        raise TransientError(f"uncordon of {name}: the node kept changing under us", reason=Reason.CONFLICT)

    async def annotate(self, name: str, annotations: Mapping[str, str | None]) -> None:
        """Set or (``None``) remove annotations; a merge patch touches no other key."""
        body = {"metadata": {"annotations": dict(annotations)}}
        await call(
            f"annotate node {name}",
            self._core.patch_node(name, body, _content_type=MERGE_PATCH, _request_timeout=self._timeout),
        )

    async def label(self, name: str, labels: Mapping[str, str | None]) -> None:
        """Set or (``None``) remove labels; a merge patch touches no other key."""
        body = {"metadata": {"labels": dict(labels)}}
        await call(
            f"label node {name}",
            self._core.patch_node(name, body, _content_type=MERGE_PATCH, _request_timeout=self._timeout),
        )

    async def delete(self, name: str) -> None:
        await call(f"delete node {name}", self._core.delete_node(name, _request_timeout=self._timeout))

    async def _existing(self, name: str) -> client.V1Node:
        node = await self.read(name)
        if node is None:
            raise PermanentError(f"node {name} is not in Kubernetes", reason=Reason.NOT_FOUND)
        return node

    async def write(self, name: str, body: dict[str, Any], what: str) -> bool:
        """One merge patch, guarded when ``body`` carries ``metadata.resourceVersion``; ``False`` on 409."""
        return await self._write(name, body, what)

    async def _write(self, name: str, body: dict[str, Any], what: str) -> bool:
        """One guarded patch; ``False`` on 409 (re-read and try again)."""
        try:
            await call(
                f"{what} node {name}",
                self._core.patch_node(name, body, _content_type=MERGE_PATCH, _request_timeout=self._timeout),
            )
        except TransientError as exc:
            if exc.reason == Reason.CONFLICT:
                return False
            raise
        return True
