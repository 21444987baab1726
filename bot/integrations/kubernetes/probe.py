"""``check-config --live`` for Kubernetes: the API answers, and each verb pitcrew uses is allowed.

Every permission is asked with a SelfSubjectAccessReview, the API server's own answer to
"may I?", so the probe changes nothing; the first answer also proves the server reachable and
the credentials accepted. The verbs are the adapter's (``needed``), which is
also what ``deploy/kubernetes/rbac.yaml`` grants, with the replace strategy's component
(``deploy/kubernetes/components/replace-<strategy>``).

With Job templates configured it also asks whether their pods would be admitted: a server-side
dry-run create (``dryRun=All``, nothing stored) of each rendered Job's pod in the Jobs' namespace,
which Pod Security admission (and any admission webhook) judges as it would the real pod. A Job in
a namespace that refuses privileged pods is created, and its pod never is. A reset Job's pod that
asks the device plugin for GPUs (``nvidia.com/gpu``) is named too, read from the template alone
(``gpu_requests``): a reset needs the faulted GPU with the plugin stopped, and the plugin hands out
only healthy GPUs of its own choosing.

A kubeconfig user whose token comes from an exec plugin (EKS, GKE) is asked for a fresh one first:
its tokens expire, and a plugin that cannot run again (an expired login, a missing binary) would
leave every call after the expiry refused.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pydantic
import yaml
from kubernetes.aio import client
from kubernetes.aio.config.exec_provider import ExecProvider
from kubernetes.aio.config.kube_config import ConfigNode

from bot.config import KubernetesSettings
from bot.engine.errors import PitcrewError
from bot.engine.ports import Probe
from bot.integrations.kubernetes.client import call
from bot.integrations.kubernetes.jobs import containers, job_name, pinned_job, templates
from bot.integrations.kubernetes.replace import Replacer


@dataclass(frozen=True, slots=True)
class Permission:
    verb: str
    group: str
    resource: str
    subresource: str = ""
    namespace: str = ""

    def __str__(self) -> str:
        res = f"{self.resource}/{self.subresource}" if self.subresource else self.resource
        where = f" in {self.namespace}" if self.namespace else ""
        return f"{self.verb} {res}{'.' + self.group if self.group else ''}{where}"


def needed(settings: KubernetesSettings) -> tuple[Permission, ...]:
    """The verbs the configured adapter will use."""
    perms = [
        Permission("get", "", "nodes"),
        Permission("list", "", "nodes"),
        Permission("patch", "", "nodes"),
        Permission("list", "", "pods"),
        Permission("delete", "", "pods"),
        Permission("create", "", "pods", "eviction"),
        Permission("list", "policy", "poddisruptionbudgets"),
        Permission("create", "", "events", namespace="default"),
    ]
    strategy = settings.replace.strategy
    if strategy == "cluster-api":
        perms += [
            Permission("get", "cluster.x-k8s.io", "machines"),
            Permission("list", "cluster.x-k8s.io", "machines"),
            Permission("delete", "cluster.x-k8s.io", "machines"),
            Permission("get", "cluster.x-k8s.io", "clusters"),  # paused? (no delete while it is)
        ]
    elif strategy == "karpenter":
        perms += [
            Permission("list", "karpenter.sh", "nodeclaims"),
            Permission("delete", "karpenter.sh", "nodeclaims"),
            # the placeholder pod: made, read while the successor is awaited (bound elsewhere?),
            # and Karpenter's FailedScheduling on it read (why no node comes)
            Permission("create", "", "pods", namespace=settings.jobs.namespace),
            Permission("get", "", "pods", namespace=settings.jobs.namespace),
            Permission("list", "", "events", namespace=settings.jobs.namespace),
        ]
    elif strategy == "delete-node":
        perms += [Permission("delete", "", "nodes")]
    jobs = settings.jobs
    if jobs.reset_gpu_template or jobs.reboot_template or jobs.validation_template:
        perms += [
            Permission("create", "batch", "jobs", namespace=jobs.namespace),
            Permission("get", "batch", "jobs", namespace=jobs.namespace),
            Permission("list", "", "pods", namespace=jobs.namespace),
            Permission("list", "", "events", namespace=jobs.namespace),
            Permission("create", "", "pods", namespace=jobs.namespace),
        ]
    return tuple(perms)


def _kubeconfig_user(settings: KubernetesSettings) -> dict[str, Any]:
    """The kubeconfig user of the configured context (first file wins, as with ``$KUBECONFIG``)."""
    if settings.kubeconfig is not None:
        paths = [settings.kubeconfig]
    else:
        default = os.environ.get("KUBECONFIG") or str(Path.home() / ".kube" / "config")
        paths = [Path(p) for p in default.split(os.pathsep) if p]
    contexts: dict[str, Any] = {}
    users: dict[str, Any] = {}
    current = settings.context
    for path in paths:
        try:
            doc = yaml.safe_load(path.read_text()) or {}
        except (OSError, yaml.YAMLError):
            continue
        for item in doc.get("contexts") or []:
            contexts.setdefault(item.get("name"), item.get("context") or {})
        for item in doc.get("users") or []:
            users.setdefault(item.get("name"), item.get("user") or {})
        current = current or doc.get("current-context")
    user = users.get(str((contexts.get(current or "") or {}).get("user")))
    return user if isinstance(user, dict) else {}


async def exec_credentials_problem(settings: KubernetesSettings) -> str | None:
    """Why the kubeconfig's exec plugin (EKS, GKE) could not give a fresh credential now, or ``None``
    (it can, or there is none). Its tokens expire: the client runs it again on every 401."""
    plugin = None if settings.in_cluster else _kubeconfig_user(settings).get("exec")
    if not isinstance(plugin, dict):
        return None
    argv = " ".join([str(plugin.get("command"))] + [str(a) for a in plugin.get("args") or []])
    try:
        status = await ExecProvider(ConfigNode("exec", plugin)).run()
    except Exception as exc:  # the library's ConfigException, or the plugin missing (OSError)
        return f"exec credentials cannot be refreshed: `{argv}` failed: {exc}"
    if not (isinstance(status, dict) and (status.get("token") or status.get("clientCertificateData"))):
        return f"exec credentials cannot be refreshed: `{argv}` gave no token"
    return None


async def probe(
    api: client.ApiClient,
    settings: KubernetesSettings,
    replacer: Replacer,
    machines_api: client.ApiClient | None = None,
) -> Probe:
    problem = await exec_credentials_problem(settings)
    if problem is None and settings.cluster_api.separate:
        management = settings.model_copy(
            update={
                "kubeconfig": settings.cluster_api.kubeconfig or settings.kubeconfig,
                "context": settings.cluster_api.context,
                "in_cluster": False,
            }
        )
        problem = await exec_credentials_problem(management)
        problem = f"management cluster (kubernetes.cluster_api): {problem}" if problem else None
    if problem is not None:
        return Probe("kubernetes", False, problem)
    workload = client.AuthorizationV1Api(api)
    management_auth = client.AuthorizationV1Api(machines_api) if machines_api is not None else workload
    try:
        denied = []
        for perm in needed(settings):
            auth = management_auth if perm.group == "cluster.x-k8s.io" else workload
            review = client.V1SelfSubjectAccessReview(
                api_version="authorization.k8s.io/v1",
                kind="SelfSubjectAccessReview",
                spec=client.V1SelfSubjectAccessReviewSpec(
                    resource_attributes=client.V1ResourceAttributes(
                        verb=perm.verb,
                        group=perm.group,
                        resource=perm.resource,
                        subresource=perm.subresource or None,
                        namespace=perm.namespace or None,
                    )
                ),
            )
            answer = await call(
                f"review {perm}",
                auth.create_self_subject_access_review(review, _request_timeout=settings.request_timeout),
            )
            if not (answer.status and answer.status.allowed):
                denied.append(str(perm))
    except PitcrewError as exc:
        return Probe("kubernetes", False, f"API server not usable: {exc}")
    if denied:
        return Probe("kubernetes", False, f"{len(denied)} permission(s) missing", tuple(denied))
    found = ""
    if settings.replace.strategy == "cluster-api":
        try:
            missing, checked = await replacer.machines_not_found(settings.node_selector)
        except PitcrewError as exc:
            missing, checked = [f"fleet nodes not listed: {exc}"], 0
        found = f"; the Machines of {checked} fleet node(s) found"
        if missing:
            return Probe(
                "kubernetes",
                False,
                f"{len(missing)} fleet node(s) whose Cluster API Machine cannot be found",
                tuple(missing),
            )
    configured = templates(settings.jobs)
    asking = _reset_asks_for_gpus(configured.get("reset_gpu"), settings.gpu_resource)
    if asking:
        return Probe(
            "kubernetes", False, "the reset_gpu Job template asks the device plugin for GPUs", tuple(asking)
        )
    refused = await _job_pods_refused(api, settings, configured)
    if refused:
        return Probe(
            "kubernetes",
            False,
            f"namespace {settings.jobs.namespace} would refuse the Jobs' pods (Pod Security or admission)",
            tuple(refused),
        )
    return Probe("kubernetes", True, f"API reachable; {len(needed(settings))} permissions allowed{found}")


#: The extended resources the NVIDIA device plugin serves GPUs as: whole GPUs, time-sliced ones
#: renamed (``nvidia.com/gpu.shared``) and MIG slices (``nvidia.com/mig-1g.10gb``).
_DEVICE_PLUGIN_GPUS = ("nvidia.com/gpu", "nvidia.com/mig-")


def gpu_requests(template: dict[str, Any], gpu_resource: str = "nvidia.com/gpu") -> list[str]:
    """Each container of a Job template's pod (init containers too) that asks the device plugin for
    GPUs (``gpu_resource``, the site's name for them, or one of ``_DEVICE_PLUGIN_GPUS``), with the
    resource it asks for. A GPU reset's pod must not: ``nvidia-smi --gpu-reset`` is refused while
    the plugin holds the GPU, so the reset runs with it stopped, when its GPUs are no longer
    offered; and while it runs it offers only GPUs it finds healthy, allocated as it chooses, never
    the faulted one (``PITCREW_GPUS``). The reset's container gets the device files instead
    (``hostPath``); the README says what else a reset needs on a GPU Operator node."""
    pod = ((template.get("spec") or {}).get("template") or {}).get("spec") or {}
    found = []
    for container in containers(pod):
        resources = container.get("resources") or {}
        asked = {**(resources.get("limits") or {}), **(resources.get("requests") or {})}
        for resource in sorted(asked):
            if str(resource).startswith((*_DEVICE_PLUGIN_GPUS, gpu_resource)):
                found.append(f"container {container.get('name', '?')} requests {resource}")
    return found


def _reset_asks_for_gpus(template: dict[str, Any] | None, gpu_resource: str) -> list[str]:
    """``gpu_requests`` of the reset's template (``None``: none configured), as the probe names them."""
    if template is None:
        return []
    asked = gpu_requests(template, gpu_resource)
    why = (
        "a reset needs the faulted GPU with the device plugin stopped: mount /dev/nvidia* (hostPath) instead"
    )
    return [f"reset_gpu: {one}: {why}" for one in asked]


async def _job_pods_refused(
    api: client.ApiClient, settings: KubernetesSettings, configured: dict[str, dict[str, Any]]
) -> list[str]:
    """Each of the ``configured`` Job templates (by action) whose pod the API server would not
    admit, with its answer."""
    core = client.CoreV1Api(api)
    namespace, refused = settings.jobs.namespace, []
    for action, template in configured.items():
        env = {"PITCREW_NODE": "check-config", "PITCREW_INCIDENT": "check-config", "PITCREW_ACTION": action}
        name = job_name(action, "check-config", "check-config", "")
        job = pinned_job(
            template, name=name, namespace=namespace, node="check-config", env={**env, "PITCREW_GPUS": ""}
        )
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                **(job["spec"]["template"].get("metadata") or {}),
                "name": name,
                "namespace": namespace,
            },
            "spec": job["spec"]["template"]["spec"],
        }
        try:
            creating = core.create_namespaced_pod(
                namespace, pod, dry_run="All", _request_timeout=settings.request_timeout
            )
            await call(f"dry-run create of the {action} Job's pod in {namespace}", creating)
        except pydantic.ValidationError as exc:  # the client's models refuse it before sending
            refused.append(f"{action}: not a pod the client can send: {exc}")
        except PitcrewError as exc:
            refused.append(f"{action}: {exc}")
    return refused
