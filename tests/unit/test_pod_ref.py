"""How a listed pod is read for the drain (``bot.integrations.kubernetes.pods.pod_ref``): a Slinky
NodeSet's slurmd pod, in either scaling mode, has the NodeSet as its controller (slurm-operator
``NewNodeSetStatefulSetPod``, ``NewNodeSetDaemonSetPod``: ``GetPodFromTemplate`` with the NodeSet's
controllerRef) and its mode in the ``nodeset.slinky.slurm.net/scaling-mode`` label."""

from __future__ import annotations

import pytest
from kubernetes.aio import client

from bot.domain.nodemap import SLINKY_SCALING_MODE
from bot.integrations.kubernetes.pods import pod_ref


def _pod(kind: str, labels: dict[str, str]) -> client.V1Pod:
    owner = client.V1OwnerReference(api_version="v1", kind=kind, name="owner", uid="u", controller=True)
    meta = client.V1ObjectMeta(name="p", namespace="slurm", labels=labels, owner_references=[owner])
    return client.V1Pod(metadata=meta)


@pytest.mark.parametrize(
    ("kind", "mode", "nodeset_pod", "replica"),
    [
        ("NodeSet", "StatefulSet", True, True),
        ("NodeSet", "DaemonSet", True, False),
        ("DaemonSet", None, False, False),
        ("ReplicaSet", None, False, False),
    ],
)
def test_a_nodesets_slurmd_pod_is_known_in_either_scaling_mode(
    kind: str, mode: str | None, nodeset_pod: bool, replica: bool
) -> None:
    ref = pod_ref(_pod(kind, {SLINKY_SCALING_MODE: mode} if mode else {}))
    assert (ref.owner_kind, ref.nodeset_pod, ref.nodeset_replica) == (kind, nodeset_pod, replica)
