"""Slinky: the slurmd pod drains because the Slurm node was taken out first, never by force.

slurm-operator keeps ``pod-protect`` on a busy Slurm node's slurmd pod, and its budget
(``maxUnavailable: 0``) refuses that pod's eviction. Cases: pitcrew's cordon-reason annotation goes
on, then the cordon; while Slurm is busy the eviction is a ``pdb`` refusal naming the operator's
budget; once the Slurm node is out (DOWN: the operator sees it idle and drops ``pod-protect``) the
same eviction succeeds, and no pod was deleted by force. The slurmd pods name their Slurm nodes.
The operator stand-in as slurm-operator's ``syncCordon`` is: it drains a Slurm node whose reason is
empty (or its own) with ``slurm-operator: `` and pitcrew's annotation, keeps another's reason and
drains nothing then, and keeps ``pod-protect`` while a job runs on the drained node.
"""

from __future__ import annotations

import asyncio

import pytest

from bot.domain.nodemap import DEFAULT_SLINKY_SELECTOR, NodeMapping, slurm_nodes_for
from bot.domain.ownership import SLINKY_CORDON_REASON, slinky_cordon_annotations
from bot.engine.errors import TransientError
from bot.engine.ports import PodRef
from bot.integrations.kubernetes import KubernetesCluster
from proving_ground.kubernetes.emulator import KubeEmulator
from proving_ground.kubernetes.slinky import TERMINATING, MemorySlurm, slurm_reason
from proving_ground.kubernetes.world import slinky_pdb

NODE = "gpu-node-02"
SLURMD = PodRef("slurm", "slurm-worker-gpu-h100-7xk2p", owner_kind="NodeSet")


async def test_slurmd_pod_drains_once_slurm_let_go(cluster: KubernetesCluster, k8s: KubeEmulator) -> None:
    k8s.add("poddisruptionbudgets", slinky_pdb())
    node = await cluster.node(NODE)
    assert node is not None
    pods = await cluster.slurmd_pods("slurm", DEFAULT_SLINKY_SELECTOR)
    [slurm_node] = slurm_nodes_for(node, NodeMapping(mode="slinky"), pods)
    assert slurm_node == "gpu-002"

    await cluster.set_annotations(NODE, slinky_cordon_annotations("pitcrew: pc-00042 XID 79"))
    await cluster.cordon(NODE, incident_id="pc-00042", reason="pitcrew: pc-00042 XID 79")
    writes = [e for e in k8s.log if e.verb == "patch"]
    assert len(writes) == 2  # the reason first, then the cordon
    assert k8s.get("nodes", NODE)["metadata"]["annotations"][SLINKY_CORDON_REASON].startswith("pitcrew:")  # type: ignore[index]

    with pytest.raises(TransientError, match="slurm-workers-pdb-slurm") as err:
        await cluster.evict(SLURMD)
    assert err.value.reason == "pdb"
    k8s.slurm_node_busy(slurm_node, busy=False)  # Slurm DOWN: the operator drops pod-protect
    await cluster.evict(SLURMD)
    assert [e.status for e in k8s.log if e.subresource == "eviction"] == [429, 201]
    assert not [e for e in k8s.log if e.verb == "delete"]


async def _settled(k8s: KubeEmulator) -> None:
    assert k8s.slinky_drain_delay is not None
    await asyncio.sleep(k8s.slinky_drain_delay + 3 * k8s.slinky_resync)


async def test_the_operator_drains_with_pitcrews_reason_and_keeps_the_pod_protected_while_a_job_runs(
    cluster: KubernetesCluster, k8s: KubeEmulator
) -> None:
    """slurm-operator drains a Slurm node with no reason, under its prefix; a drain lets the job run,
    and ``pod-protect`` (its budget refusing the eviction) stays until the job ends."""
    k8s.add("poddisruptionbudgets", slinky_pdb())
    k8s.slinky_drain_delay = 0.05
    k8s.slurm_node_busy("gpu-002", busy=True)  # a long job runs there
    await cluster.set_annotations(NODE, slinky_cordon_annotations("pitcrew: pc-00042 XID 79"))
    await cluster.cordon(NODE, incident_id="pc-00042", reason="pitcrew: pc-00042 XID 79")
    await _settled(k8s)
    slurm = k8s.slinky_slurm
    assert isinstance(slurm, MemorySlurm)
    assert slurm.drained == {"gpu-002"}
    assert slurm.reasons["gpu-002"] == "slurm-operator: pitcrew: pc-00042 XID 79"
    with pytest.raises(TransientError, match="slurm-workers-pdb-slurm"):  # still busy: still protected
        await cluster.evict(SLURMD)
    slurm.busy["gpu-002"] = False  # the job ends (or is requeued): the operator sees it
    await _settled(k8s)
    await cluster.evict(SLURMD)
    assert [e.status for e in k8s.log if e.subresource == "eviction"] == [429, 201]


async def test_the_operator_keeps_another_reason_and_drains_nothing(
    cluster: KubernetesCluster, k8s: KubeEmulator
) -> None:
    slurm = k8s.slinky_slurm
    assert isinstance(slurm, MemorySlurm)
    slurm.reasons["gpu-002"] = "admin: bios update"
    k8s.slinky_drain_delay = 0.05
    await cluster.set_annotations(NODE, slinky_cordon_annotations("pitcrew: pc-00042 XID 79"))
    await cluster.cordon(NODE, incident_id="pc-00042", reason="pitcrew: pc-00042 XID 79")
    await _settled(k8s)
    assert slurm.drained == set() and slurm.reasons["gpu-002"] == "admin: bios update"
    assert k8s.slinky_kept == {"gpu-002": "admin: bios update"} and NODE not in k8s.slinky_reasons


def test_the_operator_sanitizes_the_reason_it_copies() -> None:
    """sanitizeSlurmReason: line breaks and tabs become spaces, other control characters go, the
    ends are trimmed, 256 characters at most."""
    assert slurm_reason(" pitcrew: pc-1\tXID 79\non gpu-002\x07 ") == "pitcrew: pc-1 XID 79 on gpu-002"
    assert len(slurm_reason("x" * 300)) == 256


async def test_the_operators_undrain_on_uncordon_leaves_a_prestop_down(
    cluster: KubernetesCluster, k8s: KubeEmulator
) -> None:
    """slurm-operator undrains the Slurm node of a pod on an uncordoned node (``syncCordon`` →
    ``MakeNodeUndrain``: UNDRAIN with ``slurm-operator: Pod (<ns>/<pod>) was uncordoned``), when it
    has DRAIN and the operator's reason. UNDRAIN clears DRAIN only and takes the reason (node_mgr.c
    ``update_node``, measured on 22.05 and 24.11): the preStop hook's DOWN stays, relabelled; a
    plain drain ends. Another's reason is kept."""
    slurm = k8s.slinky_slurm
    assert isinstance(slurm, MemorySlurm)
    k8s.slinky_drain_delay = 0.05
    await cluster.set_annotations(NODE, slinky_cordon_annotations("pitcrew: pc-00042 XID 79"))
    await cluster.cordon(NODE, incident_id="pc-00042", reason="pitcrew: pc-00042 XID 79")
    await _settled(k8s)
    assert slurm.drained == {"gpu-002"}
    await slurm.down("gpu-002", TERMINATING)  # the pod's preStop hook, before this pod was made again
    await cluster.uncordon(NODE, incident_id="pc-00042")
    await _settled(k8s)
    assert slurm.drained == set() and slurm.downed == {"gpu-002"}
    assert slurm.reasons["gpu-002"] == f"slurm-operator: Pod ({SLURMD.ref}) was uncordoned"

    slurm.downed.clear()  # a plain operator drain: the undrain ends it
    await cluster.cordon(NODE, incident_id="pc-00043", reason="pitcrew: pc-00043 XID 79")
    await _settled(k8s)
    assert slurm.drained == {"gpu-002"}
    await cluster.uncordon(NODE, incident_id="pc-00043")
    await _settled(k8s)
    assert slurm.drained == set() and not slurm.downed

    slurm.drained.add("gpu-002")  # someone else's drain: kept
    slurm.reasons["gpu-002"] = "admin: bios update"
    await cluster.cordon(NODE, incident_id="pc-00044", reason="pitcrew: pc-00044 XID 79")
    await cluster.uncordon(NODE, incident_id="pc-00044")
    await _settled(k8s)
    assert slurm.drained == {"gpu-002"} and slurm.reasons["gpu-002"] == "admin: bios update"
