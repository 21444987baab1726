"""Whether Karpenter or Cluster API can finish taking away the node a replacement deleted the
NodeClaim or Machine of.

After pitcrew deletes the old NodeClaim, Karpenter's termination controller (kubernetes-sigs/karpenter
``pkg/controllers/node/termination``) taints its Node ``karpenter.sh/disrupted`` and drains it before
the instance is terminated and the finalizers (``karpenter.sh/termination``) let the Node and the
NodeClaim go. The drain (``terminator.Drain``) waits on every pod ``IsWaitingEviction`` (not
terminal, not a mirror pod, not tolerating the taint, not stuck terminating a minute past its
``deletionTimestamp``), handing them tier by tier (non-critical non-DaemonSet first) to its
eviction queue, which evicts through the Eviction API and never evicts a pod whose
``karpenter.sh/do-not-disrupt`` is active (``pkg/utils/pod`` ``IsEvictable``): "true", or from
v1.12 a Go duration ("5m") counted from the pod's ``status.startTime`` (``IsDoNotDisruptActive``;
up to v1.11 ``HasDoNotDisrupt``, "true" only). A PodDisruptionBudget that allows no eviction refuses
it, said on the Node as a Warning ``FailedDraining`` naming the pod, "Failed to drain node, evicting
pod violates a PDB (Pod=<ns>/<name>)" (v1.5+; v1.0-v1.4 "evicting pod <ns>/<name> violates a PDB";
``terminator/eviction.go``) — but Karpenter's recorder keeps one event per reason and node every two
minutes (``pkg/events/recorder.go``, ``DedupeValues`` the node's name), and the drain's own "N pods
are waiting to be evicted", said as it hands the pods over, comes first: the refusal is mostly never
said. So a pod the drain should have evicted, still standing a minute after the NodeClaim's delete
while nothing on the node terminates, is one it cannot evict. After the drain it waits for the
node's VolumeAttachments to be deleted (``awaitVolumeDetachment``; from v1.6 the NodeClaim's
condition ``VolumesDetached`` Unknown, reason ``AwaitingVolumeDetachment``), which Kubernetes'
attach-detach controller does once the volumes are unmounted, or after six minutes from an
unhealthy node (``ReconcilerMaxWaitForUnmountDuration``); past those six minutes it is said too.
Only a NodeClaim with ``spec.terminationGracePeriod`` ends those waits: its termination time,
annotated ``karpenter.sh/nodeclaim-termination-timestamp``, is when such pods are deleted
regardless (``needsForceDelete``) and the volumes no longer waited for. Until then the old node
stays, its instance running and billed, and no one is told: this module says so, read only. It
never holds the successor or the incident up.

After pitcrew deletes the old Machine, Cluster API's Machine controller (kubernetes-sigs/cluster-api
``internal/controllers/machine/machine_controller.go`` ``reconcileDelete``) waits for any pre-drain
hook annotation, cordons and drains the Node itself (``drainNode``: DaemonSet and mirror pods
skipped, the rest evicted through the Eviction API, budgets honoured), waits for its volumes to
detach (``shouldWaitForNodeVolumes``) and for any pre-terminate hook before it deletes the
infrastructure and lets the Machine go (finalizer ``machine.cluster.x-k8s.io``). The drain ends only
with ``nodeDrainTimeout`` (v1beta2 ``spec.deletion.nodeDrainTimeoutSeconds``) past
``status.deletion.nodeDrainStartTime`` (``nodeDrainTimeoutExceeded``), the volume wait with
``nodeVolumeDetachTimeout``; both unset by default, so it waits for ever; a hook has no timeout.
From v1.9 (the drain rewritten in ``internal/controllers/machine/drain``) the v1beta2 ``Deleting``
condition says which, its reason ``WaitingForPreDrainHook``, ``DrainingNode``,
``WaitingForVolumeDetach`` or ``WaitingForPreTerminateHook`` and its message the pods, one line per
kind (``EvictionResult.ConditionMessage``: "* Pod <ns>/<name>: cannot evict pod as it would violate
the pod's disruption budget. <cause>"). It is in ``status.v1beta2.conditions`` as v1beta1 serves it
(v1.9-v1.10, and beside v1beta2 to v1.15) and ``status.conditions`` as v1beta2 does (v1.11+); it
wins over the v1beta1 conditions written beside it, so a hold is told once. Before v1.9
(``release-1.8`` ``reconcileDelete``) only v1beta1 conditions say it, in ``status.conditions``:
``PreDrainDeleteHookSucceeded`` / ``PreTerminateDeleteHookSucceeded`` False ``WaitingExternalHook``
(no message), ``DrainingSucceeded`` False ``Draining`` ("Draining the node before deletion", set
once: its time is the drain's start, as there is no ``status.deletion`` before v1.9; a failed drain,
a budget's refusal included, is only logged, "Drain failed, retry in 20s") or ``DrainingFailed``
(the Node's get or cordon failed), ``VolumeDetachSucceeded`` False ``WaitingForVolumeDetach``
(its time the wait's start); the pods the drain cannot evict are those still on the node, not
DaemonSet, mirror or finished pods, a minute into it. The same bounds tell each.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, Literal

from kubernetes.aio import client

from bot.domain.durations import parse_go_duration
from bot.engine.ports import OldNodeLook
from bot.integrations.kubernetes.client import call
from bot.integrations.kubernetes.events import NAMESPACE as NODE_EVENTS
from bot.integrations.kubernetes.pods import MIRROR_ANNOTATION, pod_ref
from bot.integrations.kubernetes.replace import (
    DO_NOT_DISRUPT,
    KARPENTER,
    Handle,
    Replacer,
    deleting,
    karpenter_said,
    node_of,
)

#: On a deleting NodeClaim with ``spec.terminationGracePeriod``: when its pods are deleted regardless.
TERMINATION_TIMESTAMP = "karpenter.sh/nodeclaim-termination-timestamp"
#: The taint Karpenter's termination puts on the Node; a pod tolerating it is not drained.
DISRUPTED = "karpenter.sh/disrupted"
#: The pod Karpenter's ``FailedDraining`` names when a budget refused its eviction: v1.5+
#: (serrors.Wrap: "... (Pod=<ns>/<name>)") and v1.0-v1.4 ("evicting pod <ns>/<name> violates a PDB").
_REFUSED = re.compile(
    r"(?:violates a PDB|multiple PDBs) \(Pod=(?P<ns>[^/\s)]+)/(?P<pod>[^\s)]+)\)"
    r"|evicting pod (?P<ns_old>[^/\s]+)/(?P<pod_old>\S+) violates a PDB"
)
#: Karpenter hands every pod it may evict to its eviction queue at once; one standing this long
#: after the NodeClaim's delete, with nothing on the node terminating, is one it cannot evict.
STALLED = timedelta(minutes=1)
#: kube-controller-manager's attach-detach controller force-detaches from an unhealthy node after
#: ``ReconcilerMaxWaitForUnmountDuration``; a wait for detachment longer than that is not its own.
DETACH_BOUND = timedelta(minutes=6)
_CRITICAL = ("system-cluster-critical", "system-node-critical")
#: Cluster API: a delete lifecycle hook (``pre-drain.delete.hook…``, ``pre-terminate.delete.hook…``)
#: is its owner's to remove, with no timeout; one still holding the Machine this long after its
#: delete is told.
HOOK_BOUND = timedelta(minutes=10)
#: Cluster API: a pod on a reachable node whose ``deletionTimestamp`` is set but which is still
#: there this far into the drain holds it for ever (it skips such pods only on an unreachable node).
TERMINATING_BOUND = timedelta(minutes=10)
#: The lines of Cluster API's drain message (``EvictionResult.ConditionMessage``) that say a pod it
#: cannot evict (a budget's refusal, any other eviction error) or waits to complete without eviction.
_BLOCKED_LINE = re.compile(
    r"^\* (?:Pods? .*: (?:cannot evict pod|failed to evict Pod, |waiting for completion)|\d+ Pods? with other issues)"
)
_TERMINATING_LINE = re.compile(r"^\* Pods? .*: deletionTimestamp set, but still not removed from the Node$")


class Termination:
    def __init__(self, api: client.ApiClient, replacer: Replacer, *, timeout: float) -> None:
        self._core = client.CoreV1Api(api)
        self._custom = client.CustomObjectsApi(api)
        self._replacer = replacer
        self._timeout = timeout

    async def held(self, name: str, *, handle: str) -> OldNodeLook:
        """Whether Karpenter has taken away the node whose NodeClaim the replacement ``handle`` of
        ``name`` deleted (gone: nothing more to look at, nor for a replacement not Karpenter's), and
        if not, why it cannot finish: the pods on it it cannot evict, each with why, or volumes it
        waits for past the attach-detach controller's bound, and whether its grace period ends that."""
        parsed = Handle.parse(handle)
        if parsed is not None and parsed.strategy == "cluster-api":
            return await self._machine_held(name, parsed)
        if parsed is None or parsed.strategy != "karpenter":
            return OldNodeLook(gone=True)
        claim_name = parsed.target.removeprefix("nodeclaim/")
        listed = await call(
            f"list NodeClaim {claim_name}",
            self._custom.list_cluster_custom_object(
                *KARPENTER, field_selector=f"metadata.name={claim_name}", _request_timeout=self._timeout
            ),
        )
        claim = next((c for c in listed["items"] if c["metadata"]["name"] == claim_name), None)
        if claim is None:
            return OldNodeLook(gone=True)
        if not deleting(claim):
            return OldNodeLook()
        node, now = node_of(claim) or name, datetime.now(UTC)
        deleted = _time(claim["metadata"]["deletionTimestamp"])
        holds = await self._pods_held(node, parsed, now - deleted >= STALLED, now)
        if holds:
            what = "it may not evict " + "; ".join(f"pod {ref} ({why})" for ref, why in sorted(holds.items()))
            regardless = "Karpenter deletes them regardless"
            remedy = "move or delete those pods, or lift the annotation or budget"
        else:
            waiting = _awaiting_volumes(claim, now)
            if waiting is None:
                return OldNodeLook()
            what = (
                f"it waits for the node's volumes to detach (NodeClaim condition VolumesDetached "
                f"AwaitingVolumeDetachment since {waiting}; Karpenter's AwaitingVolumeDetachment event on "
                "the Node names the VolumeAttachments), longer than the 6 minutes after which Kubernetes' "
                "attach-detach controller detaches from an unhealthy node"
            )
            regardless = "Karpenter stops waiting for them"
            remedy = "see why the CSI driver does not detach them (its node plugin on the old node)"
        until = (claim["metadata"].get("annotations") or {}).get(TERMINATION_TIMESTAMP)
        end = (
            f"{regardless} at {until} (the NodeClaim's terminationGracePeriod)"
            if until
            else "the NodeClaim has no spec.terminationGracePeriod, so Karpenter waits for them for ever"
        )
        return OldNodeLook(
            held=(
                f"Karpenter cannot finish terminating the old node {node} (NodeClaim {claim_name} "
                f"deleting, finalizer karpenter.sh/termination): {what}; {end}. Until then the node "
                f"and its instance stay, its GPUs billed: {remedy}"
            )
        )

    async def _machine_held(self, name: str, parsed: Handle) -> OldNodeLook:
        """Cluster API's deletion of the Machine the replacement deleted, read once (by name, where
        and as the replacement reads Machines): gone with the Machine; else what its conditions
        say holds it (``_machine_wait``: ``Deleting`` from v1.9, v1beta1 ones before), when that is
        worth telling (``_machine_hold``). Before v1.9 the drain's condition names no pod: a minute
        into it the pods on the node are listed, those its drain still has to see go."""
        found = await self._replacer.old_machine(parsed)
        if found is None:
            return OldNodeLook(gone=True)
        machine_ref, machine = found
        if not deleting(machine):
            return OldNodeLook()
        now = datetime.now(UTC)
        wait = _machine_wait(machine, now)
        if wait is None:
            return OldNodeLook()
        node = ((machine.get("status") or {}).get("nodeRef") or {}).get("name") or name
        left = (
            await self._drained_left(node)
            if wait.kind == "drain" and not wait.v1beta2 and now - wait.started >= STALLED
            else []
        )
        hold = _machine_hold(machine, wait, now, left)
        if hold is None:
            return OldNodeLook()
        what, end, remedy = hold
        return OldNodeLook(
            held=(
                f"Cluster API cannot finish deleting the old node {node} (Machine {machine_ref} "
                f"deleting, finalizer machine.cluster.x-k8s.io): {what}; {end}. Until then the node and "
                f"its instance stay, its GPUs billed: {remedy}"
            )
        )

    async def _pods_on(self, node: str) -> list[Any]:
        """Every pod bound to ``node``, in one list."""
        found = await call(
            f"list pods on {node}",
            self._core.list_pod_for_all_namespaces(
                field_selector=f"spec.nodeName={node}", _request_timeout=self._timeout
            ),
        )
        return list(found.items)

    async def _drained_left(self, node: str) -> list[Any]:
        """The pods on ``node`` Cluster API's drain before v1.9 (the kubectl drain library:
        ``IgnoreAllDaemonSets``, mirror pods skipped) still has to see go: not DaemonSet, not
        mirror, not finished."""
        return [
            p
            for p in await self._pods_on(node)
            if not (found := pod_ref(p)).mirror
            and found.owner_kind != "DaemonSet"
            and (p.status.phase if p.status else None) not in ("Succeeded", "Failed")
        ]

    async def _pods_held(self, node: str, parsed: Handle, stalled: bool, now: datetime) -> dict[str, str]:
        """The pods on ``node`` Karpenter's drain waits on and cannot evict, each with why: an active
        ``do-not-disrupt``; a refusal its ``FailedDraining`` named; or, ``stalled`` (a minute into
        the drain) and nothing on the node terminating, standing in the tier it is evicting."""
        waiting = [p for p in await self._pods_on(node) if _waiting_eviction(p, now)]
        standing = {_ref(p): p for p in waiting if not p.metadata.deletion_timestamp}
        why: dict[str, str] = {}
        for ref, pod in standing.items():
            said = _do_not_disrupt(pod, now)
            if said is not None:
                why[ref] = said
        for ref in await self._refused(node, parsed):
            if ref in standing:
                why.setdefault(
                    ref, "its PodDisruptionBudget allows no eviction, as Karpenter's FailedDraining says"
                )
        if stalled and len(standing) == len(waiting):
            for ref in _first_tier(list(standing.values())):
                why.setdefault(
                    ref,
                    (
                        "not evicted a minute into Karpenter's drain, nothing else on the node terminating: "
                        "the Eviction API refuses it, as a PodDisruptionBudget that allows no eviction does "
                        "(Karpenter's FailedDraining, one per node every 2 minutes, may never name it)"
                    ),
                )
        return why

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
        return [
            f"{match['ns'] or match['ns_old']}/{match['pod'] or match['pod_old']}"
            for _, message in karpenter_said(listed.items, parsed.since)
            for match in _REFUSED.finditer(message)
        ]


def _time(text: str) -> datetime:
    return datetime.strptime(text, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC)


def _waiting_eviction(pod: Any, now: datetime) -> bool:
    """Karpenter's ``IsWaitingEviction``: not terminal, not a mirror pod, not tolerating the
    ``karpenter.sh/disrupted:NoSchedule`` taint, not stuck terminating (a minute past its
    ``deletionTimestamp``, ``IsStuckTerminating``)."""
    if (pod.status.phase if pod.status else None) in ("Succeeded", "Failed"):
        return False
    if MIRROR_ANNOTATION in (pod.metadata.annotations or {}):
        return False
    if pod.metadata.deletion_timestamp is not None and now - pod.metadata.deletion_timestamp > timedelta(
        minutes=1
    ):
        return False
    return not any(_tolerates_disrupted(t) for t in (pod.spec.tolerations if pod.spec else None) or [])


def _tolerates_disrupted(toleration: client.V1Toleration) -> bool:
    """A toleration that tolerates ``karpenter.sh/disrupted:NoSchedule`` (value empty): Kubernetes'
    ``Toleration.ToleratesTaint``."""
    if toleration.effect not in (None, "", "NoSchedule"):
        return False
    if toleration.key in (None, ""):
        return bool(toleration.operator == "Exists")
    if toleration.key != DISRUPTED:
        return False
    return bool(toleration.operator == "Exists" or (toleration.value or "") == "")


def _do_not_disrupt(pod: Any, now: datetime) -> str | None:
    """Why the pod's ``karpenter.sh/do-not-disrupt`` keeps Karpenter from evicting it now
    (``IsDoNotDisruptActive``), or ``None``: "true"; a positive Go duration (v1.12+) until the
    pod's ``status.startTime`` plus it (no start time: for ever); anything else counts as none."""
    value = (pod.metadata.annotations or {}).get(DO_NOT_DISRUPT)
    if value is None:
        return None
    if value == "true":
        return f"annotated {DO_NOT_DISRUPT}"
    try:
        period = parse_go_duration(value)
    except ValueError:
        return None
    if period <= timedelta(0):
        return None
    started = pod.status.start_time if pod.status else None
    if started is None:
        return f"annotated {DO_NOT_DISRUPT}: {value}, which Karpenter v1.12+ honours, the pod's start time unknown"
    if now - started >= period:
        return None
    until = (started + period).strftime("%Y-%m-%dT%H:%M:%SZ")
    return f"annotated {DO_NOT_DISRUPT}: {value}, which Karpenter v1.12+ honours until {until} (its start plus that)"


def _first_tier(pods: Sequence[Any]) -> list[str]:
    """Of ``pods``, those in the first of ``groupPodsByPriority``'s tiers that has any: non-critical
    non-DaemonSet, non-critical DaemonSet, critical non-DaemonSet, critical DaemonSet. Karpenter
    hands a tier to its queue only once the tiers before it are gone."""

    def tier(pod: Any) -> int:
        critical = (pod.spec.priority_class_name if pod.spec else None) in _CRITICAL
        daemon = any(o.kind == "DaemonSet" and o.controller for o in pod.metadata.owner_references or [])
        return 2 * critical + daemon

    first = min((tier(p) for p in pods), default=None)
    return [_ref(p) for p in pods if tier(p) == first]


def _awaiting_volumes(claim: dict[str, Any], now: datetime) -> str | None:
    """Since when the NodeClaim says Karpenter waits for the node's volumes to detach
    (``VolumesDetached`` Unknown, ``AwaitingVolumeDetachment``, Karpenter v1.6+), when that is
    longer than ``DETACH_BOUND``; else ``None``."""
    for condition in (claim.get("status") or {}).get("conditions") or []:
        if (
            condition.get("type") == "VolumesDetached"
            and condition.get("status") == "Unknown"
            and condition.get("reason") == "AwaitingVolumeDetachment"
            and condition.get("lastTransitionTime")
            and now - _time(condition["lastTransitionTime"]) > DETACH_BOUND
        ):
            return str(condition["lastTransitionTime"])
    return None


@dataclass(frozen=True)
class _MachineWait:
    """What ``reconcileDelete`` waits for on a deleting Machine, as its conditions say it:
    ``kind`` (a delete hook, the drain, the volumes' detach), ``said`` (which condition and reason),
    its ``message`` (a v1beta1 hook's: the Machine's hook annotations), when the wait began, and
    whether the v1beta2 ``Deleting`` said it (v1.9+: its drain message names the pods)."""

    kind: Literal["hook", "drain", "volumes"]
    said: str
    message: str
    started: datetime
    v1beta2: bool


#: The v1beta2 ``Deleting`` reasons (v1.9+) of the waits that can hold a deleting Machine for ever.
_DELETING_WAITS: dict[str, Literal["hook", "drain", "volumes"]] = {
    "WaitingForPreDrainHook": "hook",
    "DrainingNode": "drain",
    "WaitingForVolumeDetach": "volumes",
    "WaitingForPreTerminateHook": "hook",
}
#: Before v1.9 (``release-1.8`` ``reconcileDelete``, ``api/v1beta1/condition_consts.go``): the v1beta1
#: conditions the same waits are said in, in the order they come, each False while waited for
#: (``WaitingExternalHook``, ``Draining`` / ``DrainingFailed``, ``WaitingForVolumeDetach``) and True
#: once passed; the drain's and the volumes' ``lastTransitionTime`` is when they began (set once),
#: and their timeout field; a hook's annotation prefix.
_V1BETA1_WAITS: tuple[tuple[str, Literal["hook", "drain", "volumes"], str], ...] = (
    ("PreDrainDeleteHookSucceeded", "hook", "pre-drain.delete.hook.machine.cluster.x-k8s.io"),
    ("DrainingSucceeded", "drain", "nodeDrainTimeout"),
    ("VolumeDetachSucceeded", "volumes", "nodeVolumeDetachTimeout"),
    ("PreTerminateDeleteHookSucceeded", "hook", "pre-terminate.delete.hook.machine.cluster.x-k8s.io"),
)


def _machine_wait(machine: dict[str, Any], now: datetime) -> _MachineWait | None:
    """What holds a deleting Machine, read from whichever conditions its Cluster API release wrote:
    the v1beta2 ``Deleting`` (v1.9+: ``status.v1beta2.conditions`` as v1beta1 serves it,
    ``status.conditions`` as v1beta2 does), which wins wherever it is; else (before v1.9) the last
    of ``_V1BETA1_WAITS`` False (``status.conditions``; from v1.11 served as v1beta2 they are in
    ``status.deprecated.v1beta1.conditions``, beside ``Deleting``), a drain or volume wait whose
    timeout has passed being one Cluster API has moved past. ``None`` when nothing that can hold it
    for ever does."""
    status, meta = machine.get("status") or {}, machine["metadata"]
    deleted = _time(meta["deletionTimestamp"])
    deletion = status.get("deletion") or {}
    # Both lists of conditions: ``status.conditions`` (v1beta1 ones as v1beta1 serves the Machine,
    # v1beta2 ones as v1beta2 does) and ``status.v1beta2.conditions`` (v1beta2 ones, v1beta1 served).
    conditions = [*(status.get("conditions") or []), *((status.get("v1beta2") or {}).get("conditions") or [])]
    deleting = [c for c in conditions if c.get("type") == "Deleting"]
    if deleting:
        said = next(
            (c for c in deleting if c.get("status") == "True" and c.get("reason") in _DELETING_WAITS), None
        )
        if said is None:
            return None
        reason = str(said["reason"])
        kind = _DELETING_WAITS[reason]
        began = {"drain": "nodeDrainStartTime", "volumes": "waitForNodeVolumeDetachStartTime"}.get(kind)
        return _MachineWait(
            kind,
            f"Deleting condition {reason}",
            str(said.get("message") or ""),
            _time(deletion.get(began) or meta["deletionTimestamp"]) if began else deleted,
            v1beta2=True,
        )
    v1beta1 = {
        str(c.get("type")): c
        for c in [
            *conditions,
            *(((status.get("deprecated") or {}).get("v1beta1") or {}).get("conditions") or []),
        ]
    }
    for condition, kind, detail in reversed(_V1BETA1_WAITS):
        said = v1beta1.get(condition)
        if said is None or said.get("status") != "False":
            continue
        reason = str(said.get("reason") or "")
        label = f"v1beta1 condition {condition} False {reason}"
        if kind == "hook":
            hooks = sorted(k for k in meta.get("annotations") or {} if k.startswith(detail))
            return _MachineWait(kind, label, f"hooks: {','.join(hooks)}", deleted, v1beta2=False)
        started = _time(said.get("lastTransitionTime") or meta["deletionTimestamp"])
        timeout = _timeout(machine.get("spec") or {}, detail)
        if timeout is not None and now - started >= timeout:
            continue  # Cluster API has given this wait up and gone on
        if reason == "DrainingFailed":  # the Node's get or its cordon failed; kept till the drain ends
            label += f' ("{said.get("message") or ""}")'
        return _MachineWait(kind, label, str(said.get("message") or ""), started, v1beta2=False)
    return None


def _machine_hold(
    machine: dict[str, Any], wait: _MachineWait, now: datetime, left: Sequence[Any] = ()
) -> tuple[str, str, str] | None:
    """What holds a deleting Machine, in Cluster API's words, with when (if ever) it ends and what
    to do, or ``None`` while nothing worth telling does. ``reconcileDelete`` (machine_controller.go)
    waits, in order, for pre-drain hooks, the drain (``drainNode``; skipped with the
    ``exclude-node-draining`` annotation or once ``nodeDrainTimeout`` has passed since it began),
    the volumes to detach (``shouldWaitForNodeVolumes``; likewise ``nodeVolumeDetachTimeout``) and
    pre-terminate hooks, before it deletes the infrastructure; it says which in its conditions
    (``_machine_wait``). Its drain evicts every pod at once, evictions still under way: a pod it
    cannot evict (a budget's refusal) or waits to complete is told ``STALLED`` into the drain, one
    still terminating ``TERMINATING_BOUND`` into it; volumes ``DETACH_BOUND`` into their wait; a hook
    ``HOOK_BOUND`` after the delete. The drain's pods are its message's lines from v1.9; before,
    its message names none (a refused eviction is only logged, "Drain failed, retry in 20s"), so
    they are ``left``, the pods on the node the kubectl drain library evicts (not DaemonSet, not
    mirror, not finished): not deleting, refused; deleting, still terminating."""
    spec = machine.get("spec") or {}
    if wait.kind == "hook":
        if now - wait.started < HOOK_BOUND:
            return None
        quoted = f': "{wait.message}"' if wait.v1beta2 else f" ({wait.message})"
        return (
            f"it waits for its delete hooks, as its {wait.said} says{quoted}",
            "no timeout applies to a hook, so Cluster API waits for ever",
            "see why the controller that set each hook annotation on the Machine does not remove it",
        )
    if wait.kind == "drain":
        if wait.v1beta2:
            lines = wait.message.splitlines()
            refused = [line.removeprefix("* ") for line in lines if _BLOCKED_LINE.match(line)]
            terminating = [line.removeprefix("* ") for line in lines if _TERMINATING_LINE.match(line)]
        else:
            refused = [
                f"Pod {_ref(p)}: not evicted a minute into the drain (the Eviction API refuses it, as a "
                "PodDisruptionBudget that allows no eviction does; Cluster API before v1.9 names no pod)"
                for p in left
                if not p.metadata.deletion_timestamp
            ]
            terminating = [
                f"Pod {_ref(p)}: deleting, still on the node" for p in left if p.metadata.deletion_timestamp
            ]
        blocked = refused if now - wait.started >= STALLED else []
        if now - wait.started >= TERMINATING_BOUND:
            blocked += terminating
        if not blocked:
            return None
        pods = "; ".join(blocked)
        return (
            f"its drain of the node cannot finish ({wait.said}, drain started at {_stamp(wait.started)}): {pods}",
            _timeout_end(spec, "nodeDrainTimeout", wait.started, "stops draining", "drains for ever"),
            "move or delete those pods, or lift the budget that refuses their eviction (one stuck "
            "terminating: see what finalizer or kubelet holds it)",
        )
    if now - wait.started <= DETACH_BOUND:
        return None
    volumes = "; ".join(line.removeprefix("* ") for line in wait.message.splitlines()[1:])
    return (
        f"it waits for the node's volumes to detach ({wait.said} since "
        f"{_stamp(wait.started)}{': ' + volumes if volumes else ''}), longer than the 6 minutes after which "
        "Kubernetes' attach-detach controller detaches from an unhealthy node",
        _timeout_end(
            spec, "nodeVolumeDetachTimeout", wait.started, "stops waiting for them", "waits for ever"
        ),
        "see why the CSI driver does not detach them (its node plugin on the old node)",
    )


def _ref(pod: Any) -> str:
    return f"{pod.metadata.namespace}/{pod.metadata.name}"


def _timeout(spec: dict[str, Any], field: str) -> timedelta | None:
    """The Machine's ``field`` (v1beta1 a Go duration, v1beta2 ``spec.deletion.<field>Seconds``;
    unset or 0: none)."""
    seconds = (spec.get("deletion") or {}).get(f"{field}Seconds")
    if seconds is None and spec.get(field):
        seconds = parse_go_duration(str(spec[field])).total_seconds()
    if not seconds or float(seconds) <= 0:
        return None
    return timedelta(seconds=float(seconds))


def _timeout_end(spec: dict[str, Any], field: str, started: datetime, stops: str, never: str) -> str:
    """When the Machine's ``field`` (``_timeout``) ends the wait that ``started``."""
    timeout = _timeout(spec, field)
    if timeout is None:
        return f"the Machine has no {field} (v1beta2 spec.deletion.{field}Seconds), so Cluster API {never}"
    return f"Cluster API {stops} at {_stamp(started + timeout)} (the Machine's {field})"


def _stamp(when: datetime) -> str:
    return when.strftime("%Y-%m-%dT%H:%M:%SZ")
