"""pitcrew's lending of a pool node through the real client against the emulator.

Cases: a take from a lender is one guarded merge patch: the incident's mark with what the node
was, the cordon and the pool's labels removed (the NodeSet's label waits for the join); the pool's selector no
longer lists it. A take resumed after a crash finds its own mark and writes nothing; another
incident's take is refused. The give-back restores labels, ``spec.unschedulable`` and
annotations exactly as they were, keeps a label someone else added meanwhile, and leaves a node
that is not this incident's alone. The join (once the node is free) sets the NodeSet's labels
and lifts the take's cordon in one guarded patch, for its own incident only. ``keep_lent`` (the lent node stays with the jobs) uncordons
and unmarks it but keeps its new labels. Each take and give-back leaves an Event on the node.
A pool's own command (``join_command``/``leave_command``) runs without a shell — a word holding
``;`` stays one argument — and answers its output; a non-zero exit is permanent and names the
output's last line, a command past its limit is killed and transient.
"""

from __future__ import annotations

import copy
import sys
from typing import Any

import pytest

from bot.domain.ownership import LENT_ANNOTATION
from bot.engine.errors import PermanentError, Reason, TransientError
from bot.engine.ports import Lend
from bot.integrations.kubernetes import KubernetesCluster
from proving_ground.kubernetes.emulator import KubeEmulator
from proving_ground.kubernetes.world import gpu_fleet

LENDER = "gpu-infer-01"
INFERENCE = {"pitcrew.dev/pool": "inference", "workload": "vllm"}
JOIN = {"slinky.slurm.net/nodeset": "gpu-h100"}


def _take(incident: str = "pc-00007") -> Lend:
    return Lend(incident, JOIN, ("pitcrew.dev/pool", "workload"), cordon=True)


@pytest.fixture
def lender(k8s: KubeEmulator) -> dict[str, Any]:
    gpu_fleet(k8s, [LENDER])
    node = k8s.get("nodes", LENDER)
    assert node is not None
    node["metadata"]["labels"].update(INFERENCE)
    node["spec"].pop("unschedulable", None)
    k8s.bump(node)
    return copy.deepcopy(node)


def _shape(node: dict[str, Any] | None) -> dict[str, Any]:
    assert node is not None
    meta = node["metadata"]
    return {"spec": node["spec"], "labels": meta.get("labels"), "annotations": meta.get("annotations")}


async def test_a_take_is_one_guarded_write_and_the_pool_no_longer_lists_the_node(
    k8s: KubeEmulator, cluster: KubernetesCluster, lender: dict[str, Any]
) -> None:
    assert [n.name for n in await cluster.pool_nodes("pitcrew.dev/pool=inference")] == [LENDER]
    assert await cluster.lend(LENDER, _take())
    [patch] = [e for e in k8s.log if e.resource == "nodes" and e.verb == "patch"]
    assert patch.status == 200 and patch.content_type == "application/merge-patch+json"
    node = k8s.get("nodes", LENDER)
    assert node is not None and node["spec"]["unschedulable"] is True
    labels = node["metadata"]["labels"]
    assert "pitcrew.dev/pool" not in labels and "workload" not in labels
    assert "slinky.slurm.net/nodeset" not in labels  # joined only once its pods are gone
    assert node["metadata"]["annotations"][LENT_ANNOTATION] == "pc-00007"
    assert await cluster.pool_nodes("pitcrew.dev/pool=inference") == []
    assert not await cluster.lend(LENDER, _take())  # resumed: already ours, nothing written
    assert len([e for e in k8s.log if e.resource == "nodes" and e.verb == "patch"]) == 1
    with pytest.raises(PermanentError) as err:
        await cluster.lend(LENDER, _take("pc-00008"))
    assert err.value.reason == Reason.CONFLICT and "pc-00007" in str(err.value)
    reasons = [obj["reason"] for (plural, _, _), obj in k8s.objects.items() if plural == "events"]
    assert "PitcrewLend" in reasons


async def test_the_give_back_restores_exactly_what_the_take_changed(
    k8s: KubeEmulator, cluster: KubernetesCluster, lender: dict[str, Any]
) -> None:
    await cluster.lend(LENDER, _take())
    assert await cluster.join(LENDER, JOIN, incident_id="pc-00007")  # the node joined the NodeSet
    assert not await cluster.lend_back(LENDER, incident_id="pc-00099")  # not that incident's
    node = k8s.get("nodes", LENDER)
    assert node is not None
    node["metadata"]["labels"]["team"] = "search"  # someone else's label, added while lent
    k8s.bump(node)
    assert await cluster.lend_back(LENDER, incident_id="pc-00007")
    after = k8s.get("nodes", LENDER)
    expected = _shape(lender)
    expected["labels"] = {**expected["labels"], "team": "search"}
    assert _shape(after) == expected
    assert not await cluster.lend_back(LENDER, incident_id="pc-00007")  # done once
    assert [n.name for n in await cluster.pool_nodes("pitcrew.dev/pool=inference")] == [LENDER]


async def test_a_lent_node_kept_by_the_jobs_is_uncordoned_and_unmarked_with_its_new_labels(
    k8s: KubeEmulator, cluster: KubernetesCluster, lender: dict[str, Any]
) -> None:
    await cluster.lend(LENDER, _take())
    assert await cluster.join(LENDER, JOIN, incident_id="pc-00007")
    assert await cluster.keep_lent(LENDER, incident_id="pc-00007")
    node = k8s.get("nodes", LENDER)
    assert node is not None
    assert not node["spec"].get("unschedulable")
    assert LENT_ANNOTATION not in (node["metadata"].get("annotations") or {})
    assert node["metadata"]["labels"]["slinky.slurm.net/nodeset"] == "gpu-h100"
    assert "workload" not in node["metadata"]["labels"]


async def test_a_node_cordoned_before_the_take_stays_cordoned_after_it(
    k8s: KubeEmulator, cluster: KubernetesCluster, lender: dict[str, Any]
) -> None:
    node = k8s.get("nodes", LENDER)
    assert node is not None
    node["spec"]["unschedulable"] = True
    k8s.bump(node)
    await cluster.lend(LENDER, _take())
    await cluster.join(LENDER, JOIN, incident_id="pc-00007")
    await cluster.lend_back(LENDER, incident_id="pc-00007")
    after = k8s.get("nodes", LENDER)
    assert after is not None and after["spec"]["unschedulable"] is True


async def test_the_join_lifts_the_takes_cordon_with_the_nodesets_labels_and_only_for_its_incident(
    k8s: KubeEmulator, cluster: KubernetesCluster, lender: dict[str, Any]
) -> None:
    """slurm-operator runs no NodeSet pod on a cordoned node (``PodShouldRunOnNode`` and the
    scheduler refuse the ``node.kubernetes.io/unschedulable`` taint) and drains the Slurm node of
    a pod whose node is cordoned (``syncCordon``): a lender joins uncordoned, in one guarded patch,
    with the pool's labels still off."""
    await cluster.lend(LENDER, _take())
    patches = len([e for e in k8s.log if e.resource == "nodes" and e.verb == "patch"])
    assert not await cluster.join(LENDER, JOIN, incident_id="pc-00099")  # not that incident's
    assert len([e for e in k8s.log if e.resource == "nodes" and e.verb == "patch"]) == patches
    assert await cluster.join(LENDER, JOIN, incident_id="pc-00007")
    [patch] = [e for e in k8s.log if e.resource == "nodes" and e.verb == "patch"][patches:]
    assert patch.status == 200 and patch.content_type == "application/merge-patch+json"
    node = k8s.get("nodes", LENDER)
    assert node is not None and not node["spec"].get("unschedulable")
    labels = node["metadata"]["labels"]
    assert labels["slinky.slurm.net/nodeset"] == "gpu-h100" and "workload" not in labels
    assert node["metadata"]["annotations"][LENT_ANNOTATION] == "pc-00007"  # still lent
    assert await cluster.join(LENDER, JOIN, incident_id="pc-00007")  # resumed: the same again
    assert await cluster.lend_back(LENDER, incident_id="pc-00007")
    assert _shape(k8s.get("nodes", LENDER)) == _shape(lender)


async def test_a_pool_command_runs_without_a_shell_and_answers_its_output(cluster: KubernetesCluster) -> None:
    echo = [sys.executable, "-c", "import sys; print(' | '.join(sys.argv[1:]))"]
    out = await cluster.pool_command(
        LENDER, [*echo, LENDER, "x; touch /tmp/pwned"], incident_id="pc-7", limit=10
    )
    assert out == f"{LENDER} | x; touch /tmp/pwned\n"
    failing = [sys.executable, "-c", "print('scontrol: error: Invalid node name'); raise SystemExit(3)"]
    with pytest.raises(PermanentError, match="exited 3: scontrol: error: Invalid node name") as refused:
        await cluster.pool_command(LENDER, failing, incident_id="pc-7", limit=10)
    assert refused.value.reason == Reason.COMMAND_FAILED
    with pytest.raises(TransientError, match="timed out") as slow:
        await cluster.pool_command(
            LENDER, [sys.executable, "-c", "import time; time.sleep(30)"], incident_id="pc-7", limit=0.5
        )
    assert slow.value.reason == Reason.TIMEOUT
