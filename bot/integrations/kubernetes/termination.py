"""Whether Karpenter can finish taking away the node a replacement deleted the NodeClaim of.

After pitcrew deletes the old NodeClaim, Karpenter's termination controller (kubernetes-sigs/karpenter
``pkg/controllers/node/termination``) taints its Node ``karpenter.sh/disrupted`` and drains it before
the instance is terminated and the finalizers (``karpenter.sh/termination``) let the Node and the
NodeClaim go. The drain evicts through the Eviction API and never evicts a pod annotated
``karpenter.sh/do-not-disrupt: "true"`` (``pod.IsEvictable``); a PodDisruptionBudget that allows no
eviction refuses it, which Karpenter says on the Node as a Warning ``FailedDraining``: "Failed to
drain node, evicting pod violates a PDB (Pod=<ns>/<name>)" (``terminator/eviction.go``). Only a
NodeClaim with ``spec.terminationGracePeriod`` ends that wait: its termination time, annotated
``karpenter.sh/nodeclaim-termination-timestamp``, is when such pods are deleted regardless
(``needsForceDelete``). Until then the old node stays, its instance running and billed, and no one
is told: this module says so, read only. It never holds the successor or the incident up.
"""

from __future__ import annotations

import re

from kubernetes.aio import client

from bot.integrations.kubernetes.client import call
from bot.integrations.kubernetes.events import NAMESPACE as NODE_EVENTS
from bot.integrations.kubernetes.pods import MIRROR_ANNOTATION
from bot.integrations.kubernetes.replace import (
    DO_NOT_DISRUPT,
    KARPENTER,
    KARPENTER_COMPONENT,
    Handle,
    deleting,
    node_of,
)

#: On a deleting NodeClaim with ``spec.terminationGracePeriod``: when its pods are deleted regardless.
TERMINATION_TIMESTAMP = "karpenter.sh/nodeclaim-termination-timestamp"
#: The pod Karpenter's ``FailedDraining`` names when a budget refused its eviction (serrors.Wrap).
_REFUSED = re.compile(
    r"violates a PDB \(Pod=([^/\s)]+)/([^\s)]+)\)|multiple PDBs \(Pod=([^/\s)]+)/([^\s)]+)\)"
)


class Termination:
    def __init__(self, api: client.ApiClient, *, timeout: float) -> None:
        self._core = client.CoreV1Api(api)
        self._custom = client.CustomObjectsApi(api)
        self._timeout = timeout

    async def held(self, name: str, *, handle: str) -> str | None:
        """Why Karpenter cannot finish terminating the node whose NodeClaim the replacement
        ``handle`` of ``name`` deleted: the pods on it it may not evict, each with why, and whether
        its grace period ends that; ``None`` when nothing holds it (or not a Karpenter replacement)."""
        parsed = Handle.parse(handle)
        if parsed is None or parsed.strategy != "karpenter":
            return None
        claim_name = parsed.target.removeprefix("nodeclaim/")
        listed = await call(
            f"list NodeClaim {claim_name}",
            self._custom.list_cluster_custom_object(
                *KARPENTER, field_selector=f"metadata.name={claim_name}", _request_timeout=self._timeout
            ),
        )
        claim = next((c for c in listed["items"] if c["metadata"]["name"] == claim_name), None)
        if claim is None or not deleting(claim):
            return None
        node = node_of(claim) or name
        pods = (
            await call(
                f"list pods on {node}",
                self._core.list_pod_for_all_namespaces(
                    field_selector=f"spec.nodeName={node}", _request_timeout=self._timeout
                ),
            )
        ).items
        standing = {
            f"{p.metadata.namespace}/{p.metadata.name}": p
            for p in pods
            if p.metadata.deletion_timestamp is None
            and (p.status.phase if p.status else None) not in ("Succeeded", "Failed")
            and MIRROR_ANNOTATION not in (p.metadata.annotations or {})
        }
        why = {
            ref: f"annotated {DO_NOT_DISRUPT}"
            for ref, p in standing.items()
            if (p.metadata.annotations or {}).get(DO_NOT_DISRUPT) == "true"
        }
        for ref in await self._refused(node, parsed):
            if ref in standing:
                why.setdefault(ref, "its PodDisruptionBudget allows no eviction")
        if not why:
            return None
        until = (claim["metadata"].get("annotations") or {}).get(TERMINATION_TIMESTAMP)
        end = (
            f"Karpenter deletes them regardless at {until} (the NodeClaim's terminationGracePeriod)"
            if until
            else "the NodeClaim has no spec.terminationGracePeriod, so Karpenter waits for them for ever"
        )
        pods_said = "; ".join(f"pod {ref} ({reason})" for ref, reason in sorted(why.items()))
        return (
            f"Karpenter cannot finish terminating the old node {node} (NodeClaim {claim_name} deleting, "
            f"finalizer karpenter.sh/termination): it may not evict {pods_said}; {end}. Until then "
            "the node and its instance stay, its GPUs billed: move or delete those pods, or lift the "
            "annotation or budget"
        )

    async def _refused(self, node: str, parsed: Handle) -> list[str]:
        """The pods Karpenter's ``FailedDraining`` on the Node, since the replacement began, says a
        budget refused to let it evict."""
        listed = await call(
            f"list events of node {node}",
            self._core.list_namespaced_event(
                NODE_EVENTS,
                field_selector=f"involvedObject.kind=Node,involvedObject.name={node},reason=FailedDraining",
                _request_timeout=self._timeout,
            ),
        )
        refs = []
        for event in listed.items:
            component = event.reporting_component or (event.source and event.source.component) or ""
            when = event.last_timestamp or event.event_time or event.first_timestamp
            if KARPENTER_COMPONENT not in component or when is None or when < parsed.since:
                continue
            for match in _REFUSED.finditer(str(event.message or "")):
                namespace, pod = match.group(1) or match.group(3), match.group(2) or match.group(4)
                refs.append(f"{namespace}/{pod}")
        return refs
