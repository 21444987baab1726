"""What Karpenter's termination controller reads on a deleted NodeClaim's Node, for the emulator.

kubernetes-sigs/karpenter ``pkg/controllers/node/termination``: once a NodeClaim is deleted its Node
is tainted ``karpenter.sh/disrupted:NoSchedule`` and drained (``terminator.Drain``): every pod
waiting eviction (``pod.IsWaitingEviction``: not terminal, not a mirror pod, not tolerating that
taint) is evicted through the Eviction API, which honours PodDisruptionBudgets, except a pod whose
``karpenter.sh/do-not-disrupt`` is active, which is left where it is (``IsEvictable``; the queue
retries it, ``eviction.go``): "true", or from v1.12 a Go duration ("5m", "1h"), active until the
pod's ``status.startTime`` plus it (for ever without a start time); any other value counts as no
annotation (``pkg/utils/pod/scheduling.go`` ``IsDoNotDisruptActive``, ``parseDoNotDisrupt``; up to
v1.11 ``HasDoNotDisrupt``: "true" only). The drain waits until none is left, requeued every second
(``awaitDrain``), saying on the Node a Warning ``FailedDraining``: "Failed to drain node, N pods are
waiting to be evicted" as it hands the pods to its eviction queue, and per PDB refusal "Failed to
drain node, evicting pod violates a PDB (Pod=<ns>/<name>)" (v1.0-v1.4: "evicting pod <ns>/<name>
violates a PDB"). Karpenter's recorder keeps one event per reason and node every two minutes
(``pkg/events/recorder.go``: dedupe key reason + ``DedupeValues``, the node's name, default timeout
2 min), so the refusal, coming after the "waiting" one, is mostly never said. Only a NodeClaim with ``spec.terminationGracePeriod`` has an end to that wait:
its lifecycle controller writes ``karpenter.sh/nodeclaim-termination-timestamp`` (deletion time +
the period, ``ensureTerminationGracePeriodTerminationTimeAnnotation``), and once a pod's own grace
would run past it the pod is deleted regardless of its budget and annotation (``needsForceDelete``,
``forceDelete``). Without it the Node, its NodeClaim (finalizer ``karpenter.sh/termination``) and
the instance stay.

After the drain it waits for the node's VolumeAttachments (of a PersistentVolume) to be deleted, by
Kubernetes' attach-detach controller, requeued every second, with no end but the termination time
(``awaitVolumeDetachment``; from v1.6 said on the NodeClaim as condition ``VolumesDetached``
Unknown, reason ``AwaitingVolumeDetachment``, and on the Node as a Normal event of that reason;
True once none is left, False ``TerminationGracePeriodElapsed`` when it stops waiting). Not
modelled: the attachments of pods it does not drain, which it does not wait for.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from bot.domain.durations import parse_go_duration

DISRUPTED = "karpenter.sh/disrupted"
DO_NOT_DISRUPT = "karpenter.sh/do-not-disrupt"
TERMINATION_TIMESTAMP = "karpenter.sh/nodeclaim-termination-timestamp"
FINALIZER = "karpenter.sh/termination"
MIRROR = "kubernetes.io/config.mirror"


def duration(text: str) -> timedelta:
    """A Go ``time.Duration`` string (``time.ParseDuration``): ``1h0m0s``, ``5m``, ``1.5h``, ``0``."""
    return parse_go_duration(text)


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


VOLUMES_DETACHED = "VolumesDetached"


def set_condition(claim: dict[str, Any], kind: str, status: str, reason: str) -> bool:
    """Set a status condition on ``claim`` as Karpenter's status library does (``lastTransitionTime``
    moves only when the status changes); whether anything changed."""
    conditions = claim.setdefault("status", {}).setdefault("conditions", [])
    now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    found = next((c for c in conditions if c.get("type") == kind), None)
    if found is None:
        conditions.append(
            {"type": kind, "status": status, "reason": reason, "message": reason, "lastTransitionTime": now}
        )
        return True
    if (found.get("status"), found.get("reason")) == (status, reason):
        return False
    if found.get("status") != status:
        found["lastTransitionTime"] = now
    found.update(status=status, reason=reason, message=reason)
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


def do_not_disrupt(pod: dict[str, Any], now: datetime) -> bool:
    """``IsDoNotDisruptActive`` (v1.12+): "true"; a positive Go duration until the pod's start plus
    it (no start time: active); anything else is no annotation."""
    value = (pod["metadata"].get("annotations") or {}).get(DO_NOT_DISRUPT)
    if value is None:
        return False
    if value == "true":
        return True
    try:
        period = duration(value)
    except ValueError:
        return False
    if period <= timedelta(0):
        return False
    started = (pod.get("status") or {}).get("startTime")
    if not started:
        return True
    return now - datetime.strptime(started, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC) < period
