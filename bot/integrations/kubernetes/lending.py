"""Lending: a pool node taken for a stalled gang job, relabelled into its NodeSet, and given back exactly.

A take is one merge patch guarded by the node's ``resourceVersion``: the incident's mark and
what the node was before (``bot.domain.ownership.lent_marks``), the pool's labels removed, and
for a lender the cordon (no new pod lands while its pods are evicted), so the node is never
half-taken and a resumed take finds its own mark and writes nothing. Once the node is free, its
join is another: the labels that make the Slinky NodeSet select it, and the take's cordon
lifted, since slurm-operator runs no NodeSet pod on a cordoned node and drains the Slurm node of
one (its NodeSet controller's cordon sync); the pool's labels stay off, so the pool's workloads
do not come back. A give-back restores only the labels and cordon the take recorded; a node lent
to another incident, or carrying no readable record, is left as it is.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from kubernetes.aio import client

from bot.domain.ownership import (
    LENT_ANNOTATION,
    LENT_PRIOR_ANNOTATION,
    LentPrior,
    lent_marks,
    lent_prior,
    lent_to,
)
from bot.engine.errors import PermanentError, Reason, TransientError
from bot.engine.ports import ClusterNode, Lend
from bot.integrations.kubernetes.nodes import CONFLICT_RETRIES, Nodes

_UNMARK: dict[str, str | None] = {LENT_ANNOTATION: None, LENT_PRIOR_ANNOTATION: None}


class Lending:
    def __init__(self, nodes: Nodes) -> None:
        self._nodes = nodes

    async def pool_nodes(self, selector: str) -> list[ClusterNode]:
        return await self._nodes.fleet_facts(selector)

    async def lend(self, name: str, lend: Lend) -> bool:
        for _ in range(CONFLICT_RETRIES):
            node = await self._node(name)
            meta = node.metadata
            owner = lent_to(meta.annotations or {})
            if owner == lend.incident_id:
                return False  # a resumed take: this incident's patch is already on the node
            if owner is not None:
                raise PermanentError(f"node {name} is lent to incident {owner}", reason=Reason.CONFLICT)
            labels = meta.labels or {}
            keys = dict.fromkeys([*lend.leave, *lend.join])
            was = bool(node.spec and node.spec.unschedulable)
            prior = LentPrior({k: labels.get(k) for k in keys}, was if lend.cordon else None, lend.cordon)
            changes: dict[str, str | None] = {k: None for k in lend.leave}
            body: dict[str, Any] = {
                "metadata": {
                    "resourceVersion": meta.resource_version,
                    "labels": changes,
                    "annotations": lent_marks(lend.incident_id, prior),
                }
            }
            if lend.cordon:
                body["spec"] = {"unschedulable": True}
            if await self._nodes.write(name, body, "lend"):
                return True
        raise TransientError(f"lend of {name}: the node kept changing under us", reason=Reason.CONFLICT)

    async def join(self, name: str, labels: Mapping[str, str], *, incident_id: str) -> bool:
        def body(node: client.V1Node, prior: LentPrior | None) -> dict[str, Any]:
            patch: dict[str, Any] = {"metadata": {"labels": dict(labels)}}
            if prior is not None and prior.cordoned and node.spec and node.spec.unschedulable:
                patch["spec"] = {"unschedulable": None}  # the take's cordon: the give-back restores it
            return patch

        return await self._guarded(name, incident_id, body, "join")

    async def lend_back(self, name: str, *, incident_id: str) -> bool:
        return await self._end(name, incident_id, restore_labels=True)

    async def keep_lent(self, name: str, *, incident_id: str) -> bool:
        return await self._end(name, incident_id, restore_labels=False)

    async def _end(self, name: str, incident_id: str, *, restore_labels: bool) -> bool:
        def body(node: client.V1Node, prior: LentPrior | None) -> dict[str, Any]:
            if prior is None:
                raise PermanentError(
                    f"node {name}: the record of what the take changed is unreadable; left as it is",
                    reason=Reason.CONFLICT,
                )
            patch: dict[str, Any] = {"metadata": {"annotations": _UNMARK}}
            if restore_labels:
                patch["metadata"]["labels"] = dict(prior.labels)
            if prior.cordoned:
                patch["spec"] = {"unschedulable": prior.unschedulable or None}
            return patch

        return await self._guarded(name, incident_id, body, "give back")

    async def _guarded(
        self,
        name: str,
        incident_id: str,
        body: Callable[[client.V1Node, LentPrior | None], dict[str, Any]],
        what: str,
    ) -> bool:
        """One merge patch (``body`` of the node read and what its take recorded) on a node lent to
        ``incident_id``, guarded by the ``resourceVersion`` read; ``False`` if the node is not lent
        to it (nothing written)."""
        for _ in range(CONFLICT_RETRIES):
            node = await self._nodes.read(name)
            annotations = (node.metadata.annotations or {}) if node else {}
            if node is None or lent_to(annotations) != incident_id:
                return False
            patch = body(node, lent_prior(annotations))
            patch["metadata"]["resourceVersion"] = node.metadata.resource_version
            if await self._nodes.write(name, patch, what):
                return True
        raise TransientError(f"{what} of {name}: the node kept changing under us", reason=Reason.CONFLICT)

    async def _node(self, name: str) -> client.V1Node:
        node = await self._nodes.read(name)
        if node is None:
            raise PermanentError(f"node {name} is not in Kubernetes", reason=Reason.NOT_FOUND)
        return node
