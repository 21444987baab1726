"""Pods: the pods on a node, their eviction through the Eviction API, force delete, slurmd pods.

What a drain may skip is decided here from the pod itself: DaemonSet-owned pods, mirror
(static) pods and pods in a never-drained namespace are not returned as work; terminating
pods are returned marked so. An eviction refused by a PodDisruptionBudget is a
``TransientError(reason=Reason.PDB)`` naming the pod and the budget's own message, so the step
retries it until its deadline and the escalation says what blocked it. A pod selected by more
than one budget is refused on every try, not with an error status but with HTTP 201 and a Failure
Status of code 500 (``eviction.go`` returns it with a nil error, ``handlers/create.go`` writes it
as a create's 201; client-go's ``Result.Into`` makes it an error, this client raises only on a
non-2xx status line): so the answer's body is read, and that refusal is a
``PermanentError(reason=Reason.PDB)`` naming the budgets.
"""

from __future__ import annotations

import json
from collections.abc import Collection, Mapping
from typing import Any

from kubernetes.aio import client

from bot.domain.nodemap import SLINKY_SCALING_MODE, SlurmdPod
from bot.engine.errors import PermanentError, Reason, TransientError
from bot.engine.ports import PodRef
from bot.integrations.kubernetes.client import call, refusal, status_of

MIRROR_ANNOTATION = "kubernetes.io/config.mirror"
#: The API server's message for a pod under two or more PodDisruptionBudgets (pod/storage/eviction.go).
MULTIPLE_BUDGETS = "more than one PodDisruptionBudget"


def selects(selector: client.V1LabelSelector | None, labels: Mapping[str, str]) -> bool:
    """A label selector over ``labels`` (a null selector selects nothing, an empty one everything)."""
    if selector is None:
        return False
    if any(labels.get(k) != v for k, v in (selector.match_labels or {}).items()):
        return False
    for expr in selector.match_expressions or []:
        present, value, values = expr.key in labels, labels.get(expr.key), expr.values or []
        ok = {
            "In": present and value in values,
            "NotIn": not present or value not in values,
            "Exists": present,
            "DoesNotExist": not present,
        }.get(expr.operator, False)
        if not ok:
            return False
    return True


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
        nodeset_replica=bool(controller and controller.kind == "NodeSet")
        and (meta.labels or {}).get(SLINKY_SCALING_MODE) == "StatefulSet",
    )


class Pods:
    def __init__(self, api: client.ApiClient, *, never_drain: Collection[str], timeout: float) -> None:
        self._core = client.CoreV1Api(api)
        self._policy = client.PolicyV1Api(api)
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
            answer = await call(
                f"evict pod {pod.ref}",
                self._core.create_namespaced_pod_eviction_with_http_info(
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
            return
        await self._refused(pod, answer.raw_data)

    async def _refused(self, pod: PodRef, raw: bytes) -> None:
        """Raise the refusal a 2xx eviction answer carries: a ``metav1.Status`` whose status is not
        ``Success`` (the client parses the body as a ``V1Eviction``, so its raw bytes are read)."""
        try:
            status = json.loads(raw or b"{}")
        except ValueError:
            return  # not a Status: nothing says the eviction was refused
        if (
            not isinstance(status, dict)
            or status.get("kind") != "Status"
            or status.get("status") == "Success"
        ):
            return
        if MULTIPLE_BUDGETS in str(status.get("message")):
            names = ", ".join(await self._budgets_of(pod)) or "their names could not be read"
            raise PermanentError(
                f"eviction of pod {pod.ref} refused: it is selected by more than one "
                f"PodDisruptionBudget ({names}), which the Eviction API does not support; "
                "narrow their selectors so one budget covers it",
                reason=Reason.PDB,
            )
        code = status.get("code")
        raise refusal(code if isinstance(code, int) else 0, status, f"evict pod {pod.ref}", "Failure")

    async def _budgets_of(self, pod: PodRef) -> list[str]:
        """The PodDisruptionBudgets in the pod's namespace whose selector selects it."""
        listed: Any = await call(
            f"list pods named {pod.ref}",
            self._core.list_namespaced_pod(
                pod.namespace, field_selector=f"metadata.name={pod.name}", _request_timeout=self._timeout
            ),
        )
        if not listed.items:
            return []
        labels = listed.items[0].metadata.labels or {}
        budgets: Any = await call(
            f"list PodDisruptionBudgets in {pod.namespace}",
            self._policy.list_namespaced_pod_disruption_budget(pod.namespace, _request_timeout=self._timeout),
        )
        return [
            b.metadata.name for b in budgets.items if selects(b.spec.selector if b.spec else None, labels)
        ]

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
