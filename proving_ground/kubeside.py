"""The demo's cluster: the Kubernetes API emulator behind pitcrew's real Kubernetes adapter.

``KubernetesFarSide`` starts the emulator (``proving_ground.kubernetes``) on its own thread with one GPU
node per Slurm node (labels ``nvidia.com/gpu.present=true``, 8 GPUs, its CAPI Machine), a
DaemonSet pod, a mirror pod and a training worker on each (a budget over the workers), and
points pitcrew at it: ``integrations.cluster: kubernetes``, a kubeconfig to the emulator,
``kubernetes.replace.strategy: cluster-api``, Job templates for a GPU reset and a reboot.
Everything it reports comes from the emulator's request log and objects: which nodes pitcrew
cordoned, drained, replaced or reset, and every write it sent.

A deleted Machine makes the emulator's MachineSet stand-in register a new Node, NotReady; the
proving ground's replacement controller turns it Ready (``node_ready``) once the configured
delay has passed and the Slurm node it carries has registered again. The notifier half of
``FarSide`` is Slack's (``SlackFarSide`` wraps this one); on its own this far side tells no one.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from proving_ground.farside import Notice
from proving_ground.kubernetes.emulator import EMULATED_TOKEN, KubeEmulator
from proving_ground.kubernetes.faults import LoggedRequest
from proving_ground.kubernetes.world import KubeWorld, demo_fleet, settings_for
from proving_ground.pitcrew import Pitcrew
from proving_ground.proc import DemoError

#: Seconds from a Machine's deletion until its successor Node registers (NotReady) at the emulator.
REGISTER_DELAY = 0.5
#: Request verbs that change nothing.
READS = frozenset({"get", "list", "watch"})
#: The privileged Job a GPU reset or reboot runs (pitcrew pins it to the node and adds its env).
_JOB = {
    "spec": {
        "backoffLimit": 0,
        "template": {
            "spec": {
                "hostPID": True,
                "restartPolicy": "Never",
                "containers": [
                    {
                        "name": "{action}",
                        "image": "nvcr.io/nvidia/cuda:12.4.1-base-ubuntu22.04",
                        "command": ["sh", "-c", "{command}"],
                        "securityContext": {"privileged": True},
                    }
                ],
            }
        },
    }
}
_COMMANDS = {
    "reset_gpu": "nvidia-smi --gpu-reset -i $PITCREW_GPUS",
    "reboot": "chroot /host systemctl reboot",
}


class KubernetesFarSide:
    """The Kubernetes API emulator in a thread, and what pitcrew asked of it."""

    description = "Kubernetes API emulator (kmock) behind pitcrew's real Kubernetes adapter"

    def __init__(self) -> None:
        self._world: KubeWorld | None = None
        self._machines: dict[str, str] = {}  # Machine name -> the node it backs
        self._pods: dict[tuple[str, str], str] = {}  # (namespace, pod) -> node
        self._successors: dict[str, str] = {}  # replaced node -> its successor, once Ready

    # ------------------------------------------------------------------ lifecycle
    def start(self, workdir: Path, nodes: Sequence[str]) -> None:
        self._workdir = workdir / "kubernetes"
        self._workdir.mkdir(parents=True, exist_ok=True)
        self._world = KubeWorld().start()

        def seed(emulator: KubeEmulator) -> None:
            emulator.replace_delay, emulator.ready_delay = REGISTER_DELAY, None
            demo_fleet(emulator, list(nodes))

        self._world.call(seed)
        self._machines = self._world.call(_machines)
        self._pods = self._world.call(_pods)

    @property
    def world(self) -> KubeWorld:
        if self._world is None:
            raise DemoError("the Kubernetes API emulator is not running")
        return self._world

    def pitcrew(self, workdir: Path, config: Mapping[str, Any], env: Mapping[str, str], port: int) -> Pitcrew:
        templates = {}
        for action, command in _COMMANDS.items():
            path = self._workdir / f"{action}-job.yaml"
            text = yaml.safe_dump(_JOB).replace("{action}", action.replace("_", "-"))
            path.write_text(text.replace("{command}", command))
            templates[f"{action}_template"] = str(path)
        cluster = settings_for(
            self.world,
            self._workdir,
            request_timeout=5.0,
            replace={"strategy": "cluster-api"},
            jobs={**templates, "timeout": "60s"},
        )
        merged = dict(config)
        merged["integrations"] = {**dict(config.get("integrations") or {}), **cluster["integrations"]}
        merged["kubernetes"] = {**dict(config.get("kubernetes") or {}), **cluster["kubernetes"]}
        return Pitcrew(workdir, config=merged, env=env, port=port)

    def stop(self) -> None:
        if self._world is not None:
            self._world.stop()
            self._world = None

    # ------------------------------------------------------------------ what pitcrew asked for
    def log(self) -> list[LoggedRequest]:
        """Every request the emulator answered, oldest first."""
        return self.world.log()

    def writes(self) -> list[LoggedRequest]:
        """The requests that would change a real cluster (anything but get, list, watch)."""
        return [e for e in self.log() if e.verb not in READS]

    def replacements(self) -> list[str]:
        seen: list[str] = []
        for e in self.log():
            if e.resource == "machines" and e.verb == "delete" and e.status == 200 and e.name:
                node = self._machines.get(e.name)
                if node is not None and node not in seen:
                    seen.append(node)
        return seen

    def resets(self) -> list[str]:
        return [node for node, action in self._jobs() if action in ("reset_gpu", "reboot")]

    def reboots(self) -> list[str]:
        return [node for node, action in self._jobs() if action == "reboot"]

    def _jobs(self) -> list[tuple[str, str]]:
        """(node, PITCREW_ACTION) of each Job at the emulator (only pitcrew creates Jobs), oldest
        first (the emulator keeps its objects in the order they were created)."""

        def read(emulator: KubeEmulator) -> list[tuple[str, str]]:
            found = []
            for (plural, _, _), job in emulator.objects.items():
                if plural != "jobs":
                    continue
                spec = job["spec"]["template"]["spec"]
                env = {
                    e["name"]: e.get("value")
                    for c in spec.get("containers") or []
                    for e in c.get("env") or []
                }
                found.append((str(spec.get("nodeName")), str(env.get("PITCREW_ACTION"))))
            return found

        return self.world.call(read)

    def node_ready(self, node: str) -> str:
        """The successor the MachineSet registered for ``node`` turns Ready (the kubelet's report)."""
        deadline = time.monotonic() + 30
        while True:
            successor: str | None = self.world.call(lambda e: _successor(e, node))
            if successor is not None:
                break
            if time.monotonic() > deadline:
                raise DemoError(f"the emulator registered no successor for {node}'s deleted Machine")
            time.sleep(0.1)
        self.world.call(lambda e: e.set_node_condition(successor, "Ready", "True"))
        self._successors[node] = successor
        return successor

    def node_calls(self, node: str) -> list[str]:
        """Writes that reached the emulator for ``node``: cordon (and its undo), evict, replace, jobs."""
        calls: list[str] = []
        for e in self.writes():
            if e.resource == "nodes" and e.name == node:
                # pitcrew's first write to a node is its cordon; later ones annotate or undo it.
                calls.append("cordon" if e.verb == "patch" and "cordon" not in calls else f"{e.verb} node")
            elif e.resource == "pods" and self._pods.get((e.namespace or "", e.name or "")) == node:
                call = "evict" if e.subresource == "eviction" else "delete_pod"
                calls.append(call if e.status in (200, 201) else f"{call} ({e.status})")
            elif e.resource == "machines" and self._machines.get(e.name or "") == node:
                calls.append("replace")
        calls += [action for job_node, action in self._jobs() if job_node == node]
        return calls

    # ------------------------------------------------------------------ notifier half: Slack's
    def thread(self, incident_id: str | None = None) -> list[Notice]:
        return []

    def thread_opened(self, incident_id: str) -> tuple[float, str] | None:
        return None

    def approve(self, server: Pitcrew, incident_id: str) -> str:
        status, answer = server.command(f"/api/v1/incidents/{incident_id}/approve", "demo")
        if status != 200:
            raise DemoError(f"approve {incident_id} answered {status}: {answer}")
        return f"approved through pitcrew's API as demo: {answer.get('message') or answer}"

    def click_help(self, incident_id: str) -> str | None:
        return None

    def refused(self) -> list[str]:
        """Nothing to report afterwards: the emulator refuses what it does not model at the call
        (kmock's 404), and the step that made it fails there."""
        return []

    # ------------------------------------------------------------------ what a user looks at
    def state(self) -> dict[str, Any]:
        if self._world is None:
            return {}
        verbs = Counter(
            f"{e.verb} {e.resource}{'/' + e.subresource if e.subresource else ''}" for e in self.log()
        )
        return {
            "kubernetes_api": self.world.host,
            "kubeconfig": str(self._workdir / "kubeconfig"),
            "kubernetes_requests": dict(sorted(verbs.items())),
            "kubernetes_successors": dict(self._successors),
        }

    def where(self, incident_id: str | None) -> list[str]:
        if self._world is None:
            return []
        kubeconfig = self._workdir / "kubeconfig"
        return [
            f"Kubernetes    API emulator {self.world.host}; kubeconfig {kubeconfig}",
            f"              e.g. curl -H 'Authorization: Bearer {EMULATED_TOKEN}' {self.world.host}/api/v1/nodes",
        ]


def _machines(emulator: KubeEmulator) -> dict[str, str]:
    return {
        obj["metadata"]["name"]: obj["status"]["nodeRef"]["name"]
        for (plural, _, _), obj in emulator.objects.items()
        if plural == "machines"
    }


def _pods(emulator: KubeEmulator) -> dict[tuple[str, str], str]:
    return {
        (ns or "", obj["metadata"]["name"]): obj["spec"]["nodeName"]
        for (plural, ns, _), obj in emulator.objects.items()
        if plural == "pods"
    }


def _successor(emulator: KubeEmulator, node: str) -> str | None:
    """The newest Node the MachineSet stand-in registered for ``node`` (named ``<node>-<suffix>``)."""
    names = [
        name
        for (plural, _, name), obj in emulator.objects.items()
        if plural == "nodes" and name.startswith(f"{node}-")
    ]
    return names[-1] if names else None
