"""Which Slurm node(s) a Kubernetes node carries, and back.

Pure: the caller (the engine, with the Kubernetes adapter) passes in the node's labels and
annotations and, for Slinky, the slurmd pods it listed; this module only decides. It must
not list pods, read settings files or talk to Slurm.

Modes:

* ``identity`` — the Slurm node has the Kubernetes node's name (bare-metal Slurm next to k8s).
* ``label`` / ``annotation`` — the node carries the Slurm name(s) under ``key``; the value may
  be a Slurm hostlist (``gpu-[001-002]``) for a node that hosts several slurmd.
* ``slinky`` — the Slinky slurm-operator runs one slurmd pod per NodeSet member; the Slurm node
  name of a pod is its ``nodeset.slinky.slurm.net/pod-hostname`` label, set by the operator
  from ``spec.hostname`` (DaemonSet mode: the k8s node name up to its first dot, or the node's
  ``nodeset.slinky.slurm.net/hostname-override`` annotation; StatefulSet mode: the pod's
  hostname or name). In this mode pitcrew does not talk to Slurm for the node: it annotates
  the k8s node with ``node-cordon-reason`` before cordoning, the operator drains the Slurm
  node with reason ``slurm-operator: <our reason>``, and uncordon undrains it.

``NodeMapping`` is also configuration: its aliases are the keys under ``slurm``
(``node_mapping``, ``node_mapping_key``, ``slinky_pod_selector``), and the Slurm settings
extend it instead of copying it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Literal, Protocol

from pydantic import BaseModel, ConfigDict, Field, model_validator

from bot.domain.jobs import expand_hostlist

MappingMode = Literal["identity", "label", "annotation", "slinky"]

SLINKY_PREFIX = "nodeset.slinky.slurm.net/"
#: Pod label carrying the Slurm node name of a NodeSet pod (set by the operator).
SLINKY_POD_HOSTNAME = SLINKY_PREFIX + "pod-hostname"
#: Node annotation that overrides the DaemonSet-mode pod hostname, hence the Slurm node name.
SLINKY_HOSTNAME_OVERRIDE = SLINKY_PREFIX + "hostname-override"
#: Pod label naming the scaling mode of the pod's NodeSet: ``StatefulSet`` (the default) or ``DaemonSet``.
SLINKY_SCALING_MODE = SLINKY_PREFIX + "scaling-mode"
#: The operator labels slurmd pods ``app.kubernetes.io/name=slurmd``.
DEFAULT_SLINKY_SELECTOR: Mapping[str, str] = {"app.kubernetes.io/name": "slurmd"}


class NodeFacts(Protocol):
    """What mapping needs from a k8s node (``bot.engine.ports.ClusterNode`` fits)."""

    @property
    def name(self) -> str: ...

    @property
    def labels(self) -> Mapping[str, str]: ...

    @property
    def annotations(self) -> Mapping[str, str]: ...


@dataclass(frozen=True, slots=True)
class SlurmdPod:
    """One slurmd pod as listed from Kubernetes."""

    name: str
    node_name: str | None
    hostname: str | None = None
    labels: Mapping[str, str] = field(default_factory=dict)
    namespace: str = ""

    @property
    def slurm_node(self) -> str:
        # The operator's label is authoritative; hostname and name are what it derives it from.
        return self.labels.get(SLINKY_POD_HOSTNAME) or self.hostname or self.name


class NodeMapping(BaseModel):
    """How to map; ``key`` is the label or annotation key in those two modes."""

    # Read and written under the configuration keys; attribute names also accepted in code.
    model_config = ConfigDict(
        extra="forbid", frozen=True, validate_by_name=True, validate_by_alias=True, serialize_by_alias=True
    )

    mode: MappingMode = Field(
        default="identity",
        alias="node_mapping",
        description="How a Kubernetes node names its Slurm node(s): same name, a label, an annotation, "
        "or the Slinky slurmd pods on it (then Slurm is drained through the slurm-operator).",
    )
    key: str | None = Field(
        default=None,
        alias="node_mapping_key",
        description="Label or annotation key holding the Slurm node name(s) (a hostlist is allowed).",
    )
    slinky_selector: dict[str, str] = Field(
        default_factory=lambda: dict(DEFAULT_SLINKY_SELECTOR),
        alias="slinky_pod_selector",
        description="Labels that select slurmd pods in Slinky mode.",
    )

    @model_validator(mode="after")
    def _key_where_needed(self) -> NodeMapping:
        if self.mode in ("label", "annotation") and not self.key:
            raise ValueError(
                f"node_mapping {self.mode} needs node_mapping_key, the {self.mode} naming the Slurm node"
            )
        return self


def slurm_nodes_for(node: NodeFacts, mapping: NodeMapping, pods: Iterable[SlurmdPod] = ()) -> tuple[str, ...]:
    """Slurm node names hosted by ``node``; empty when it carries none (not a Slurm node)."""
    if mapping.mode == "identity":
        return (node.name,)
    if mapping.mode in ("label", "annotation"):
        source = node.labels if mapping.mode == "label" else node.annotations
        return expand_hostlist(source.get(mapping.key or "", ""))
    names = [
        pod.slurm_node
        for pod in pods
        if pod.node_name == node.name and _matches(pod.labels, mapping.slinky_selector)
    ]
    return tuple(sorted(set(names)))


def read_from_node(mode: MappingMode) -> bool:
    """Whether ``mode`` reads a node's Slurm node(s) from what the node carries (its labels, its
    annotations, its slurmd pods). A replacement then carries its own, which may be new names: a
    Slinky DaemonSet-mode NodeSet names the Slurm node after the Kubernetes node, and a new node
    has a new name and no ``hostname-override``. ``identity`` reads nothing: the Slurm node is named
    as the incident's node, which is what a replacement takes over where slurm.conf lists the
    nodes (a static NodeName)."""
    return mode != "identity"


def k8s_node_for(
    slurm_node: str,
    nodes: Iterable[NodeFacts],
    mapping: NodeMapping,
    pods: Iterable[SlurmdPod] = (),
) -> str | None:
    """The k8s node hosting ``slurm_node``, or ``None`` if no listed node does."""
    pod_list = list(pods)
    for node in nodes:
        if slurm_node in slurm_nodes_for(node, mapping, pod_list):
            return node.name
    return None


def _matches(labels: Mapping[str, str], selector: Mapping[str, str]) -> bool:
    return all(labels.get(k) == v for k, v in selector.items())
