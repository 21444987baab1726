"""``check-config --live`` for Kubernetes: the API answers, and each verb pitcrew uses is allowed.

Every permission is asked with a SelfSubjectAccessReview, the API server's own answer to
"may I?", so the probe changes nothing; the first answer also proves the server reachable and
the credentials accepted. The verbs are the adapter's (``needed``), which is
also what ``deploy/kubernetes/rbac.yaml`` grants, with the replace strategy's component
(``deploy/kubernetes/components/replace-<strategy>``).

With Job templates configured it also asks whether their pods would be admitted: a server-side
dry-run create (``dryRun=All``, nothing stored) of each rendered Job's pod in the Jobs' namespace,
which Pod Security admission (and any admission webhook) judges as it would the real pod. A Job in
a namespace that refuses privileged pods is created, and its pod never is.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import yaml
from kubernetes.aio import client

from bot.config import KubernetesSettings
from bot.engine.errors import PitcrewError
from bot.engine.ports import Probe
from bot.integrations.kubernetes.client import call
from bot.integrations.kubernetes.jobs import job_name, pinned_job


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
        ]
    elif strategy == "karpenter":
        perms += [
            Permission("list", "karpenter.sh", "nodeclaims"),
            Permission("delete", "karpenter.sh", "nodeclaims"),
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


async def probe(api: client.ApiClient, settings: KubernetesSettings) -> Probe:
    auth = client.AuthorizationV1Api(api)
    try:
        denied = []
        for perm in needed(settings):
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
    refused = await _job_pods_refused(api, settings)
    if refused:
        return Probe(
            "kubernetes",
            False,
            f"namespace {settings.jobs.namespace} would refuse the Jobs' pods (Pod Security or admission)",
            tuple(refused),
        )
    return Probe("kubernetes", True, f"API reachable; {len(needed(settings))} permissions allowed")


async def _job_pods_refused(api: client.ApiClient, settings: KubernetesSettings) -> list[str]:
    """Each configured Job template whose pod the API server would not admit, with its answer."""
    core = client.CoreV1Api(api)
    namespace, refused = settings.jobs.namespace, []
    for action in ("reset_gpu", "reboot", "validation"):
        path = getattr(settings.jobs, f"{action}_template")
        if path is None:
            continue
        template: dict[str, Any] = yaml.safe_load(path.read_text()) or {}
        env = {"PITCREW_NODE": "check-config", "PITCREW_INCIDENT": "check-config", "PITCREW_ACTION": action}
        name = job_name(action, "check-config")
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
            await call(
                f"dry-run create of the {action} Job's pod in {namespace}",
                core.create_namespaced_pod(
                    namespace, pod, dry_run="All", _request_timeout=settings.request_timeout
                ),
            )
        except PitcrewError as exc:
            refused.append(f"{action}: {exc}")
    return refused
