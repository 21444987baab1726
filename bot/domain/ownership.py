"""Ownership: whether a mark on a far side is pitcrew's, and for which incident — one rule per far side.

pitcrew only ever undoes what it did itself. What it did is recognisable by the marks it
leaves: the Slurm reason ``pitcrew: <incident> <fault>``, the Kubernetes annotation
``pitcrew.dev/incident=<incident>`` with the taint ``pitcrew.dev/gpu-fault``, and in Slinky
mode the operator's copy of our reason, ``slurm-operator: pitcrew: <incident> …``. Steps,
rollback and adapters ask these functions; nothing else spells the marks out.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass

#: Every Slurm reason pitcrew sets starts with this; pitcrew never resumes a node without it.
REASON_PREFIX = "pitcrew:"
#: Reasons are shown in ``sinfo -R`` and Slack; longer ones only hide the useful start.
REASON_MAX_LEN = 128
#: Annotation carrying the id of the incident that cordoned a node.
OWNER_ANNOTATION = "pitcrew.dev/incident"
#: On a Job pitcrew runs: the rung of the repair ladder (the incident's playbook) it was made in.
RUNG_ANNOTATION = "pitcrew.dev/rung"
#: Key of the taint pitcrew adds when it cordons a node for a GPU fault.
TAINT_KEY = "pitcrew.dev/gpu-fault"
#: The Slinky slurm-operator prefixes every reason it copies from the cordon annotation with this.
SLINKY_REASON_PREFIX = "slurm-operator: "
#: What the node's ``spec.unschedulable`` was before pitcrew's cordon (``absent``/``false``), for rollback.
PRIOR_UNSCHEDULABLE_ANNOTATION = "pitcrew.dev/prior-unschedulable"
#: Written on the node before pitcrew starts its replacement: ``<incident> <handle>``.
REPLACE_ANNOTATION = "pitcrew.dev/replacement"
#: Set on the k8s node before cordoning; the operator uses it as the Slurm drain reason.
SLINKY_CORDON_REASON = "nodeset.slinky.slurm.net/node-cordon-reason"


@dataclass(frozen=True, slots=True)
class Taint:
    key: str
    value: str
    effect: str


def clean_reason(text: str) -> str:
    """One printable line of at most ``REASON_MAX_LEN`` characters.

    Control characters and newlines would break ``key=value`` parsing and Slack rendering,
    so they become spaces; runs of whitespace collapse because Slurm shows them verbatim.
    """
    flat = "".join(ch if ch.isprintable() else " " for ch in text)
    return " ".join(flat.split())[:REASON_MAX_LEN].rstrip()


# ----------------------------------------------------------------------- Slurm
def slurm_reason(incident_id: str, fault: str) -> str:
    """The reason pitcrew sets on a Slurm node: ``pitcrew: <incident> <fault>``, one bounded line."""
    return clean_reason(f"{REASON_PREFIX} {incident_id} {fault}")


def slurm_reason_owner(reason: str) -> str | None:
    """The incident a Slurm reason names if pitcrew set it, else ``None``."""
    if not reason.startswith(REASON_PREFIX):
        return None
    words = reason[len(REASON_PREFIX) :].split()
    return words[0] if words else None


def is_pitcrew_reason(reason: str) -> bool:
    """Set by pitcrew (for any incident)."""
    return slurm_reason_owner(reason) is not None


def owns_slurm_reason(reason: str, incident_id: str) -> bool:
    """Set by pitcrew for this incident."""
    return slurm_reason_owner(reason) == incident_id


# ------------------------------------------------------------------ Kubernetes
def fault_taint(fault_class: str = "true") -> Taint:
    """The taint pitcrew adds with its cordon: ``pitcrew.dev/gpu-fault=<class>:NoSchedule``."""
    return Taint(key=TAINT_KEY, value=fault_class, effect="NoSchedule")


def node_owner(annotations: Mapping[str, str]) -> str | None:
    return annotations.get(OWNER_ANNOTATION) or None


def owns_node(annotations: Mapping[str, str], incident_id: str) -> bool:
    """The node carries this incident's ownership annotation."""
    return node_owner(annotations) == incident_id


def cordon_marks(incident_id: str, prior_unschedulable: bool | None) -> dict[str, str]:
    """The annotations pitcrew's cordon writes: the owner and what ``spec.unschedulable`` was."""
    prior = "absent" if prior_unschedulable is None else str(prior_unschedulable).lower()
    return {OWNER_ANNOTATION: incident_id, PRIOR_UNSCHEDULABLE_ANNOTATION: prior}


def prior_unschedulable(annotations: Mapping[str, str]) -> bool | None:
    """``spec.unschedulable`` before pitcrew's cordon (``None``: the field was absent)."""
    value = annotations.get(PRIOR_UNSCHEDULABLE_ANNOTATION, "absent")
    return None if value == "absent" else value == "true"


def is_own_taint(key: str) -> bool:
    """The taint is pitcrew's (rollback removes only this one)."""
    return key == TAINT_KEY


def replacement_mark(incident_id: str, handle: str) -> str:
    return f"{incident_id} {handle}"


def replacement_owner(annotations: Mapping[str, str]) -> tuple[str, str] | None:
    """``(incident, handle)`` of the replacement pitcrew started for the node, if any."""
    incident, _, handle = (annotations.get(REPLACE_ANNOTATION) or "").partition(" ")
    return (incident, handle) if incident and handle else None


# ---------------------------------------------------------------------- Slinky
def slinky_cordon_annotations(reason: str) -> dict[str, str]:
    """Annotations to set on the k8s node *before* cordoning it in Slinky mode."""
    return {SLINKY_CORDON_REASON: reason}


#: The reason slurm-operator's slurmd container preStop hook (v1.2 on, ``worker_app.go``:
#: ``scontrol update nodename=$(hostname) state=down reason='slurm-operator: Pod is terminating'``)
#: sets on the pod's Slurm node whenever the pod terminates with a grace period: an eviction, a
#: deleted Machine's or NodeClaim's drain.
SLINKY_PRESTOP_REASON = SLINKY_REASON_PREFIX + "Pod is terminating"


def slinky_prestop_down(reason: str) -> bool:
    """The reason of a Slurm node DOWN from the slurmd container's preStop hook: the hook's own, or
    the one the operator's undrain wrote over it. The operator's undrain (``MakeNodeUndrain``, when
    its pod is uncordoned) sends UNDRAIN with ``slurm-operator: Pod (<ns>/<pod>) was uncordoned``,
    which Slurm applies as the reason and clears DRAIN only (node_mgr.c ``update_node``): the DOWN
    stays, relabelled. The operator sets DOWN nowhere but in that hook, so on a DOWN node either
    reason is the hook's DOWN. Slurm returns such a node when its slurmd registers again only under
    ``ReturnToService=2`` (``validate_node_specs``: under 1 only a "Not responding" DOWN)."""
    if reason == SLINKY_PRESTOP_REASON:
        return True
    rest = reason.removeprefix(SLINKY_REASON_PREFIX)
    return rest != reason and rest.startswith("Pod (") and rest.endswith(") was uncordoned")


def slinky_reason_is_ours(reason: str, incident_id: str | None = None) -> bool:
    """A drain the operator set from our annotation: ``slurm-operator: pitcrew: …`` (for this incident)."""
    if not reason.startswith(SLINKY_REASON_PREFIX):
        return False
    owner = slurm_reason_owner(reason[len(SLINKY_REASON_PREFIX) :])
    return owner is not None and (incident_id is None or owner == incident_id)


# ------------------------------------------------------------------ lending
#: Annotation carrying the id of the incident a pool node is lent to (``capacity.pools[].selector``).
LENT_ANNOTATION = "pitcrew.dev/lent-to"
#: What the lent node was before the take, as JSON: ``{"labels": {key: value or null}, "unschedulable": …}``.
LENT_PRIOR_ANNOTATION = "pitcrew.dev/lent-prior"


@dataclass(frozen=True, slots=True)
class LentPrior:
    """What a take changed on a pool node, so the give-back restores exactly that and nothing else."""

    #: Each label the take set or removed, with its value before (``None``: it was absent).
    labels: Mapping[str, str | None]
    #: ``spec.unschedulable`` before the take cordoned the node; ``None``: the take did not cordon.
    unschedulable: bool | None = None
    cordoned: bool = False


def lent_to(annotations: Mapping[str, str]) -> str | None:
    """The incident the node is lent to, if any."""
    return annotations.get(LENT_ANNOTATION) or None


def lent_marks(incident_id: str, prior: LentPrior) -> dict[str, str]:
    """The annotations a take writes: the borrower and what the node was before."""
    body = {"labels": dict(prior.labels), "unschedulable": prior.unschedulable, "cordoned": prior.cordoned}
    return {LENT_ANNOTATION: incident_id, LENT_PRIOR_ANNOTATION: json.dumps(body, sort_keys=True)}


def lent_prior(annotations: Mapping[str, str]) -> LentPrior | None:
    """What the take recorded (``None``: no record, or not one pitcrew can read: leave the node as is)."""
    try:
        body = json.loads(annotations.get(LENT_PRIOR_ANNOTATION) or "")
    except ValueError:
        return None
    if not isinstance(body, dict) or not isinstance(body.get("labels"), dict):
        return None
    labels = {str(k): (None if v is None else str(v)) for k, v in body["labels"].items()}
    unschedulable = body.get("unschedulable")
    return LentPrior(
        labels,
        unschedulable if isinstance(unschedulable, bool) else None,
        cordoned=body.get("cordoned") is True,
    )
