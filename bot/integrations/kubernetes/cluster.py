"""``KubernetesCluster``: the ``Cluster`` port on ``kubernetes.aio``, composed of its parts.

One client per process (``client.api_client``), built lazily on the first call so that
building the ports never blocks; nodes, pods, replacement and Jobs each have their own
module. This class only routes the port's methods to them and owns the client's lifetime.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence

from kubernetes.aio import client

from bot import logger
from bot.config import KubernetesSettings
from bot.domain.nodemap import SlurmdPod
from bot.engine.errors import PermanentError, Reason
from bot.engine.ports import ClusterNode, Lend, OldNodeLook, PodRef, Probe
from bot.integrations.kubernetes import probe as probing
from bot.integrations.kubernetes.client import Connection, TokenBucket, api_client
from bot.integrations.kubernetes.events import Events
from bot.integrations.kubernetes.jobs import Jobs
from bot.integrations.kubernetes.lending import Lending
from bot.integrations.kubernetes.nodes import Nodes
from bot.integrations.kubernetes.pods import Pods
from bot.integrations.kubernetes.replace import Replacer, run_command
from bot.integrations.kubernetes.termination import Termination
from bot.store.lease import Fence

log = logger(__name__)


class _Parts:
    def __init__(
        self, api: client.ApiClient, settings: KubernetesSettings, machines: client.ApiClient | str | None
    ) -> None:
        self.api = api
        self.machines_api = None if isinstance(machines, str) else machines
        self.nodes = Nodes(api, gpu_resource=settings.gpu_resource, timeout=settings.request_timeout)
        self.pods = Pods(api, never_drain=settings.never_drain_namespaces, timeout=settings.request_timeout)
        self.replacer = Replacer(api, self.nodes, settings, machines)
        self.jobs = Jobs(api, settings)
        self.events = Events(api, timeout=settings.request_timeout)
        self.termination = Termination(api, self.replacer, timeout=settings.request_timeout)
        self.lending = Lending(self.nodes)


class KubernetesCluster:
    """The real cluster. ``api`` may be given (tests, a shared client); else built from settings."""

    far_side = "kubernetes"

    def __init__(
        self, settings: KubernetesSettings, api: client.ApiClient | None = None, fence: Fence | None = None
    ) -> None:
        self.settings = settings
        self._fence = fence
        self.bucket = TokenBucket(settings.qps, settings.burst)
        self._api = api
        self._parts: _Parts | None = None
        self._lock = asyncio.Lock()

    async def _p(self) -> _Parts:
        if self._parts is None:
            async with self._lock:
                if self._parts is None:
                    api = self._api or await api_client(self.settings, self.bucket, fence=self._fence)
                    self._parts = _Parts(api, self.settings, await self._machines_client())
        return self._parts

    async def _machines_client(self) -> client.ApiClient | str | None:
        """The management cluster's client (``kubernetes.cluster_api``), sharing the rate limit;
        ``None``: Machines are in the workload cluster; a string: why it could not be built (the
        workload cluster stays usable, and every Machine request names this)."""
        capi = self.settings.cluster_api
        if not capi.separate:
            return None
        where = Connection(False, capi.kubeconfig or self.settings.kubeconfig, capi.context)
        try:
            return await api_client(self.settings, self.bucket, where, self._fence)
        except Exception as exc:  # the library's ConfigException, a missing file (OSError), bad YAML
            log.warning("kubernetes.cluster_api: no client for the management cluster: %s", exc)
            return f"kubernetes.cluster_api: no client for the management cluster: {exc}"

    async def warm(self) -> None:
        """Build the client now (no request is sent): building it costs over a second of the
        client library's own set-up, which the first incident would otherwise wait for. A
        failure here is logged; the first call reports it again as a step error."""
        try:
            await self._p()
        except Exception as exc:
            log.warning("kubernetes client not built at start: %s", exc)

    async def aclose(self) -> None:
        if self._parts is not None and self._parts.machines_api is not None:
            await self._parts.machines_api.close()
        if self._parts is not None and self._api is None:
            await self._parts.api.close()
        self._parts = None

    # ------------------------------------------------------------------ nodes
    async def node(self, name: str) -> ClusterNode | None:
        return await (await self._p()).nodes.node(name)

    async def count_nodes(self) -> int:
        return len(await (await self._p()).nodes.fleet_facts(self.settings.node_selector))

    async def nodes(self) -> list[ClusterNode]:
        return await (await self._p()).nodes.fleet_facts(self.settings.node_selector)

    async def cordon(self, name: str, *, incident_id: str, reason: str) -> None:
        parts = await self._p()
        if await parts.nodes.cordon(name, incident_id=incident_id):
            await parts.events.on_node(
                name, "PitcrewCordon", f"{reason} (incident {incident_id})", incident_id
            )

    async def uncordon(self, name: str, *, incident_id: str) -> None:
        parts = await self._p()
        if await parts.nodes.uncordon(name, incident_id=incident_id):
            await parts.events.on_node(
                name, "PitcrewUncordon", f"cordon of incident {incident_id} undone", incident_id
            )

    async def set_annotations(self, name: str, annotations: Mapping[str, str | None]) -> None:
        await (await self._p()).nodes.annotate(name, annotations)

    async def set_labels(self, name: str, labels: Mapping[str, str | None]) -> None:
        await (await self._p()).nodes.label(name, labels)

    # ---------------------------------------------------------------- lending
    async def pool_nodes(self, selector: str) -> list[ClusterNode]:
        return await (await self._p()).lending.pool_nodes(selector)

    async def lend(self, name: str, lend: Lend) -> bool:
        parts = await self._p()
        if not await parts.lending.lend(name, lend):
            return False
        await parts.events.on_node(name, "PitcrewLend", "lent to a stalled Slurm job", lend.incident_id)
        return True

    async def join(self, name: str, labels: Mapping[str, str], *, incident_id: str) -> bool:
        return await (await self._p()).lending.join(name, labels, incident_id=incident_id)

    async def lend_back(self, name: str, *, incident_id: str) -> bool:
        parts = await self._p()
        if not await parts.lending.lend_back(name, incident_id=incident_id):
            return False
        await parts.events.on_node(name, "PitcrewLendBack", "given back to its pool", incident_id)
        return True

    async def keep_lent(self, name: str, *, incident_id: str) -> bool:
        return await (await self._p()).lending.keep_lent(name, incident_id=incident_id)

    async def pool_command(self, name: str, argv: Sequence[str], *, incident_id: str, limit: float) -> str:
        return await run_command(argv, name, incident_id, "pool", limit)

    # ------------------------------------------------------------------- pods
    async def pods_on_node(self, name: str) -> list[PodRef]:
        return await (await self._p()).pods.on_node(name)

    async def slurmd_pods(self, namespace: str, selector: Mapping[str, str]) -> list[SlurmdPod]:
        return await (await self._p()).pods.slurmd(namespace, selector)

    async def evict(self, pod: PodRef) -> None:
        await (await self._p()).pods.evict(pod)

    async def delete_pod(self, pod: PodRef, *, force: bool) -> None:
        if force and not self.settings.force_delete_not_ready:
            raise PermanentError(
                f"force delete of pod {pod.ref} refused: kubernetes.force_delete_not_ready is false",
                reason=Reason.NOT_ALLOWED,
            )
        await (await self._p()).pods.delete(pod, force=force)

    # ---------------------------------------------------------------- replace
    async def replace(
        self,
        name: str,
        *,
        strategy: str,
        incident_id: str,
        slurm_nodes: Sequence[str] = (),
        nodeset_pods: Sequence[str] = (),
    ) -> str:
        parts = await self._p()
        handle = await parts.replacer.replace(
            name,
            strategy=strategy,
            incident_id=incident_id,
            slurm_nodes=slurm_nodes,
            nodeset_pods=nodeset_pods,
        )
        if not handle.startswith("watch "):
            await parts.events.on_node(name, "PitcrewReplace", f"replacement started: {handle}", incident_id)
        return handle

    async def replacement_started(self, name: str, *, incident_id: str) -> bool:
        return await (await self._p()).replacer.started(name, incident_id=incident_id)

    async def replacement_handle(self, name: str, *, strategy: str) -> str | None:
        return await (await self._p()).replacer.handle(name, strategy=strategy)

    async def cancel_replacement(self, name: str, *, incident_id: str) -> bool:
        return await (await self._p()).replacer.cancel(name, incident_id=incident_id)

    async def repair_owner(self, name: str) -> str | None:
        return await (await self._p()).replacer.repair_owner(name)

    async def successor(self, name: str, *, handle: str | None) -> ClusterNode | None:
        parts = await self._p()
        return await parts.replacer.successor(name, handle=handle, fleet_selector=self.settings.node_selector)

    async def held_up(self, name: str, *, handle: str) -> str | None:
        return await (await self._p()).replacer.held_up(name, handle=handle)

    async def termination_held(self, name: str, *, handle: str) -> OldNodeLook:
        return await (await self._p()).termination.held(name, handle=handle)

    # ------------------------------------------------------------------- jobs
    async def reboot(self, name: str, *, incident_id: str, rung: str = "") -> str:
        """Reboot through the operator's Job or command; the handle names the boot id that must change."""
        parts = await self._p()
        handle = await parts.replacer.reboot_handle(name)
        try:
            await parts.jobs.run("reboot", name, incident_id, rung)
        except PermanentError as exc:
            # A reboot takes its own Job's pod down with the node: the Job fails while the reboot
            # succeeded. A changed boot id is the proof; without it the failure stands.
            if exc.reason != "job_failed" or not await parts.replacer.rebooted(name, handle):
                raise
            log.info("reboot Job of %s ended with the node's reboot (new boot id): %s", name, exc)
        await parts.events.on_node(name, "PitcrewReboot", "node reboot issued", incident_id)
        return handle

    async def reset_gpu(self, name: str, gpus: Sequence[str], *, incident_id: str, rung: str = "") -> None:
        parts = await self._p()
        await parts.jobs.run("reset_gpu", name, incident_id, rung, gpus)
        await parts.events.on_node(
            name, "PitcrewResetGPU", f"GPU reset: {', '.join(gpus) or 'all'}", incident_id
        )

    async def validate(self, name: str, *, incident_id: str, rung: str = "") -> bool | None:
        """The operator's validation Job on the node: ``None`` when none is configured."""
        return await (await self._p()).jobs.run("validation", name, incident_id, rung, optional=True)

    # ------------------------------------------------------------------ probe
    async def probe(self) -> Probe:
        parts = await self._p()
        return await probing.probe(parts.api, self.settings, parts.replacer, parts.machines_api)
