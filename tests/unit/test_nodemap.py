"""Kubernetes node ↔ Slurm node mapping (``bot.domain.nodemap``), table-driven.

Cases: identity; label and annotation holding one name or a hostlist; a node without the
key (not a Slurm node); Slinky slurmd pods, whose Slurm name is the operator's
``pod-hostname`` label, else the pod hostname, else the pod name, filtered by node and
selector; the reverse lookup; Slinky's cordon annotation and its prefixed reason; which modes read
a node's Slurm nodes from the node (so a replacement's are read from it) and which only name them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import pytest

from bot.domain.nodemap import (
    SLINKY_POD_HOSTNAME,
    MappingMode,
    NodeMapping,
    SlurmdPod,
    k8s_node_for,
    read_from_node,
    slurm_nodes_for,
)
from bot.domain.ownership import (
    SLINKY_CORDON_REASON,
    slinky_cordon_annotations,
    slinky_reason_is_ours,
    slurm_reason,
)
from bot.engine.ports import ClusterNode

SLURMD = {"app.kubernetes.io/name": "slurmd"}


@dataclass(frozen=True)
class Node:
    name: str
    labels: Mapping[str, str] = field(default_factory=dict)
    annotations: Mapping[str, str] = field(default_factory=dict)


PODS = (
    SlurmdPod("gpu-a-0", "k8s-a.example.com", "gpu-a", {**SLURMD, SLINKY_POD_HOSTNAME: "gpu-a"}),
    SlurmdPod("gpu-b-0", "k8s-b", "b-host", SLURMD),  # no operator label: hostname is the Slurm name
    SlurmdPod("gpu-b-1", "k8s-b", None, SLURMD),  # nor hostname: the pod name
    SlurmdPod("login-0", "k8s-b", "login", {"app.kubernetes.io/name": "login"}),  # not slurmd
    SlurmdPod("gpu-c-0", None, "gpu-c", SLURMD),  # pending: on no node yet
)


@pytest.mark.parametrize(
    ("node", "mapping", "expected"),
    [
        (Node("gpu-001"), NodeMapping(), ("gpu-001",)),
        (
            Node("k1", labels={"slurm/node": "gpu-007"}),
            NodeMapping(mode="label", key="slurm/node"),
            ("gpu-007",),
        ),
        (
            Node("k1", labels={"slurm/node": "gpu-[001-002]"}),
            NodeMapping(mode="label", key="slurm/node"),
            ("gpu-001", "gpu-002"),
        ),
        (
            Node("k1", annotations={"a/slurm": "n1,n2"}),
            NodeMapping(mode="annotation", key="a/slurm"),
            ("n1", "n2"),
        ),
        (
            Node("k1", labels={"a/slurm": "n1"}),
            NodeMapping(mode="annotation", key="a/slurm"),
            (),
        ),  # wrong place
        (Node("k1"), NodeMapping(mode="label", key="slurm/node"), ()),
        (Node("k8s-a.example.com"), NodeMapping(mode="slinky"), ("gpu-a",)),
        (Node("k8s-b"), NodeMapping(mode="slinky"), ("b-host", "gpu-b-1")),
        (
            Node("k8s-b"),
            NodeMapping(mode="slinky", slinky_selector={"app.kubernetes.io/name": "login"}),
            ("login",),
        ),
        (Node("k8s-z"), NodeMapping(mode="slinky"), ()),
    ],
)
def test_slurm_nodes_for(node: Node, mapping: NodeMapping, expected: tuple[str, ...]) -> None:
    assert slurm_nodes_for(node, mapping, PODS) == expected


def test_cluster_node_fits_the_protocol() -> None:
    node = ClusterNode(name="k1", labels={"slurm/node": "gpu-003"})
    assert slurm_nodes_for(node, NodeMapping(mode="label", key="slurm/node")) == ("gpu-003",)


@pytest.mark.parametrize(
    ("slurm", "mapping", "expected"),
    [
        ("gpu-002", NodeMapping(mode="label", key="s"), "k2"),
        ("gpu-a", NodeMapping(mode="slinky"), "k8s-a.example.com"),
        ("gpu-b-1", NodeMapping(mode="slinky"), "k8s-b"),
        ("gpu-c", NodeMapping(mode="slinky"), None),  # its pod is not on a node
        ("k1", NodeMapping(), "k1"),
        ("nowhere", NodeMapping(), None),
    ],
)
def test_k8s_node_for(slurm: str, mapping: NodeMapping, expected: str | None) -> None:
    nodes = [
        Node("k1", labels={"s": "gpu-001"}),
        Node("k2", labels={"s": "gpu-[002-003]"}),
        Node("k8s-a.example.com"),
        Node("k8s-b"),
    ]
    assert k8s_node_for(slurm, nodes, mapping, PODS) == expected


def test_label_mode_needs_a_key() -> None:
    with pytest.raises(ValueError, match="needs node_mapping_key"):
        NodeMapping(mode="label")


def test_slinky_reason_round_trip() -> None:
    ours = slurm_reason("inc-7", "XID 79 gpu3")
    assert slinky_cordon_annotations(ours) == {SLINKY_CORDON_REASON: "pitcrew: inc-7 XID 79 gpu3"}
    # The operator drains with "slurm-operator: <annotation>".
    assert slinky_reason_is_ours("slurm-operator: " + ours)
    assert not slinky_reason_is_ours("slurm-operator: Pod is terminating")
    assert not slinky_reason_is_ours(ours)


@pytest.mark.parametrize(
    ("mode", "reads"), [("identity", False), ("label", True), ("annotation", True), ("slinky", True)]
)
def test_which_modes_read_the_node(mode: MappingMode, reads: bool) -> None:
    assert read_from_node(mode) is reads
