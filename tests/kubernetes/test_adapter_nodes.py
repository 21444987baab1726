"""pitcrew's cordon and uncordon through the real client against the emulator.

Cases: cordon is one merge patch carrying the node's resourceVersion, ``spec.unschedulable``, both
taints and the ownership annotations; cordoning again for the same incident (a step resumed after a
SIGKILL between the request and its acknowledgement) reads the node and writes nothing; a taint
someone else adds between pitcrew's read and its write makes the write 409, pitcrew re-reads and
both taints end up on the node; rollback restores spec, labels, taints and annotations exactly, and
keeps a taint someone else added meanwhile; a node cordoned by someone else is never uncordoned;
another incident's cordon is left alone; 500 on a write and a request timeout become
``TransientError`` (the step retries), 500 on a read is retried by the client itself. The fleet
(the breaker's size) is the nodes matching the GPU selector; its one list says which nodes are
out of service and who took them out (a cordon, a controller's taint, NotReady, pitcrew's own). Each write leaves a Kubernetes Event on the
node (``kubectl describe node``); a refused Event never undoes or fails the write.
"""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest

from bot.domain.outages import Taker, kubernetes_outage
from bot.domain.ownership import OWNER_ANNOTATION, TAINT_KEY
from bot.engine.errors import Reason, TransientError
from bot.integrations.kubernetes import KubernetesCluster
from proving_ground.kubernetes.emulator import KubeEmulator

NODE = "gpu-node-02"
FOREIGN = {"key": "example.com/maintenance", "value": "planned", "effect": "NoSchedule"}


def _shape(node: dict[str, Any]) -> dict[str, Any]:
    """What rollback must restore: spec, labels, taints, annotations (not the resourceVersion)."""
    return {
        "spec": node["spec"],
        "labels": node["metadata"].get("labels"),
        "annotations": node["metadata"].get("annotations"),
    }


def _patches(k8s: KubeEmulator) -> list[Any]:
    return [e for e in k8s.log if e.resource == "nodes" and e.verb == "patch"]


async def test_cordon_is_one_guarded_write_of_all_three_marks(
    k8s: KubeEmulator, cluster: KubernetesCluster
) -> None:
    rv = k8s.get("nodes", NODE)["metadata"]["resourceVersion"]  # type: ignore[index]
    await cluster.cordon(NODE, incident_id="pc-00042", reason="pitcrew: pc-00042 XID 79")
    [patch] = _patches(k8s)
    assert patch.content_type == "application/merge-patch+json" and patch.status == 200
    node = k8s.get("nodes", NODE)
    assert node is not None and node["spec"]["unschedulable"] is True
    assert [t["key"] for t in node["spec"]["taints"]] == ["nvidia.com/gpu", TAINT_KEY]
    assert node["metadata"]["annotations"][OWNER_ANNOTATION] == "pc-00042"
    assert node["metadata"]["resourceVersion"] != rv
    facts = await cluster.node(NODE)
    assert facts is not None and facts.unschedulable and facts.gpus == 8 and facts.ready


async def test_the_fleet_is_the_nodes_matching_the_gpu_selector(k8s: KubeEmulator, make_cluster: Any) -> None:
    cpu = copy.deepcopy(k8s.get("nodes", NODE))
    assert cpu is not None
    cpu["metadata"]["name"] = "cpu-node-01"
    cpu["metadata"]["labels"] = {"kubernetes.io/hostname": "cpu-node-01"}
    k8s.add("nodes", cpu)
    assert await make_cluster().count_nodes() == 1
    assert await make_cluster(node_selector="kubernetes.io/hostname").count_nodes() == 2
    [listing, _] = [e for e in k8s.log if e.verb == "list"]
    assert listing.resource == "nodes"


async def test_the_fleet_list_says_which_nodes_are_out_and_by_whom(
    k8s: KubeEmulator, make_cluster: Any
) -> None:
    """``Cluster.nodes``: one list of the GPU fleet, each node with what says it is out of service:
    a cordon by someone else, a controller's taint, a NotReady condition, pitcrew's own cordon."""
    base = k8s.get("nodes", NODE)
    assert base is not None
    marks: dict[str, Any] = {
        "gpu-node-11": {"spec": {"unschedulable": True}},
        "gpu-node-12": {
            "spec": {
                "unschedulable": True,
                "taints": [{"key": "karpenter.sh/disrupted", "effect": "NoSchedule"}],
            }
        },
        "gpu-node-13": {"ready": "False"},
    }
    for name, change in marks.items():
        node = copy.deepcopy(base)
        node["metadata"]["name"] = name
        node["metadata"]["labels"] = {**node["metadata"]["labels"], "kubernetes.io/hostname": name}
        node["spec"].update(change.get("spec", {}))
        if "ready" in change:
            node["status"]["conditions"] = [{"type": "Ready", "status": change["ready"]}]
        k8s.add("nodes", node)
    cluster = make_cluster()
    await cluster.cordon(NODE, incident_id="pc-00042", reason="pitcrew: pc-00042 XID 79")
    before = len([e for e in k8s.log if e.verb == "list"])
    listed = {n.name: n for n in await cluster.nodes()}
    assert len([e for e in k8s.log if e.verb == "list"]) == before + 1  # one list, not a read per node
    found = {
        name: (o.by, o.why)
        if (
            o := kubernetes_outage(
                n.name,
                unschedulable=n.unschedulable,
                ready=n.ready,
                taint_keys=[t.key for t in n.taints],
                annotations=n.annotations,
            )
        )
        else None
        for name, n in listed.items()
    }
    assert found == {
        NODE: (Taker.PITCREW, "cordoned by pitcrew incident pc-00042"),
        "gpu-node-11": (Taker.ADMIN, "cordoned"),
        "gpu-node-12": (Taker.CONTROLLER, "cordoned by Karpenter (taint karpenter.sh/disrupted)"),
        "gpu-node-13": (Taker.NOT_READY, "NotReady"),
    }


async def test_a_resumed_cordon_finds_it_done_and_writes_nothing(
    k8s: KubeEmulator, cluster: KubernetesCluster
) -> None:
    await cluster.cordon(NODE, incident_id="pc-00042", reason="r")
    before = copy.deepcopy(k8s.get("nodes", NODE))
    await cluster.cordon(NODE, incident_id="pc-00042", reason="r")  # the restarted step's second try
    assert len(_patches(k8s)) == 1
    assert k8s.get("nodes", NODE) == before
    assert [e["reason"] for e in _events(k8s)] == ["PitcrewCordon"]  # one event, for the one write


def _events(k8s: KubeEmulator) -> list[dict[str, Any]]:
    return [obj for (plural, _, _), obj in k8s.objects.items() if plural == "events"]


async def test_the_node_shows_what_pitcrew_did_and_a_refused_event_changes_nothing(
    k8s: KubeEmulator, cluster: KubernetesCluster
) -> None:
    await cluster.cordon(NODE, incident_id="pc-00042", reason="pitcrew: pc-00042 XID 79 gpu3")
    [event] = _events(k8s)
    uid = k8s.get("nodes", NODE)["metadata"]["uid"]  # type: ignore[index]
    assert event["involvedObject"] == {"apiVersion": "v1", "kind": "Node", "name": NODE, "uid": uid}
    assert event["metadata"]["namespace"] == "default" and event["source"] == {"component": "pitcrew"}
    assert event["message"].startswith("pitcrew: pc-00042 XID 79 gpu3")
    k8s.inject(403, verb="create", resource="events")
    await cluster.uncordon(NODE, incident_id="pc-00042")  # the event is refused; the uncordon stands
    assert OWNER_ANNOTATION not in k8s.get("nodes", NODE)["metadata"]["annotations"]  # type: ignore[index]
    assert [e.status for e in k8s.log if e.resource == "events"] == [201, 403]


async def test_a_taint_added_between_read_and_write_is_kept(
    k8s: KubeEmulator, cluster: KubernetesCluster
) -> None:
    def someone_else_taints() -> None:
        node = k8s.get("nodes", NODE)
        assert node is not None
        node["spec"]["taints"].append(FOREIGN)
        k8s.bump(node)

    k8s.inject(None, verb="patch", resource="nodes", before=someone_else_taints)
    await cluster.cordon(NODE, incident_id="pc-00042", reason="r")
    assert [p.status for p in _patches(k8s)] == [409, 200]
    node = k8s.get("nodes", NODE)
    assert node is not None
    assert [t["key"] for t in node["spec"]["taints"]] == ["nvidia.com/gpu", FOREIGN["key"], TAINT_KEY]
    assert node["spec"]["unschedulable"] is True


async def test_rollback_restores_the_node_exactly(k8s: KubeEmulator, cluster: KubernetesCluster) -> None:
    original = _shape(copy.deepcopy(k8s.get("nodes", NODE)))  # type: ignore[arg-type]
    await cluster.cordon(NODE, incident_id="pc-00042", reason="r")
    await cluster.set_annotations(
        NODE, {"nodeset.slinky.slurm.net/node-cordon-reason": "pitcrew: pc-00042 XID 79"}
    )
    await cluster.uncordon(NODE, incident_id="pc-00042")
    assert _shape(k8s.get("nodes", NODE)) == original  # type: ignore[arg-type]
    assert "unschedulable" not in original["spec"]


async def test_the_lemon_label_is_set_and_removed_alone(
    k8s: KubeEmulator, cluster: KubernetesCluster
) -> None:
    original = _shape(copy.deepcopy(k8s.get("nodes", NODE)))  # type: ignore[arg-type]
    await cluster.set_labels(NODE, {"pitcrew.dev/lemon": "true"})
    node = k8s.get("nodes", NODE)
    assert node is not None and node["metadata"]["labels"]["pitcrew.dev/lemon"] == "true"
    assert {k: v for k, v in node["metadata"]["labels"].items() if k != "pitcrew.dev/lemon"} == (
        original["labels"] or {}
    )
    await cluster.set_labels(NODE, {"pitcrew.dev/lemon": None})
    assert _shape(k8s.get("nodes", NODE)) == original  # type: ignore[arg-type]


async def test_a_foreign_taint_survives_cordon_and_rollback(
    k8s: KubeEmulator, cluster: KubernetesCluster
) -> None:
    original = _shape(copy.deepcopy(k8s.get("nodes", NODE)))  # type: ignore[arg-type]
    await cluster.cordon(NODE, incident_id="pc-00042", reason="r")
    node = k8s.get("nodes", NODE)
    assert node is not None
    node["spec"]["taints"].append(FOREIGN)  # someone else, while the incident runs
    k8s.bump(node)
    await cluster.uncordon(NODE, incident_id="pc-00042")
    after = _shape(k8s.get("nodes", NODE))  # type: ignore[arg-type]
    assert after["spec"]["taints"] == [*original["spec"]["taints"], FOREIGN]
    assert after["annotations"] == original["annotations"] and "unschedulable" not in after["spec"]


@pytest.mark.parametrize("owner", [None, "pc-00007"])
async def test_a_node_cordoned_by_someone_else_is_never_uncordoned(
    k8s: KubeEmulator, cluster: KubernetesCluster, owner: str | None
) -> None:
    if owner:
        await cluster.cordon(NODE, incident_id=owner, reason="r")
    else:
        node = k8s.get("nodes", NODE)
        assert node is not None
        node["spec"]["unschedulable"] = True
        k8s.bump(node)
    before = copy.deepcopy(k8s.get("nodes", NODE))
    writes = len(_patches(k8s))
    await cluster.uncordon(NODE, incident_id="pc-00042")
    assert len(_patches(k8s)) == writes
    assert k8s.get("nodes", NODE) == before


async def test_a_prior_cordon_value_false_is_restored_as_false(
    k8s: KubeEmulator, cluster: KubernetesCluster
) -> None:
    node = k8s.get("nodes", NODE)
    assert node is not None
    node["spec"]["unschedulable"] = False
    k8s.bump(node)
    await cluster.cordon(NODE, incident_id="pc-00042", reason="r")
    await cluster.uncordon(NODE, incident_id="pc-00042")
    assert k8s.get("nodes", NODE)["spec"]["unschedulable"] is False  # type: ignore[index]


async def test_server_errors_and_timeouts(k8s: KubeEmulator, cluster: KubernetesCluster) -> None:
    k8s.inject(500, verb="get", resource="nodes", times=2)
    assert (await cluster.node(NODE)) is not None  # the client's own retries of a read
    k8s.inject(500, verb="patch", resource="nodes")
    with pytest.raises(TransientError) as err:
        await cluster.cordon(NODE, incident_id="pc-00042", reason="r")
    assert err.value.reason == Reason.UNAVAILABLE
    node = k8s.get("nodes", NODE)
    assert node is not None and "unschedulable" not in node["spec"]  # never half-written
    assert OWNER_ANNOTATION not in node["metadata"]["annotations"]
    k8s.inject(None, verb="patch", resource="nodes", delay=3.0)
    with pytest.raises(TransientError) as err:
        await cluster.cordon(NODE, incident_id="pc-00042", reason="r")
    assert err.value.reason == Reason.TIMEOUT  # the request timed out: not a refused connection
    k8s.inject(429, verb="patch", resource="nodes", retry_after=2)
    with pytest.raises(TransientError) as err:
        await cluster.cordon(NODE, incident_id="pc-00042", reason="r")
    assert err.value.reason == Reason.RATE_LIMITED and err.value.retry_after == 2
    await cluster.cordon(NODE, incident_id="pc-00042", reason="r")  # the step's next attempt
    assert json.dumps(k8s.get("nodes", NODE)).count(TAINT_KEY) == 1
