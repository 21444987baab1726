"""Pods: the pods on a node, their eviction through the Eviction API, force delete, slurmd pods.

What a drain may skip is decided here from the pod itself: DaemonSet-owned pods, mirror
(static) pods and pods in a never-drained namespace are not returned as work; terminating
pods are returned marked so. An eviction refused by a PodDisruptionBudget is a
``TransientError(reason=Reason.PDB)`` naming the pod and the budget's own message, so the step
retries it until its deadline and the escalation says what blocked it.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping

from kubernetes.aio import client

from bot.domain.nodemap import SlurmdPod
from bot.engine.errors import PermanentError, Reason, TransientError
from bot.engine.ports import PodRef
from bot.integrations.kubernetes.client import call, status_of

MIRROR_ANNOTATION = "kubernetes.io/config.mirror"


def pod_ref(pod: client.V1Pod) -> PodRef:
    meta = pod.metadata
    owners = meta.owner_references or []
    controller = next((o for o in owners if o.controller), owners[0] if owners else None)
    return PodRef(
        namespace=meta.namespace,
        name=meta.name,
        owner_kind=controller.kind if controller else None,
        mirror=MIRROR_ANNOTATION in (meta.annotations or {}),
        terminating=meta.deletion_timestamp is not None,
    )


class Pods:
    def __init__(self, api: client.ApiClient, *, never_drain: Collection[str], timeout: float) -> None:
        self._core = client.CoreV1Api(api)
        self._never = frozenset(never_drain)
        self._timeout = timeout

    async def on_node(self, node: str) -> list[PodRef]:
        """Every pod bound to ``node`` outside the never-drained namespaces (ordered as listed)."""
        listed = await call(
            f"list pods on {node}",
            self._core.list_pod_for_all_namespaces(
                field_selector=f"spec.nodeName={node}", _request_timeout=self._timeout
            ),
        )
        return [pod_ref(p) for p in listed.items if p.metadata.namespace not in self._never]

    async def workload_on_node(self, node: str) -> list[PodRef]:
        """Pods a drain must move: not DaemonSet, not mirror, not already terminating."""
        return [
            p
            for p in await self.on_node(node)
            if not p.mirror and p.owner_kind != "DaemonSet" and not p.terminating
        ]

    async def evict(self, pod: PodRef) -> None:
        if pod.namespace in self._never:
            raise PermanentError(f"pod {pod.ref} is in a never-drained namespace", reason=Reason.NOT_ALLOWED)
        body = client.V1Eviction(
            api_version="policy/v1",
            kind="Eviction",
            metadata=client.V1ObjectMeta(name=pod.name, namespace=pod.namespace),
        )
        try:
            await call(
                f"evict pod {pod.ref}",
                self._core.create_namespaced_pod_eviction(
                    pod.name, pod.namespace, body, _request_timeout=self._timeout
                ),
            )
        except TransientError as exc:
            cause = exc.__cause__
            if exc.reason == Reason.RATE_LIMITED and cause is not None:
                status = status_of(cause)
                budget = "; ".join(
                    c.get("message", "") for c in (status.get("details") or {}).get("causes", [])
                )
                raise TransientError(
                    f"eviction of pod {pod.ref} refused by its PodDisruptionBudget: {budget or exc}",
                    reason=Reason.PDB,
                    retry_after=exc.retry_after,
                ) from cause
            raise
        except PermanentError as exc:
            if exc.reason != Reason.NOT_FOUND:  # already gone: what the eviction wanted
                raise

    async def delete(self, pod: PodRef, *, force: bool) -> None:
        grace = 0 if force else None
        try:
            await call(
                f"delete pod {pod.ref}",
                self._core.delete_namespaced_pod(
                    pod.name, pod.namespace, grace_period_seconds=grace, _request_timeout=self._timeout
                ),
            )
        except PermanentError as exc:
            if exc.reason != Reason.NOT_FOUND:
                raise

    async def slurmd(self, namespace: str, selector: Mapping[str, str]) -> list[SlurmdPod]:
        listed = await call(
            f"list slurmd pods in {namespace}",
            self._core.list_namespaced_pod(
                namespace,
                label_selector=",".join(f"{k}={v}" for k, v in selector.items()),
                _request_timeout=self._timeout,
            ),
        )
        return [
            SlurmdPod(
                name=p.metadata.name,
                node_name=p.spec.node_name,
                hostname=p.spec.hostname,
                labels=dict(p.metadata.labels or {}),
                namespace=p.metadata.namespace,
            )
            for p in listed.items
        ]
