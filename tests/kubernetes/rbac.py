"""Compare the requests a client sent with the RBAC objects that are meant to allow them.

``compare(requests, documents)`` takes the emulator's request log (or anything with ``verb``,
``api_group``, ``resource``, ``subresource``, ``namespace``) and the YAML documents of an RBAC
manifest — ``deploy/kubernetes/rbac.yaml`` or a rendered kustomize build — and returns the requests
no rule bound to the ServiceAccount allows, and the (role, group, resource, verb) grants no request
used. Only Roles/ClusterRoles bound to the subject count; a RoleBinding grants in its namespace only.
Wildcards (``*``) are refused outright: least privilege is the point.

``tour`` drives every operation of pitcrew's adapter once against an emulator (with every replace
strategy, or only the given ones) and ``pitcrew_requests`` keeps the requests pitcrew sent (its
User-Agent), so a check of another rendering of the manifest (kustomize) can compare the same
requests: ``compare(pitcrew_requests(emulator.log), documents)``.

The replace strategies' grants are kustomize components (``deploy/kubernetes/components/``):
``load_all_strategies()`` is the base's rbac.yaml with every component, and
``for_strategy(requests, strategy)`` drops the requests only another strategy sends (the ones the
adapter declares for that strategy alone, ``bot.integrations.kubernetes.probe.needed``), so the
session's recorded requests can be held against one strategy's rendering.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import pytest
import yaml

from bot.config import KubernetesSettings
from bot.engine.errors import PermanentError
from bot.engine.ports import PodRef
from bot.integrations.kubernetes import KubernetesCluster
from bot.integrations.kubernetes.jobs import job_name
from bot.integrations.kubernetes.probe import Permission, needed
from proving_ground.kubernetes import resources
from proving_ground.kubernetes.emulator import KubeEmulator
from proving_ground.kubernetes.faults import LoggedRequest
from proving_ground.kubernetes.world import training_pdb
from proving_ground.proc import eventually

REPO = Path(__file__).resolve().parents[2]
RBAC_YAML = REPO / "deploy" / "kubernetes" / "rbac.yaml"
#: The strategies that need a grant of their own, each a component under deploy/kubernetes/components/.
STRATEGIES = ("cluster-api", "karpenter", "delete-node")


def component_rbac(strategy: str) -> Path:
    return REPO / "deploy" / "kubernetes" / "components" / f"replace-{strategy}" / "rbac.yaml"


class Request(Protocol):
    # Read-only: a frozen ``Asked`` is a request as much as a logged one.
    @property
    def verb(self) -> str: ...
    @property
    def api_group(self) -> str: ...
    @property
    def resource(self) -> str: ...
    @property
    def subresource(self) -> str | None: ...
    @property
    def namespace(self) -> str | None: ...


@dataclass(frozen=True)
class Asked:
    """A request described rather than logged (e.g. one of the adapter's declared permissions)."""

    verb: str
    api_group: str
    resource: str
    subresource: str | None = None
    namespace: str | None = None


@dataclass(frozen=True)
class Grant:
    role: str
    namespace: str | None  # None: cluster-wide (ClusterRole through a ClusterRoleBinding)
    api_group: str
    resource: str  # "pods" or "pods/eviction"
    verb: str

    def allows(self, request: Request) -> bool:
        resource = request.resource + (f"/{request.subresource}" if request.subresource else "")
        return (
            self.api_group == request.api_group
            and self.resource == resource
            and self.verb == request.verb
            and (self.namespace is None or self.namespace == request.namespace)
        )


@dataclass(frozen=True)
class Comparison:
    denied: tuple[str, ...]
    unused: tuple[Grant, ...]


def pitcrew_requests(log: list[LoggedRequest]) -> list[LoggedRequest]:
    return [e for e in log if e.user_agent.startswith("pitcrew/")]


NODE = "gpu-node-02"


async def tour(
    make: Callable[..., KubernetesCluster],
    k8s: KubeEmulator,
    tmp_path: Path,
    strategies: tuple[str, ...] = STRATEGIES,
) -> None:
    """Every operation of the adapter once, then a replacement with each of ``strategies``."""
    template = tmp_path / "job.yaml"
    template.write_text(
        yaml.safe_dump({"spec": {"template": {"spec": {"containers": [{"name": "x", "image": "x"}]}}}})
    )
    # The probe reads the fleet's Machines with cluster-api: only a rendering granting it may do so.
    cluster = make(
        replace={"strategy": "cluster-api" if "cluster-api" in strategies else "none"},
        jobs={"reset_gpu_template": template},
        force_delete_not_ready=True,
    )
    assert (await cluster.probe()).ok
    await cluster.count_nodes()
    await cluster.cordon(NODE, incident_id="pc-1", reason="r")
    await cluster.uncordon(NODE, incident_id="pc-1")
    pods = await cluster.pods_on_node(NODE)
    k8s.add("poddisruptionbudgets", training_pdb(max_unavailable=1))
    k8s.add(
        "poddisruptionbudgets",
        {**training_pdb(max_unavailable=1), "metadata": {"name": "second", "namespace": "training"}},
    )
    with pytest.raises(PermanentError):  # under two budgets: both are named
        await cluster.evict(PodRef("training", "llama-pretrain-worker-2"))
    k8s.objects.pop(("poddisruptionbudgets", "training", "second"))
    await cluster.evict(PodRef("training", "llama-pretrain-worker-2"))
    await cluster.delete_pod(pods[0], force=True)
    await cluster.slurmd_pods("slurm", {"app.kubernetes.io/name": "slurmd"})
    k8s.job_exit_codes[job_name("reset_gpu", "pc-1", NODE, "")] = 1
    with pytest.raises(PermanentError):  # a failed Job: its pod's exit code is read
        await cluster.reset_gpu(NODE, ["0"], incident_id="pc-1")
    k8s.set_pod_security(cluster.settings.jobs.namespace, "restricted")
    privileged = tmp_path / "privileged.yaml"
    privileged.write_text(
        yaml.safe_dump(
            {"spec": {"template": {"spec": {"hostPID": True, "containers": [{"name": "x", "image": "x"}]}}}}
        )
    )
    refusing = make(jobs={"reset_gpu_template": privileged, "timeout": "30s"})
    assert not (await refusing.probe()).ok  # the dry-run create of its pod is refused
    with pytest.raises(PermanentError):  # the Job controller's FailedCreate event is read
        await refusing.reset_gpu(NODE, ["0"], incident_id="pc-2")
    if strategies != STRATEGIES:  # one strategy's install: replace the node that way
        for strategy in strategies:
            replacing = make(replace={"strategy": strategy, "command": ["true"]})
            handle = await replacing.replace(NODE, strategy="configured", incident_id="pc-1")
            await replacing.successor(NODE, handle=handle)
            if strategy == "karpenter":
                await replacing.successor(NODE, handle=f"{handle} {NODESET_DEMAND}")
                await replacing.termination_held(NODE, handle=handle)  # the old node's drain read
        return
    karpenter = make(replace={"strategy": "karpenter"})
    before = _nodes(k8s)
    handle = await karpenter.replace(NODE, strategy="configured", incident_id="pc-1")
    await karpenter.successor(NODE, handle=handle)  # none yet: its placeholder is read
    await karpenter.successor(NODE, handle=f"{handle} {NODESET_DEMAND}")
    await karpenter.termination_held(NODE, handle=handle)  # the old node's pods and drain events read
    replacement = await _new_ready_node(k8s, before, gone=NODE)
    # The replacement still carries the CAPI annotations naming the Machine: replace it that way too.
    before = _nodes(k8s)
    handle = await cluster.replace(replacement, strategy="configured", incident_id="pc-2")
    await _new_ready_node(k8s, before)
    # The new Machine's nodeRef, claimed (asked for a node that is gone, so the Machines are listed).
    await cluster.successor("gone", handle=handle)
    await make(replace={"strategy": "delete-node", "command": ["true"]}).replace(
        replacement, strategy="configured", incident_id="pc-3"
    )


#: A StatefulSet-mode NodeSet's slurmd pod as Karpenter's demand (``_nodeset_demand``): the successor
#: is the node it lands on, so that pod is read (here it is gone). Without it the tour never reads
#: a pod in ``slurm``, and the rule allowing it counted as used only when a test of that path ran
#: earlier in the same process.
NODESET_DEMAND = "demand=pod/slurm/slurm-worker-gpu-h100-0"


def _nodes(k8s: KubeEmulator) -> dict[str, dict[str, Any]]:
    return {n: o for (kind, _, n), o in k8s.objects.items() if kind == "nodes"}


async def _new_ready_node(
    k8s: KubeEmulator, before: Collection[str], gone: str | None = None, within: float = 10.0
) -> str:
    """A Ready node not among ``before`` (``gone``: once that one has gone), as the emulator's
    controllers replace a node: polled, where a fixed sleep of their delays could wake first on a
    loaded machine."""

    async def new() -> str | None:
        nodes = _nodes(k8s)
        fresh = [n for n, found in nodes.items() if n not in before and resources.ready(found)]
        return fresh[0] if fresh and gone not in nodes else None

    return await eventually(new, timeout=within, what=f"a new Ready node (without {gone})", interval=0.02)


def load(path: Path = RBAC_YAML) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def load_all_strategies() -> list[dict[str, Any]]:
    """The base's rbac.yaml and every replace component's: what the tour of every strategy needs."""
    return [*load(), *(d for s in STRATEGIES for d in load(component_rbac(s)))]


def _key(verb: str, group: str, resource: str, subresource: str | None) -> tuple[str, str, str, str]:
    return (verb, group, resource, subresource or "")


def _strategy_only(strategy: str) -> set[tuple[str, str, str, str]]:
    """What the adapter asks for with ``strategy`` and not without a replace strategy."""

    def keys(perms: tuple[Permission, ...]) -> set[tuple[str, str, str, str]]:
        return {_key(p.verb, p.group, p.resource, p.subresource) for p in perms}

    settings = KubernetesSettings.model_validate
    return keys(needed(settings({"replace": {"strategy": strategy, "command": ["true"]}}))) - keys(
        needed(settings({"replace": {"strategy": "none"}}))
    )


def for_strategy(requests: Iterable[Request], strategy: str) -> list[Request]:
    """``requests`` without those only another strategy sends (``strategy``: one of STRATEGIES,
    ``command`` or ``none``)."""
    mine = _strategy_only(strategy) if strategy in STRATEGIES else set()
    others = set().union(*(_strategy_only(s) for s in STRATEGIES if s != strategy)) - mine
    return [r for r in requests if _key(r.verb, r.api_group, r.resource, r.subresource) not in others]


def grants(
    documents: Iterable[dict[str, Any]], service_account: tuple[str, str] = ("pitcrew", "pitcrew")
) -> list[Grant]:
    """Every (group, resource, verb) the ServiceAccount ``(namespace, name)`` is bound to."""
    docs = list(documents)
    roles = {
        (d["kind"], d["metadata"].get("namespace"), d["metadata"]["name"]): d
        for d in docs
        if d["kind"] in ("Role", "ClusterRole")
    }
    out = []
    for binding in (d for d in docs if d["kind"] in ("RoleBinding", "ClusterRoleBinding")):
        subject = {"kind": "ServiceAccount", "namespace": service_account[0], "name": service_account[1]}
        if not any({k: s.get(k) for k in subject} == subject for s in binding.get("subjects") or []):
            continue
        ref = binding["roleRef"]
        where = binding["metadata"].get("namespace") if binding["kind"] == "RoleBinding" else None
        role = roles.get((ref["kind"], where if ref["kind"] == "Role" else None, ref["name"]))
        if role is None:
            raise AssertionError(
                f"{binding['kind']} {binding['metadata']['name']} binds a missing {ref['kind']} {ref['name']}"
            )
        for rule in role.get("rules") or []:
            for field in ("apiGroups", "resources", "verbs"):
                if "*" in rule.get(field, []):
                    raise AssertionError(f"{ref['kind']} {ref['name']} grants {field} '*'")
            out += [
                Grant(ref["name"], where, group, resource, verb)
                for group in rule["apiGroups"]
                for resource in rule["resources"]
                for verb in rule["verbs"]
            ]
    return out


def compare(requests: Iterable[Request], documents: Iterable[dict[str, Any]]) -> Comparison:
    allowed = grants(documents)
    used: set[Grant] = set()
    denied = set()
    for request in requests:
        matching = [g for g in allowed if g.allows(request)]
        if not matching:
            sub = f"/{request.subresource}" if request.subresource else ""
            where = f" in {request.namespace}" if request.namespace else ""
            denied.add(f"{request.verb} {request.api_group or 'core'}/{request.resource}{sub}{where}")
        used.update(matching)
    # A cluster-wide grant (namespace None) sorts before a namespaced one of the same role name.
    unused = sorted(
        set(allowed) - used, key=lambda g: (g.role, g.namespace or "", g.api_group, g.resource, g.verb)
    )
    return Comparison(tuple(sorted(denied)), tuple(unused))
