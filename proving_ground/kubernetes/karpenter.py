"""What Karpenter's termination controller reads on a deleted NodeClaim's Node, for the emulator.

kubernetes-sigs/karpenter ``pkg/controllers/node/termination``: once a NodeClaim is deleted its Node
is tainted ``karpenter.sh/disrupted:NoSchedule`` and drained (``terminator.Drain``): every pod
waiting eviction (``pod.IsWaitingEviction``: not terminal, not a mirror pod, not tolerating that
taint) is evicted through the Eviction API, which honours PodDisruptionBudgets, except a pod
annotated ``karpenter.sh/do-not-disrupt: "true"``, which is left where it is (``IsEvictable``; the
queue retries it, ``eviction.go``). The drain waits until none is left, requeued every second
(``awaitDrain``), saying on the Node a Warning ``FailedDraining``: "Failed to drain node, N pods are
waiting to be evicted", and per PDB refusal "Failed to drain node, evicting pod violates a PDB
(Pod=<ns>/<name>)". Only a NodeClaim with ``spec.terminationGracePeriod`` has an end to that wait:
its lifecycle controller writes ``karpenter.sh/nodeclaim-termination-timestamp`` (deletion time +
the period, ``ensureTerminationGracePeriodTerminationTimeAnnotation``), and once a pod's own grace
would run past it the pod is deleted regardless of its budget and annotation (``needsForceDelete``,
``forceDelete``). Without it the Node, its NodeClaim (finalizer ``karpenter.sh/termination``) and
the instance stay.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from typing import Any

DISRUPTED = "karpenter.sh/disrupted"
DO_NOT_DISRUPT = "karpenter.sh/do-not-disrupt"
TERMINATION_TIMESTAMP = "karpenter.sh/nodeclaim-termination-timestamp"
FINALIZER = "karpenter.sh/termination"
MIRROR = "kubernetes.io/config.mirror"


def duration(text: str) -> timedelta:
    """A Go ``time.Duration`` string as the NodeClaim's ``terminationGracePeriod`` holds it (``1h0m0s``)."""
    units = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 0.001}
    parts = re.findall(r"([0-9.]+)(ms|h|m|s)", text)
    if not parts:
        raise ValueError(f"not a duration: {text!r}")
    return timedelta(seconds=sum(float(n) * units[u] for n, u in parts))


def termination_time(claim: dict[str, Any]) -> datetime | None:
    """When Karpenter stops waiting for the drain: the annotation, else none (it waits for ever)."""
    stamp = (claim["metadata"].get("annotations") or {}).get(TERMINATION_TIMESTAMP)
    return datetime.strptime(stamp, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC) if stamp else None


def annotate_termination_time(claim: dict[str, Any]) -> bool:
    """Write the termination timestamp on a deleting NodeClaim with a grace period; whether written."""
    meta = claim["metadata"]
    period = (claim.get("spec") or {}).get("terminationGracePeriod")
    annotations = meta.setdefault("annotations", {})
    if not period or not meta.get("deletionTimestamp") or TERMINATION_TIMESTAMP in annotations:
        return False
    deleted = datetime.strptime(meta["deletionTimestamp"], "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC)
    annotations[TERMINATION_TIMESTAMP] = (deleted + duration(period)).strftime("%Y-%m-%dT%H:%M:%SZ")
    return True


def waiting_eviction(pod: dict[str, Any]) -> bool:
    """``IsWaitingEviction``: a pod the drain waits for. Not one stuck terminating, a minute past its
    ``deletionTimestamp`` (``IsStuckTerminating``)."""
    meta, spec = pod["metadata"], pod.get("spec") or {}
    if (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
        return False
    if meta.get("deletionTimestamp"):
        deleting = datetime.strptime(meta["deletionTimestamp"], "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC)
        if datetime.now(UTC) - deleting > timedelta(minutes=1):
            return False
    if MIRROR in (meta.get("annotations") or {}):
        return False
    return not any(
        (t.get("key") == DISRUPTED or (not t.get("key") and t.get("operator") == "Exists"))
        for t in spec.get("tolerations") or []
    )


def do_not_disrupt(pod: dict[str, Any]) -> bool:
    return (pod["metadata"].get("annotations") or {}).get(DO_NOT_DISRUPT) == "true"
