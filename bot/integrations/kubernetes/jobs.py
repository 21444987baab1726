"""GPU reset, reboot and validation as a privileged Job pinned to the node, or an operator command.

The Job comes from an operator-supplied template; pitcrew only fills in a name derived from
the incident and the run (``job_name``: a retried or resumed step finds the Job it created
instead of creating a second; a later rung of the repair ladder makes its own), ``nodeName``,
tolerations of its own taint, of the cordon and of every ``NoExecute`` taint, and the PITCREW_*
environment. It waits for the Job's terminal condition (``Complete``/``Failed``, or the
``SuccessCriteriaMet``/``FailureTarget`` the Job controller writes first since 1.31), never for a
pod count: with ``backoffLimit > 0`` a first failed pod is not the Job's verdict. A Job whose pod
is never created (Pod Security refusing a privileged pod, a quota) has no condition at all: its
controller only records ``FailedCreate`` events, which the wait reads so the step names the cause
within a poll or two instead of waiting out its budget.
"""

from __future__ import annotations

import asyncio
import copy
import hashlib
import math
import re
import time
from collections.abc import Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any

import pydantic
from kubernetes.aio import client

from bot.config import JOB_RESTART_POLICIES, ConfigError, KubernetesSettings, read_job_template
from bot.config_sections import JOB_ACTIONS, KubernetesJobSettings
from bot.domain.ownership import OWNER_ANNOTATION, RUNG_ANNOTATION, fault_taint
from bot.engine.errors import PermanentError, Reason, TransientError
from bot.integrations.kubernetes.client import call
from bot.integrations.kubernetes.replace import run_command

#: How often a running Job is read (its own requests count against the shared rate limit).
POLL_SECONDS = 1.0
#: Seconds a Job is waited for past its deadline: the Job controller fails it at the deadline
#: (``DeadlineExceeded``), within a sync or two.
DEADLINE_GRACE = 15.0
#: The actions whose Job pitcrew gives a deadline (``kubernetes.jobs.timeout``) where the template
#: sets none: a GPU reset takes seconds, and one that hangs on a GPU gone bad would hold the node.
#: Not a reboot, whose pod ends with the node and whose verdict is the new boot id (a server with
#: eight GPUs can take over ten minutes to boot): a deadline would fail a slow boot. Not a
#: validation, whose length is the site's diagnostic (``dcgmi diag -r 3`` runs for tens of
#: minutes): its template says, with ``activeDeadlineSeconds`` of its own.
DEADLINED = frozenset({"reset_gpu"})
_SUCCEEDED = ("Complete", "SuccessCriteriaMet")
_FAILED = ("Failed", "FailureTarget")


def verdict(job: client.V1Job) -> tuple[bool, str] | None:
    """``(succeeded, why)`` from the Job's terminal conditions; None while it is undecided."""
    for condition in (job.status.conditions if job.status else None) or []:
        if condition.status != "True" or condition.type not in (*_SUCCEEDED, *_FAILED):
            continue
        why = ": ".join(filter(None, (condition.reason, condition.message))) or condition.type
        return condition.type in _SUCCEEDED, why
    return None


def job_name(action: str, incident_id: str, node: str, rung: str) -> str:
    """The Job of one run of ``action``: the incident's, on ``node``, in the repair ladder's ``rung``
    (the incident's playbook). A retried call finds the Job its first made (409 ``AlreadyExists``,
    then its verdict is read); a later rung of the same incident (a validation after the reboot
    that followed a reset, on the replacement after a reboot) or another node makes its own, and
    never reads an earlier run's verdict as its own. The incident stays readable in the name; the
    run is a digest of the node and the rung (``RUNG_ANNOTATION`` names the rung)."""
    slug = re.sub(r"[^a-z0-9-]", "-", incident_id.lower()).strip("-")
    run = hashlib.sha256(f"{node}\n{rung}".encode()).hexdigest()[:6]
    head = f"pitcrew-{action.replace('_', '-')}-{slug}"[: 63 - len(run) - 1].rstrip("-")
    return f"{head}-{run}"


def templates(settings: KubernetesJobSettings) -> dict[str, dict[str, Any]]:
    """The configured Job templates by action (``JOB_ACTIONS``), each read and checked
    (``bot.config.read_job_template``, which raises ``ConfigError``)."""
    return {
        action: template
        for action in JOB_ACTIONS
        if (template := _read_template(settings, action)) is not None
    }


def _read_template(settings: KubernetesJobSettings, action: str) -> dict[str, Any] | None:
    path: Path | None = getattr(settings, f"{action}_template")
    return None if path is None else read_job_template(path, f"kubernetes.jobs.{action}_template")


def containers(pod: dict[str, Any]) -> list[dict[str, Any]]:
    """A pod spec's init containers, then its containers."""
    return [*(pod.get("initContainers") or []), *(pod.get("containers") or [])]


def _quantities(pod: dict[str, Any]) -> None:
    """Resource quantities a template writes as YAML numbers (``cpu: 2``, ``nvidia.com/gpu: 8``), as
    the strings the client's models take. The API server takes either, so sites write numbers; the
    client refuses them before sending. Containers', init containers' and the pod's own resources,
    and the pod's overhead."""
    maps: list[dict[str, Any]] = [pod.get("overhead") or {}]
    for owner in [pod, *containers(pod)]:
        resources = owner.get("resources") or {}
        maps += [resources.get("limits") or {}, resources.get("requests") or {}]
    for amounts in maps:
        for resource, amount in amounts.items():
            if isinstance(amount, int | float) and not isinstance(amount, bool):
                amounts[resource] = str(amount)


def pinned_job(
    template: dict[str, Any],
    *,
    name: str,
    namespace: str,
    node: str,
    env: dict[str, str],
    rung: str = "",
    keep: timedelta | None = None,
    deadline: timedelta | None = None,
) -> dict[str, Any]:
    """The template with pitcrew's name, node pinning, tolerations and environment filled in (and its
    quantities as the client sends them, ``_quantities``); ``keep``: how long Kubernetes keeps it
    once finished (``ttlSecondsAfterFinished``; ``None``: for ever); ``deadline``: how long it may
    run before the Job controller stops it, where the template sets none (``activeDeadlineSeconds``:
    a reset that hangs on a GPU gone bad is ended, never left holding the node)."""
    job = copy.deepcopy(template)
    job.setdefault("apiVersion", "batch/v1")
    job.setdefault("kind", "Job")
    meta = job.setdefault("metadata", {})
    meta.update(name=name, namespace=namespace)
    annotations = meta.setdefault("annotations", {})
    annotations[OWNER_ANNOTATION] = env["PITCREW_INCIDENT"]
    if rung:
        annotations[RUNG_ANNOTATION] = rung
    spec = job.setdefault("spec", {})
    spec.setdefault("backoffLimit", 0)
    if keep is not None:
        spec["ttlSecondsAfterFinished"] = int(keep.total_seconds())
    if deadline is not None:
        spec.setdefault("activeDeadlineSeconds", max(math.ceil(deadline.total_seconds()), 1))
    pod = spec.setdefault("template", {}).setdefault("spec", {})
    pod["nodeName"] = node
    pod["restartPolicy"] = pod.get("restartPolicy") or JOB_RESTART_POLICIES[0]
    _quantities(pod)
    taint = fault_taint()
    pod["tolerations"] = [
        *(pod.get("tolerations") or []),
        {"key": taint.key, "operator": "Exists", "effect": taint.effect},
        {"key": "node.kubernetes.io/unschedulable", "operator": "Exists", "effect": "NoSchedule"},
        # Every NoExecute taint: the kubelet refuses a pod bound to a node with one it does not
        # tolerate, and a node under repair may carry another tool's (a health checker's quarantine).
        {"operator": "Exists", "effect": "NoExecute"},
    ]
    for container in pod.get("containers") or []:
        container["env"] = [*(container.get("env") or []), *({"name": k, "value": v} for k, v in env.items())]
    return job


class Jobs:
    def __init__(self, api: client.ApiClient, settings: KubernetesSettings) -> None:
        self._batch = client.BatchV1Api(api)
        self._core = client.CoreV1Api(api)
        self._settings = settings.jobs
        self._timeout = settings.request_timeout
        #: Each action's template, read at its first use (``_template``): the configuration's load
        #: checked it; one changed since fails that action's steps, never the rest of the cluster's.
        self._templates: dict[str, dict[str, Any] | None] = {}

    async def run(
        self,
        action: str,
        node: str,
        incident_id: str,
        rung: str,
        gpus: Sequence[str] = (),
        *,
        optional: bool = False,
    ) -> bool | None:
        """Run ``action`` on ``node`` to its end, in the repair ladder's ``rung`` (``job_name``):
        ``True`` on success; ``None`` if ``optional`` and nothing is configured for it; a failed Job
        or command raises ``PermanentError``."""
        template = self._template(action)
        command: list[str] = getattr(self._settings, f"{action}_command", None) or []
        budget = self._settings.timeout.total_seconds()
        env = {"PITCREW_NODE": node, "PITCREW_INCIDENT": incident_id, "PITCREW_ACTION": action}
        env["PITCREW_GPUS"] = ",".join(gpus)
        if template is not None:
            await self._job(action, node, incident_id, rung, template, env, budget)
            return True
        if command:
            await run_command(command, node, incident_id, action, budget)
            return True
        if optional:
            return None
        raise PermanentError(
            f"no kubernetes.jobs.{action}_template or {action}_command is configured",
            reason=Reason.MISCONFIGURED,
        )

    def _template(self, action: str) -> dict[str, Any] | None:
        """``action``'s template, read once (``None``: none configured); one that no longer reads
        as a Job is a misconfiguration of that action, named, with nothing sent."""
        if action not in self._templates:
            try:
                self._templates[action] = _read_template(self._settings, action)
            except ConfigError as exc:
                raise PermanentError(str(exc), reason=Reason.MISCONFIGURED) from None
        return self._templates[action]

    async def _job(
        self,
        action: str,
        node: str,
        incident_id: str,
        rung: str,
        template: dict[str, Any],
        env: dict[str, str],
        budget: float,
    ) -> None:
        namespace, name = self._settings.namespace, job_name(action, incident_id, node, rung)
        body = pinned_job(
            template,
            name=name,
            namespace=namespace,
            node=node,
            env=env,
            rung=rung,
            keep=self._settings.keep_finished,
            deadline=self._settings.timeout if action in DEADLINED else None,
        )
        try:
            creating = self._batch.create_namespaced_job(namespace, body, _request_timeout=self._timeout)
            await call(f"create Job {namespace}/{name}", creating)
        except pydantic.ValidationError as exc:  # the client's models refuse it before sending
            raise PermanentError(
                f"kubernetes.jobs.{action}_template is not a Job the client can send: {exc}",
                reason=Reason.MISCONFIGURED,
            ) from exc
        except TransientError as exc:
            if exc.reason != Reason.CONFLICT:  # 409 AlreadyExists: created before a retry or restart
                raise
        # The Job controller ends one with a deadline (``activeDeadlineSeconds``: the budget, unless
        # the template set its own): waited for a little longer, its verdict is read, not a timeout.
        grace = DEADLINE_GRACE if "activeDeadlineSeconds" in body["spec"] else 0.0
        deadline = time.monotonic() + budget + grace
        while time.monotonic() < deadline:
            job = await call(
                f"read Job {namespace}/{name}",
                self._batch.read_namespaced_job(name, namespace, _request_timeout=self._timeout),
            )
            decided = verdict(job)
            if decided is not None and decided[0]:
                return
            if decided is not None:
                raise PermanentError(
                    f"{action} Job {namespace}/{name} on {node} failed ({decided[1]}): "
                    f"{await self._exit(namespace, name)}",
                    reason=Reason.JOB_FAILED,
                )
            if not (job.status and job.status.active):
                refused = await self._not_created(namespace, job)
                if refused:
                    raise PermanentError(
                        f"{action} Job {namespace}/{name} on {node} cannot start its pod: {refused}",
                        reason=Reason.JOB_FAILED,
                    )
            await asyncio.sleep(POLL_SECONDS)
        raise TransientError(
            f"{action} Job {namespace}/{name} on {node} still running after {budget:g}s",
            reason=Reason.TIMEOUT,
        )

    async def _not_created(self, namespace: str, job: client.V1Job) -> str | None:
        """The Job controller's last ``FailedCreate`` event on this Job (this uid), if any."""
        meta = job.metadata
        selector = f"involvedObject.kind=Job,involvedObject.name={meta.name},involvedObject.uid={meta.uid}"
        events = await call(
            f"list events of Job {meta.name}",
            self._core.list_namespaced_event(
                namespace, field_selector=f"{selector},reason=FailedCreate", _request_timeout=self._timeout
            ),
        )
        return events.items[-1].message if events.items else None

    async def _exit(self, namespace: str, name: str) -> str:
        pods = await call(
            f"list pods of Job {name}",
            self._core.list_namespaced_pod(
                namespace, label_selector=f"job-name={name}", _request_timeout=self._timeout
            ),
        )
        for pod in pods.items:
            for status in (pod.status.container_statuses if pod.status else None) or []:
                terminated = status.state.terminated if status.state else None
                if terminated is not None and terminated.exit_code:
                    return f"container {status.name} exited {terminated.exit_code} ({terminated.reason or 'Error'})"
        for pod in pods.items:  # refused before any container ran (the kubelet's admission, say)
            if pod.status and pod.status.phase == "Failed" and pod.status.reason:
                return f"pod {pod.metadata.name} {pod.status.reason}: {pod.status.message or ''}".rstrip(": ")
        return "no exit code reported"
