"""``integrations.cluster: none``: Slurm-only sites, where no Kubernetes stands behind the nodes.

``NoCluster`` is the Cluster port of a site without Kubernetes. Reads answer truthfully that
there is nothing there: no Kubernetes node (so cordon and drain find nothing to do), no
pods, no fleet count. Every call that would need Kubernetes to act — replace, reboot,
GPU reset — refuses with ``PermanentError(reason="no_cluster")``, which the engine turns into
an escalation: the node stays out of Slurm with pitcrew's reason and a human takes over.
It never pretends an action happened, so a later ``slurm_resume`` can never return a node
that nobody repaired.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import NoReturn

from bot.domain.nodemap import SlurmdPod
from bot.engine.errors import PermanentError
from bot.engine.ports import ClusterNode, PodRef

_HANDED_OVER = (
    "integrations.cluster is none (no Kubernetes): pitcrew cannot {what} {node}; a human takes over "
    "(repair the node, then resume it in Slurm)"
)


class NoCluster:
    """The Cluster port where there is no cluster: nothing to read, nothing it may pretend to do."""

    far_side = "none"

    async def node(self, name: str) -> ClusterNode | None:
        return None

    async def count_nodes(self) -> int:
        return 0

    async def pods_on_node(self, name: str) -> list[PodRef]:
        return []

    async def slurmd_pods(self, namespace: str, selector: Mapping[str, str]) -> list[SlurmdPod]:
        return []

    async def replacement_started(self, name: str, *, incident_id: str) -> bool:
        return False

    async def cancel_replacement(self, name: str, *, incident_id: str) -> bool:
        return False

    async def replace(self, name: str, *, strategy: str, incident_id: str) -> NoReturn:
        raise PermanentError(_HANDED_OVER.format(what="replace", node=name), reason="no_cluster")

    async def reboot(self, name: str, *, incident_id: str) -> NoReturn:
        raise PermanentError(_HANDED_OVER.format(what="reboot", node=name), reason="no_cluster")

    async def reset_gpu(self, name: str, gpus: Sequence[str], *, incident_id: str) -> NoReturn:
        raise PermanentError(_HANDED_OVER.format(what="reset the GPUs of", node=name), reason="no_cluster")

    # Unreachable through the engine (it reads ``node`` first and finds nothing), refused all the same.
    async def cordon(self, name: str, *, incident_id: str, reason: str) -> NoReturn:
        raise PermanentError(_HANDED_OVER.format(what="cordon", node=name), reason="no_cluster")

    async def uncordon(self, name: str, *, incident_id: str) -> NoReturn:
        raise PermanentError(_HANDED_OVER.format(what="uncordon", node=name), reason="no_cluster")

    async def set_annotations(self, name: str, annotations: Mapping[str, str | None]) -> NoReturn:
        raise PermanentError(_HANDED_OVER.format(what="annotate", node=name), reason="no_cluster")

    async def evict(self, pod: PodRef) -> NoReturn:
        raise PermanentError(_HANDED_OVER.format(what="evict pod", node=pod.ref), reason="no_cluster")

    async def delete_pod(self, pod: PodRef, *, force: bool) -> NoReturn:
        raise PermanentError(_HANDED_OVER.format(what="delete pod", node=pod.ref), reason="no_cluster")
