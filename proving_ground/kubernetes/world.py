"""The Kubernetes API emulator (``proving_ground.kubernetes.emulator``) on its own event loop in a thread,
for the demo and for tests that run pitcrew as a subprocess: pitcrew reaches it over real HTTP
through a kubeconfig.

``KubeWorld.call(fn)`` runs ``fn(emulator)`` on the emulator's loop (never touch its objects from
another thread directly); ``world.log()`` is a copy of its request log. ``gpu_fleet`` seeds
nodes named like the Slurm harness's nodes, each with its CAPI Machine, cloned from the fixtures.
"""

from __future__ import annotations

import asyncio
import copy
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import kmock
import yaml

from proving_ground.kubernetes import capi
from proving_ground.kubernetes.emulator import EMULATED_TOKEN, KubeEmulator, load_fixture
from proving_ground.kubernetes.faults import LoggedRequest

T = TypeVar("T")


def slinky_pdb(generation: int = 1, observed: int = 1) -> dict[str, Any]:
    """slurm-operator's budget: ``maxUnavailable: 0`` over slurmd pods marked busy (``pod-protect``);
    ``observed`` below ``generation`` is a budget its controller has not reconciled yet."""
    return {
        "metadata": {"name": "slurm-workers-pdb-slurm", "namespace": "slurm", "generation": generation},
        "spec": {
            "maxUnavailable": 0,
            "selector": {
                "matchLabels": {
                    "nodeset.slinky.slurm.net/pod-protect": "true",
                    "slinky.slurm.net/cluster": "slurm",
                }
            },
        },
        "status": {"observedGeneration": observed},
    }


def statefulset_slurmd(emulator: KubeEmulator, pool: str = "gpu-h100") -> str:
    """The fixture node's slurmd pod as Slinky's default scaling mode (StatefulSet) makes it, on a
    node of Karpenter NodePool ``pool``: named by its ordinal (``slurm-worker-gpu-h100-0``, also its
    Slurm node name), placed by kube-scheduler through the NodeSet template's ``nodeSelector`` (the
    NodePool) instead of pinned to the node, so the NodeSet makes it again, unbound, once it is gone
    (``KubeEmulator._nodeset_recreates``). Returns the pod's name."""
    old = emulator.objects.pop(("pods", "slurm", "slurm-worker-gpu-h100-7xk2p"))
    pod = copy.deepcopy(old)
    name = "slurm-worker-gpu-h100-0"
    pod["metadata"].update(name=name)
    pod["metadata"].pop("generateName", None)
    pod["metadata"]["labels"].update(
        {
            "nodeset.slinky.slurm.net/scaling-mode": "StatefulSet",
            "nodeset.slinky.slurm.net/pod-hostname": name,
            "nodeset.slinky.slurm.net/pod-name": name,
        }
    )
    pod["spec"].update(hostname=name, nodeSelector={"karpenter.sh/nodepool": pool})
    pod["spec"]["affinity"].pop("nodeAffinity", None)
    emulator.add("pods", pod)
    node = emulator.objects[("nodes", None, pod["spec"]["nodeName"])]
    node["metadata"]["labels"]["karpenter.sh/nodepool"] = pool
    emulator.bump(node)
    return name


def statefulset_worker(emulator: KubeEmulator, pool: str = "gpu-h100") -> tuple[str, str]:
    """A Karpenter node of NodePool ``pool`` (the fixture node and its NodeClaim) running one slurmd
    pod of a StatefulSet-mode NodeSet (``statefulset_slurmd``), protected while its Slurm node is
    busy, under slurm-operator's budget. Nothing else runs there. Returns (Kubernetes node, Slurm
    node: the pod's ordinal name)."""
    emulator.seed_namespaces()
    node = load_fixture("node-gpu.json")
    annotations = node["metadata"]["annotations"]
    for key in [k for k in annotations if k.startswith("cluster.x-k8s.io/")]:
        del annotations[key]
    annotations.pop("nodeset.slinky.slurm.net/hostname-override", None)  # a DaemonSet-mode name
    emulator.add("nodes", node)
    emulator.add("nodeclaims", load_fixture("nodeclaim-karpenter.json"))
    slurmd = next(
        p
        for p in load_fixture("pods-on-node-list.json")["items"]
        if p["metadata"]["name"].startswith("slurm-")
    )
    emulator.add("pods", slurmd)
    emulator.add("poddisruptionbudgets", slinky_pdb())
    return node["metadata"]["name"], statefulset_slurmd(emulator, pool)


def training_pdb(*, min_available: int | None = None, max_unavailable: int | None = None) -> dict[str, Any]:
    """A team's budget over its ``llama-pretrain`` workers, by ``minAvailable`` or ``maxUnavailable``."""
    budget = (
        {"minAvailable": min_available} if min_available is not None else {"maxUnavailable": max_unavailable}
    )
    return {
        "metadata": {"name": "llama-pretrain", "namespace": "training", "generation": 1},
        "spec": {
            **budget,
            "selector": {"matchLabels": {"training.kubeflow.org/job-name": "llama-pretrain"}},
        },
        "status": {"observedGeneration": 1},
    }


def write_kubeconfig(path: Path, server: str, *, exec_plugin: list[str] | None = None) -> Path:
    """A kubeconfig as an operator would have one: cluster, user with a token, current context.
    With ``exec_plugin`` (argv) the user's token comes from that plugin, as on EKS or GKE."""
    user: dict[str, Any] = {"token": EMULATED_TOKEN}
    if exec_plugin:
        user = {
            "exec": {
                "apiVersion": "client.authentication.k8s.io/v1beta1",
                "command": exec_plugin[0],
                "args": exec_plugin[1:],
                "interactiveMode": "Never",
            }
        }
    path.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "emulated", "cluster": {"server": server}}],
                "users": [{"name": "pitcrew", "user": user}],
                "contexts": [{"name": "emulated", "context": {"cluster": "emulated", "user": "pitcrew"}}],
                "current-context": "emulated",
            }
        )
    )
    return path


class KubeWorld:
    """The emulator on its own loop in a thread, listening on ``host`` (loopback unless a test's
    private network needs another address)."""

    def __init__(self, host: str = "127.0.0.1") -> None:
        self._host = host
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._stop: asyncio.Event | None = None
        self.emulator: KubeEmulator | None = None
        self._thread = threading.Thread(target=self._run, name="kube-emulator", daemon=True)

    def start(self, timeout: float = 10.0) -> KubeWorld:
        self._thread.start()
        if not self._ready.wait(timeout):
            raise RuntimeError("the Kubernetes emulator did not start")
        return self

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._loop.run_until_complete(self._serve())

    async def _serve(self) -> None:
        self._stop = asyncio.Event()
        async with KubeEmulator() as emulator, kmock.Server(emulator, host=self._host):
            self.emulator = emulator
            self._ready.set()
            await self._stop.wait()

    def stop(self) -> None:
        if self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(timeout=10)

    @property
    def host(self) -> str:
        return self.call(lambda e: e.host)

    def call(self, fn: Callable[[KubeEmulator], T], timeout: float = 10.0) -> T:
        async def run() -> T:
            assert self.emulator is not None
            return fn(self.emulator)

        return asyncio.run_coroutine_threadsafe(run(), self._loop).result(timeout)

    def log(self) -> list[LoggedRequest]:
        return self.call(lambda e: list(e.log))

    def kubeconfig(self, path: Path) -> Path:
        return write_kubeconfig(path, self.host)


def gpu_fleet(emulator: KubeEmulator, names: list[str]) -> None:
    """One fixture GPU node per name (Slurm's names), each with its own CAPI Machine."""
    emulator.seed_namespaces()
    node_template, machine_template = load_fixture("node-gpu.json"), load_fixture("machine-capi.json")
    if emulator.get("clusters", "gpu-east", "gpu-east") is None:
        emulator.add("clusters", capi.cluster("gpu-east", "gpu-east"))
    for i, name in enumerate(names):
        node = copy.deepcopy(node_template)
        machine_name = f"gpu-east-gpu-h100-x7b2n-m{i}"
        node["metadata"].update(name=name)
        node["metadata"]["labels"]["kubernetes.io/hostname"] = name
        node["metadata"]["annotations"]["cluster.x-k8s.io/machine"] = machine_name
        node["spec"]["providerID"] = f"aws:///us-east-1a/i-0{i}"
        emulator.add("nodes", node)
        machine = copy.deepcopy(machine_template)
        machine["metadata"]["name"] = machine_name
        machine["spec"]["providerID"] = node["spec"]["providerID"]
        machine["status"]["nodeRef"] = {"apiVersion": "v1", "kind": "Node", "name": name}
        emulator.add("machines", machine)


def pool_fleet(
    emulator: KubeEmulator,
    names: list[str],
    nodeset: dict[str, str],
    pool: dict[str, str],
    *,
    replace_after: float,
) -> None:
    """``gpu_fleet`` for a take from a pool: the first two nodes in the NodeSet (``nodeset``'s
    labels: the gang job's partition), the third in the pool ``pool``'s labels select; a
    replacement exists ``replace_after`` seconds after it is asked for, Ready a second later."""
    gpu_fleet(emulator, names)
    emulator.replace_delay, emulator.ready_delay = replace_after, 1.0
    for name, add in ((names[0], nodeset), (names[1], nodeset), (names[2], pool)):
        node = emulator.get("nodes", name)
        assert node is not None, name
        node["metadata"]["labels"].update(add)
        emulator.bump(node)


def karpenter_fleet(emulator: KubeEmulator, names: list[str]) -> None:
    """One Karpenter GPU node per name (Slurm's names) of NodePool ``gpu-h100``, each with its
    NodeClaim and slurmd run as a DaemonSet pod (never pending, so never demand for a new node)."""
    emulator.seed_namespaces()
    node_template, claim_template = load_fixture("node-gpu.json"), load_fixture("nodeclaim-karpenter.json")
    slurmd = next(
        p
        for p in load_fixture("pods-on-node-list.json")["items"]
        if p["metadata"]["name"].startswith("slurm-")
    )
    for i, name in enumerate(names):
        node = copy.deepcopy(node_template)
        node["metadata"].update(name=name)
        node["metadata"]["labels"].update(
            {"kubernetes.io/hostname": name, "karpenter.sh/nodepool": "gpu-h100"}
        )
        for key in [k for k in node["metadata"]["annotations"] if k.startswith("cluster.x-k8s.io/")]:
            del node["metadata"]["annotations"][key]
        node["spec"]["providerID"] = f"aws:///us-east-1a/i-0{i}"
        emulator.add("nodes", node)
        claim = copy.deepcopy(claim_template)
        claim["metadata"]["name"] = f"gpu-h100-k{i}"
        claim["status"].update(nodeName=name, providerID=node["spec"]["providerID"])
        emulator.add("nodeclaims", claim)
        pod = copy.deepcopy(slurmd)
        pod["metadata"].update(name=f"slurmd-{name}")
        pod["metadata"]["ownerReferences"] = [
            {"apiVersion": "apps/v1", "kind": "DaemonSet", "name": "slurmd", "uid": "d5", "controller": True}
        ]
        pod["metadata"]["labels"].pop("nodeset.slinky.slurm.net/pod-protect", None)
        pod["spec"]["nodeName"] = name
        emulator.add("pods", pod)


def pods_like_the_fixture(emulator: KubeEmulator, node: str, elsewhere: str) -> None:
    """On ``node``: a DaemonSet pod, a mirror pod and a training worker; a second worker on
    ``elsewhere``, NotReady, so the team's budget (minAvailable 1) refuses the first eviction."""
    by_name = {p["metadata"]["name"]: p for p in load_fixture("pods-on-node-list.json")["items"]}
    daemon = copy.deepcopy(by_name["nvidia-dcgm-exporter-7wq4n"])
    daemon["metadata"].update(name=f"node-exporter-{node}", namespace="monitoring")
    mirror = copy.deepcopy(by_name["gpu-health-agent-gpu-node-02"])
    mirror["metadata"]["name"] = f"gpu-health-agent-{node}"
    mirror["metadata"]["ownerReferences"][0]["name"] = node
    for pod in (daemon, mirror):
        pod["spec"]["nodeName"] = node
        emulator.add("pods", pod)
    for index, where in enumerate((node, elsewhere)):
        worker = copy.deepcopy(by_name["llama-pretrain-worker-2"])
        worker["metadata"]["name"] = f"llama-pretrain-worker-{index}"
        worker["metadata"]["labels"]["training.kubeflow.org/replica-index"] = str(index)
        worker["spec"]["nodeName"] = where
        if index:
            for condition in worker["status"]["conditions"]:
                if condition["type"] == "Ready":
                    condition["status"] = "False"
        emulator.add("pods", worker)
    emulator.add("poddisruptionbudgets", training_pdb(min_available=1))


def slinky_workers(
    emulator: KubeEmulator, slurm_nodes: list[str], *, machines: bool = False
) -> dict[str, str]:
    """A Slinky world: Kubernetes node ``kube-<slurm node>`` per Slurm node, each running the
    NodeSet's slurmd pod for it (busy: ``pod-protect``; DaemonSet scaling mode, the fixture's, its
    hostname the node's ``hostname-override``), and slurm-operator's budget. ``machines``: each node
    is a Cluster API Machine's (``gpu_fleet``), so a replacement is a new node under a new name.
    Returns Kubernetes node name → Slurm node name."""
    emulator.seed_namespaces()
    names = {f"kube-{slurm_node}": slurm_node for slurm_node in slurm_nodes}
    if machines:
        gpu_fleet(emulator, list(names))
    template = load_fixture("node-gpu.json")
    by_name = {p["metadata"]["name"]: p for p in load_fixture("pods-on-node-list.json")["items"]}
    for kube_node, slurm_node in names.items():
        node = emulator.get("nodes", kube_node) if machines else copy.deepcopy(template)
        assert node is not None, kube_node
        node["metadata"]["name"] = kube_node
        node["metadata"]["labels"]["kubernetes.io/hostname"] = kube_node
        node["metadata"]["annotations"]["nodeset.slinky.slurm.net/hostname-override"] = slurm_node
        if machines:
            emulator.bump(node)
        else:
            emulator.add("nodes", node)
        pod = copy.deepcopy(by_name["slurm-worker-gpu-h100-7xk2p"])
        pod["metadata"]["name"] = f"slurm-worker-{slurm_node}"
        pod["metadata"]["labels"]["nodeset.slinky.slurm.net/pod-hostname"] = slurm_node
        pod["metadata"]["labels"]["nodeset.slinky.slurm.net/pod-name"] = pod["metadata"]["name"]
        pod["spec"]["nodeName"] = kube_node
        pod["spec"]["hostname"] = slurm_node
        emulator.add("pods", pod)
    emulator.add("poddisruptionbudgets", slinky_pdb())
    return names


def pod_ready(emulator: KubeEmulator, namespace: str, name: str) -> None:
    pod = emulator.get("pods", name, namespace)
    assert pod is not None
    for condition in pod["status"]["conditions"]:
        if condition["type"] == "Ready":
            condition["status"] = "True"
    emulator.bump(pod)


def settings_for(world: KubeWorld, workdir: Path, **kubernetes: Any) -> dict[str, Any]:
    """pitcrew configuration keys for this emulator (integrations.cluster: kubernetes)."""
    workdir.mkdir(parents=True, exist_ok=True)
    return {
        "integrations": {"cluster": "kubernetes"},
        "kubernetes": {"kubeconfig": str(world.kubeconfig(workdir / "kubeconfig")), **kubernetes},
    }


def demo_fleet(emulator: KubeEmulator, names: list[str]) -> None:
    """``scripts/demo``'s cluster: ``gpu_fleet`` (one GPU node and CAPI Machine per Slurm node), and
    on each node a DaemonSet pod and a mirror pod (a drain leaves both), and a training worker of
    one PyTorchJob whose budget lets one worker at a time be evicted."""
    gpu_fleet(emulator, names)
    by_name = {p["metadata"]["name"]: p for p in load_fixture("pods-on-node-list.json")["items"]}
    for index, node in enumerate(names):
        daemon = copy.deepcopy(by_name["nvidia-dcgm-exporter-7wq4n"])
        daemon["metadata"].update(name=f"node-exporter-{node}", namespace="monitoring")
        mirror = copy.deepcopy(by_name["gpu-health-agent-gpu-node-02"])
        mirror["metadata"]["name"] = f"gpu-health-agent-{node}"
        mirror["metadata"]["ownerReferences"][0]["name"] = node
        worker = copy.deepcopy(by_name["llama-pretrain-worker-2"])
        worker["metadata"]["name"] = f"llama-pretrain-worker-{index}"
        worker["metadata"]["labels"]["training.kubeflow.org/replica-index"] = str(index)
        for pod in (daemon, mirror, worker):
            pod["spec"]["nodeName"] = node
            emulator.add("pods", pod)
    emulator.add("poddisruptionbudgets", training_pdb(max_unavailable=1))


def inference_replicas(emulator: KubeEmulator, node: str, elsewhere: str) -> list[str]:
    """An inference service (``app: vllm``, two replicas of a Deployment in ``inference``): one
    Ready on ``node``, one on ``elsewhere`` not Ready yet, and the service's budget
    (minAvailable 1), so evicting the first is refused until the second is Ready. The pods' names."""
    if ("namespaces", None, "inference") not in emulator.objects:
        emulator.add(
            "namespaces",
            {"metadata": {"name": "inference", "labels": {"kubernetes.io/metadata.name": "inference"}}},
        )
    template = {p["metadata"]["name"]: p for p in load_fixture("pods-on-node-list.json")["items"]}[
        "llama-pretrain-worker-2"
    ]
    names = []
    for index, where in enumerate((node, elsewhere)):
        pod = copy.deepcopy(template)
        name = f"vllm-7d9f8-{index}"
        pod["metadata"].update(name=name, namespace="inference", labels={"app": "vllm"})
        pod["metadata"]["ownerReferences"] = [
            {
                "apiVersion": "apps/v1",
                "kind": "ReplicaSet",
                "name": "vllm-7d9f8",
                "uid": f"rs-vllm-{index}",
                "controller": True,
            }
        ]
        pod["spec"]["nodeName"] = where
        for condition in pod["status"]["conditions"]:
            if condition["type"] == "Ready":
                condition["status"] = "False" if index else "True"
        emulator.add("pods", pod)
        names.append(name)
    emulator.add(
        "poddisruptionbudgets",
        {
            "metadata": {"name": "vllm", "namespace": "inference", "generation": 1},
            "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "vllm"}}},
            "status": {"observedGeneration": 1},
        },
    )
    return names


def nodeclaim_grace_period(k8s: KubeEmulator, grace: str | None, name: str = "gpu-h100-x7k2q") -> None:
    """The fixture NodeClaim ``name`` with ``spec.terminationGracePeriod`` ``grace`` (``None``: none,
    so Karpenter's termination waits for ever on a pod it may not evict)."""
    claim = k8s.get("nodeclaims", name)
    assert claim is not None
    claim["spec"].pop("terminationGracePeriod", None)
    if grace:
        claim["spec"]["terminationGracePeriod"] = grace


def volume_attached(k8s: KubeEmulator, node: str) -> None:
    """A CSI VolumeAttachment, attached, of PersistentVolume ``pv-1`` (bound to the claim
    ``training/llama-ckpt``) to ``node``: what Karpenter's termination (``awaitVolumeDetachment``)
    and Cluster API's Machine controller (``shouldWaitForNodeVolumes``) wait to see go after their
    drain. The attach-detach controller lists it in the Node's ``status.volumesAttached``
    (``kubernetes.io/csi/<driver>^<volumeHandle>``), what Cluster API before v1.9 waits to see empty."""
    found = k8s.get("nodes", node)
    if found is not None:
        found.setdefault("status", {})["volumesAttached"] = [
            {"name": "kubernetes.io/csi/ebs.csi.aws.com^vol-0f1e2d3c4b5a69788", "devicePath": ""}
        ]
    k8s.add(
        "persistentvolumes",
        {
            "metadata": {"name": "pv-1"},
            "spec": {
                "csi": {"driver": "ebs.csi.aws.com", "volumeHandle": "vol-0f1e2d3c4b5a69788"},
                "claimRef": {"kind": "PersistentVolumeClaim", "namespace": "training", "name": "llama-ckpt"},
            },
            "status": {"phase": "Bound"},
        },
    )
    k8s.add(
        "volumeattachments",
        {
            "metadata": {"name": "csi-0a1b"},
            "spec": {
                "attacher": "ebs.csi.aws.com",
                "nodeName": node,
                "source": {"persistentVolumeName": "pv-1"},
            },
            "status": {"attached": True},
        },
    )


def pods_karpenter_may_not_evict(k8s: KubeEmulator) -> tuple[str, str]:
    """On the fixture node: the training worker under a budget that allows no eviction (minAvailable
    1, one pod), and a notebook annotated ``karpenter.sh/do-not-disrupt``. Returns their names."""
    k8s.add("poddisruptionbudgets", training_pdb(min_available=1))
    return "training/llama-pretrain-worker-2", do_not_disrupt_pod(k8s, "notebook-0", "true")


def do_not_disrupt_pod(k8s: KubeEmulator, name: str, value: str, *, started: str | None = None) -> str:
    """A pod like the fixture node's training worker, in ``training``, annotated
    ``karpenter.sh/do-not-disrupt: <value>``, started at ``started`` (as the worker, if not given).
    Returns ``training/<name>``."""
    worker = k8s.get("pods", "llama-pretrain-worker-2", "training")
    assert worker is not None
    pod = copy.deepcopy(worker)
    pod["metadata"] = {
        "name": name,
        "namespace": "training",
        "annotations": {"karpenter.sh/do-not-disrupt": value},
    }
    if started is not None:
        pod.setdefault("status", {})["startTime"] = started
    k8s.add("pods", pod)
    return f"training/{name}"


def cluster_api_release(k8s: KubeEmulator, release: tuple[int, int]) -> None:
    """Cluster API ``release`` runs the management cluster: it serves ``cluster.x-k8s.io`` v1beta1
    only before v1.11 (v1beta2 and v1beta1 to v1.15, v1beta2 only from v1.16), and its Machine
    controller writes the conditions as that release does (``KubeEmulator.capi_release``): before
    v1.9 there is no ``status.v1beta2`` on a Machine, so the fixture's is dropped."""
    k8s.capi_release = release
    if release < (1, 11):
        k8s.capi_versions = ("v1beta1",)
    elif release >= (1, 16):
        k8s.capi_versions = ("v1beta2",)
    if release < capi.V1BETA2_CONDITIONS:
        for (kind, _, _), found in k8s.objects.items():
            if kind == "machines":
                (found.get("status") or {}).pop("v1beta2", None)
