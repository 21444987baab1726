"""The kustomize base and overlays, rendered and checked without a cluster.

- the base and every overlay render with ``kubectl kustomize`` into exactly the expected objects;
- every built-in object validates strictly against the Kubernetes 1.37 schemas
  (kubernetes-validate), and every prometheus-operator object against the operator's CRD models
  (cloudcoil-models-prometheus-operator) with no field dropped — and both checks fail on an
  unknown or mistyped field;
- the Deployment: restricted security context, probes on /healthz and /readyz, requests and
  limits, kept off GPU nodes, one replica with Recreate on the store's volume, a grace period
  longer than pitcrew's own shutdown;
- secrets are only referenced: no Secret object, every ``*_file`` of the configuration is a key
  of a mounted Secret;
- ``pitcrew check-config`` accepts the configuration each overlay mounts, laid out as the kubelet
  would mount it; every one runs the real Kubernetes adapter in-cluster; the auto overlay changes
  only what pitcrew may do; the acting overlays need no requeue, which the REST-only default image
  cannot do (slurmrestd up to v0.0.42), so ``check-config --live`` has no playbook to refuse;
- each rendering carries the RBAC of exactly the replace strategy its configuration names (a
  component per strategy, none in the base), and the node-events Role stays in ``default``;
- the PrometheusRule and AlertmanagerConfig are the ones rules/ and alertmanager/ ship, and the
  Service, ServiceMonitor, NetworkPolicy and Alertmanager route agree on names and ports.
"""

from __future__ import annotations

import copy
import ipaddress
import os
import subprocess
import sys
import urllib.parse
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml
from cloudcoil.models.prometheus_operator import v1, v1alpha1

from bot.config import Settings, load_config
from bot.domain.policy import Mode
from bot.engine.ports import Probe
from bot.probes import Checked, unable
from bot.runtime import SHUTDOWN_TIMEOUT
from bot.store.postgres import PING_TIMEOUT
from tests.packaging.manifests import (
    BASE,
    COMPONENTS,
    KUSTOMIZATIONS,
    REPO,
    container,
    keyed,
    load_all,
    mounted_sandbox,
    rendered,
)

K8S_VERSION = "1.37.0"
CRD_MODELS: dict[str, Any] = {
    "ServiceMonitor": v1.ServiceMonitor,
    "PrometheusRule": v1.PrometheusRule,
    "AlertmanagerConfig": v1alpha1.AlertmanagerConfig,
}
EXPECTED = {
    ("Namespace", "pitcrew"),
    ("Namespace", "pitcrew-jobs"),
    ("ServiceAccount", "pitcrew"),
    ("ClusterRole", "pitcrew"),
    ("ClusterRoleBinding", "pitcrew"),
    ("Role", "pitcrew-jobs"),
    ("RoleBinding", "pitcrew-jobs"),
    ("Role", "pitcrew-events"),
    ("RoleBinding", "pitcrew-events"),
    ("PersistentVolumeClaim", "pitcrew-state"),
    ("Deployment", "pitcrew"),
    ("Service", "pitcrew"),
    ("ServiceMonitor", "pitcrew"),
    ("PrometheusRule", "pitcrew-gpu-faults"),
    ("AlertmanagerConfig", "pitcrew"),
    ("ConfigMap", "pitcrew-dashboards"),
    ("ConfigMap", "pitcrew-config"),
    ("NetworkPolicy", "pitcrew"),
}
#: The overlays opt into cluster-api replacement; the base replaces nothing.
STRATEGY = {"base": "none", "observe": "cluster-api", "auto": "cluster-api", "ha": "cluster-api"}
#: The ha overlay (two replicas on Postgres): no volume, a disruption budget, an egress policy.
HA_OBJECTS = (EXPECTED - {("PersistentVolumeClaim", "pitcrew-state")}) | {
    ("PodDisruptionBudget", "pitcrew"),
    ("NetworkPolicy", "pitcrew-egress"),
}
#: Where the namespaced objects go: pitcrew's namespace, but node events live in ``default`` and the
#: repair Jobs' Role in their own namespace (Pod Security "privileged", which their pods need).
NAMESPACE_OF = {
    ("Role", "pitcrew-events"): "default",
    ("RoleBinding", "pitcrew-events"): "default",
    ("Role", "pitcrew-jobs"): "pitcrew-jobs",
    ("RoleBinding", "pitcrew-jobs"): "pitcrew-jobs",
    ("Role", "pitcrew-replace-karpenter"): "pitcrew-jobs",
    ("RoleBinding", "pitcrew-replace-karpenter"): "pitcrew-jobs",
    ("Role", "pitcrew-replace-karpenter-node-events"): "default",
    ("RoleBinding", "pitcrew-replace-karpenter-node-events"): "default",
}
ALL = sorted(KUSTOMIZATIONS)
WITH_COMPONENT = [f"base+{strategy}" for strategy in COMPONENTS]


def replace_objects(strategy: str) -> set[tuple[str, str]]:
    """The component's objects for ``strategy`` (none for ``command`` and ``none``)."""
    if strategy not in COMPONENTS:
        return set()
    kinds = ["ClusterRole", "ClusterRoleBinding"]
    found = set()
    if strategy == "karpenter":  # its placeholder pod read in the jobs' namespace
        kinds += ["Role", "RoleBinding"]
        # Karpenter's FailedDraining on the old Node, read where node events live
        found = {(kind, "pitcrew-replace-karpenter-node-events") for kind in ("Role", "RoleBinding")}
    return found | {(kind, f"pitcrew-replace-{strategy}") for kind in kinds}


def schema_problems(obj: dict[str, Any]) -> list[str]:
    """Why ``obj`` is not a valid object of its kind (empty when it is)."""
    model = CRD_MODELS.get(obj["kind"])
    if model is None:
        try:
            kubernetes_validate.validate(obj, K8S_VERSION, strict=True)
        except kubernetes_validate.ValidationError as exc:
            return [f"{'.'.join(map(str, exc.path))}: {exc.message}"]
        return []
    try:
        parsed = model.model_validate(obj)
    except ValueError as exc:
        return [str(exc)]
    # The models ignore fields they do not know; a field lost on the way back is one the CRD lacks.
    back = parsed.model_dump(by_alias=True, exclude_unset=True, mode="json")
    return [] if back == obj else [f"fields unknown to the {obj['kind']} CRD: {_diff(obj, back)}"]


def _diff(given: Any, kept: Any, path: str = "") -> list[str]:
    if isinstance(given, dict) and isinstance(kept, dict):
        return [p for k in given for p in _diff(given[k], kept.get(k), f"{path}.{k}")]
    if isinstance(given, list) and isinstance(kept, list) and len(given) == len(kept):
        return [
            p for i, (g, k) in enumerate(zip(given, kept, strict=True)) for p in _diff(g, k, f"{path}[{i}]")
        ]
    return [] if given == kept else [path or "."]


def _unhashed(name: str) -> str:
    """``pitcrew-config-<hash>`` (configMapGenerator) as ``pitcrew-config``."""
    return "pitcrew-config" if name.startswith("pitcrew-config-") else name


@pytest.mark.parametrize("name", ALL + WITH_COMPONENT)
def test_renders_exactly_the_expected_objects_in_pitcrews_namespace(name: str) -> None:
    r = rendered(name)
    found = {(o["kind"], _unhashed(o["metadata"]["name"])) for o in r.objects}
    expected = (HA_OBJECTS if name == "ha" else EXPECTED) | replace_objects(
        STRATEGY.get(name, name.removeprefix("base+"))
    )
    assert found == expected
    assert len(r.objects) == len(expected)
    cluster_scoped = {"Namespace", "ClusterRole", "ClusterRoleBinding"}
    for obj in r.objects:
        if obj["kind"] not in cluster_scoped:
            key = (obj["kind"], obj["metadata"]["name"])
            assert obj["metadata"].get("namespace") == NAMESPACE_OF.get(key, "pitcrew"), key
    for obj in r.objects:  # the base's label, and the components' own, mark everything pitcrew ships
        assert obj["metadata"]["labels"]["app.kubernetes.io/part-of"] == "pitcrew", obj["metadata"]["name"]
    volumes = {v["name"]: v for v in r.one("Deployment")["spec"]["template"]["spec"]["volumes"]}
    assert volumes["config"]["configMap"]["name"].startswith("pitcrew-config-"), (
        "the Deployment must mount the generated (content-hashed) config"
    )


@pytest.mark.parametrize("name", ALL + WITH_COMPONENT)
def test_every_object_is_valid_against_its_schema(name: str) -> None:
    problems = {f"{o['kind']}/{o['metadata']['name']}": schema_problems(o) for o in rendered(name).objects}
    assert {k: v for k, v in problems.items() if v} == {}


@pytest.mark.parametrize(
    ("kind", "mutate", "words"),
    [
        (
            "Deployment",
            lambda o: o["spec"]["template"]["spec"].update(restartPolicyy="Always"),
            "restartPolicyy",
        ),
        ("Deployment", lambda o: o["spec"].update(replicas="one"), "replicas"),
        ("Service", lambda o: o["spec"]["ports"][0].update(port="8080x"), "port"),
        ("ServiceMonitor", lambda o: o["spec"]["endpoints"][0].update(intervall="30s"), "intervall"),
        ("PrometheusRule", lambda o: o["spec"]["groups"][0].update(rules="none"), "rules"),
        ("AlertmanagerConfig", lambda o: o["spec"]["route"].update(groupBy="node"), "groupBy"),
    ],
)
def test_schema_check_rejects_unknown_and_mistyped_fields(kind: str, mutate: Any, words: str) -> None:
    obj = copy.deepcopy(rendered("base").one(kind))
    mutate(obj)
    problems = schema_problems(obj)
    assert problems and words in " ".join(problems)


@pytest.mark.parametrize("name", ALL)
def test_deployment_is_hardened_and_kept_off_gpu_nodes(name: str) -> None:
    deployment = rendered(name).one("Deployment", "pitcrew")
    spec, pod = deployment["spec"], deployment["spec"]["template"]["spec"]
    c = container(deployment)
    if name == "ha":  # two replicas on Postgres: one leads, the other takes over
        assert spec["replicas"] == 2
        # One pod at a time, the old one first: under the required anti-affinity below a new pod
        # needs a node without one, and with two nodes for pitcrew a surge pod never schedules.
        assert spec["strategy"] == {
            "type": "RollingUpdate",
            "rollingUpdate": {"maxSurge": 0, "maxUnavailable": 1},
        }
    else:
        assert spec["replicas"] == 1 and spec["strategy"] == {"type": "Recreate"}  # one writer on the store
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] >= 10000
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    sc = c["securityContext"]
    assert sc["readOnlyRootFilesystem"] is True
    assert sc["allowPrivilegeEscalation"] is False
    assert sc["capabilities"] == {"drop": ["ALL"]}
    assert sc["seccompProfile"] == {"type": "RuntimeDefault"}
    # pitcrew calls the Kubernetes API, so this pod (and only it: the ServiceAccount mounts none) gets a token.
    assert pod["automountServiceAccountToken"] is True
    account = rendered(name).one("ServiceAccount", pod["serviceAccountName"])
    assert account["automountServiceAccountToken"] is False
    for kind in ("requests", "limits"):
        assert {"cpu", "memory"} <= set(c["resources"][kind]), kind
    port_names = {p["name"]: p["containerPort"] for p in c["ports"]}
    assert c["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "http"}
    assert c["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "http"}
    # /readyz answers "not ready" before the kubelet's timeout while Postgres is away.
    assert c["readinessProbe"]["timeoutSeconds"] > PING_TIMEOUT
    assert "http" in port_names
    assert c["args"][:3] == ["serve", "--config", "/etc/pitcrew/pitcrew.yaml"]
    # After SIGTERM pitcrew serves on for server.shutdown_delay (the pod's endpoints leave every
    # kube-proxy and ingress meanwhile: a Slack click sent there is never retried), then gives
    # requests in flight SHUTDOWN_TIMEOUT, then releases its lease: the kubelet must not SIGKILL before.
    settings = Settings.model_validate(yaml.safe_load(rendered(name).config_text()))
    delay = settings.server.shutdown_delay.total_seconds()
    assert delay >= 5
    assert pod["terminationGracePeriodSeconds"] >= delay + SHUTDOWN_TIMEOUT + 5
    terms = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"
    ]
    for term in terms:  # terms are ORed: every one of them must exclude GPU nodes
        assert {"key": "nvidia.com/gpu.present", "operator": "NotIn", "values": ["true"]} in term[
            "matchExpressions"
        ]
    state = next(v for v in pod["volumes"] if v["name"] == "state")
    mounts = {m["mountPath"]: m["name"] for m in c["volumeMounts"]}
    config = yaml.safe_load(rendered(name).config_text())
    assert mounts[str(Path(config["store"]["path"]).parent)] == "state"
    if name != "ha":
        assert state["persistentVolumeClaim"]["claimName"] == "pitcrew-state"
        return
    assert set(state) == {"name", "emptyDir"} and config["store"]["url"].startswith("postgresql://")
    (apart,) = pod["affinity"]["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert apart["topologyKey"] == "kubernetes.io/hostname"
    assert (
        apart["labelSelector"]["matchLabels"].items()
        <= deployment["spec"]["template"]["metadata"]["labels"].items()
    )
    (spread,) = pod["topologySpreadConstraints"]
    assert spread["topologyKey"] == "topology.kubernetes.io/zone"
    budget = rendered(name).one("PodDisruptionBudget", "pitcrew")
    assert budget["spec"]["minAvailable"] == 1
    # Not ready (both are, while Postgres is away): evictable all the same, or drains would wait.
    assert budget["spec"]["unhealthyPodEvictionPolicy"] == "AlwaysAllow"
    assert budget["spec"]["selector"] == apart["labelSelector"]
    egress = rendered(name).one("NetworkPolicy", "pitcrew-egress")
    ports = {p["port"] for rule in egress["spec"]["egress"] for p in rule["ports"]}
    # DNS, the Kubernetes API, Slack, and Grafana outside the cluster or in it (kube-prometheus-
    # stack's Service port 80 reaches its pod on 3000: a policy sees the pod's port); Postgres, or
    # the pooler the README says pitcrew runs behind (PgBouncer's default port, Azure's built-in).
    assert {53, 443, 6443, 3000, 5432, 6432} <= ports
    urls = dict(keyed(config, "url"))
    assert {"store.url", "slurm.rest_url", "resumption.prometheus_url"} <= urls.keys()
    for key, url in urls.items():
        parts = urllib.parse.urlsplit(url)
        port = parts.port or {"http": 80, "https": 443, "postgresql": 5432}[parts.scheme]
        assert port in ports, f"{key}: {url} is not reachable under the egress policy"


@pytest.mark.parametrize("name", ALL)
def test_secrets_are_referenced_never_included(name: str) -> None:
    r = rendered(name)
    assert not [o for o in r.objects if o["kind"] == "Secret"]
    deployment = r.one("Deployment", "pitcrew")
    volumes = {v["name"]: v for v in deployment["spec"]["template"]["spec"]["volumes"]}
    mounts = {m["mountPath"]: volumes[m["name"]] for m in container(deployment)["volumeMounts"]}
    # Whole Secret volumes, never a file by subPath: the kubelet updates a mounted Secret in place,
    # not a subPath, and pitcrew reads the Postgres password file again for each new connection.
    secret_mounts = [m for m in container(deployment)["volumeMounts"] if "secret" in volumes[m["name"]]]
    assert secret_mounts and not [m for m in secret_mounts if "subPath" in m], secret_mounts
    config = yaml.safe_load(r.config_text())
    files = dict(keyed(config, "_file"))
    assert "server.auth.bearer_token_file" in files
    for key, path in files.items():
        volume = mounts.get(str(Path(path).parent))
        assert volume is not None and "secret" in volume, f"{key}: {path} is not in a mounted Secret"
        assert volume["secret"].get("optional") is not True, f"{key}: its Secret must exist"
        assert Path(path).name in {i["path"] for i in volume["secret"]["items"]}, key
    env = container(deployment).get("env", [])
    assert not [e for e in env if "value" in e and "TOKEN" in e["name"].upper()]
    # The Alertmanager side reads the same Secret the Deployment mounts as the webhook token.
    webhook = volumes["webhook-token"]
    amc = r.one("AlertmanagerConfig", "pitcrew")
    credentials = amc["spec"]["receivers"][0]["webhookConfigs"][0]["httpConfig"]["authorization"][
        "credentials"
    ]
    assert credentials == {"name": webhook["secret"]["secretName"], "key": "token"}


@pytest.mark.parametrize("name", ALL)
def test_pitcrew_check_config_accepts_the_mounted_configuration(name: str, tmp_path: Path) -> None:
    config = mounted_sandbox(rendered(name), tmp_path / "root")
    env = {**os.environ, "PYTHONPATH": os.environ.get("PYTHONPATH", str(REPO))}
    result = subprocess.run(
        [sys.executable, "-m", "bot.cli", "check-config", "-c", str(config)],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    mode = "auto" if name in {"auto", "ha"} else "observe"
    assert f"mode {mode}; listen 0.0.0.0:9095" in result.stdout


#: What ``check-config --live`` hears from slurmrestd 24.11 (tests/e2e/test_slurm_rest_only.py).
REST_ONLY = Checked(
    ("scheduler",),
    Probe("slurm", True, "v0.0.42: node updates over REST; no requeue", unable=(("requeue", "no requeue"),)),
    reached=True,
)


@pytest.mark.parametrize("name", ["auto", "ha"])
def test_the_acting_overlays_run_every_playbook_on_the_rest_only_image(name: str, tmp_path: Path) -> None:
    path = mounted_sandbox(rendered(name), tmp_path / "root")
    config = load_config(path)
    assert config.settings.slurm.backend == "rest" and config.settings.mode is Mode.AUTO
    assert unable(config, [REST_ONLY]) == []
    # Without the overlay's playbook changes, the same configuration is refused for them.
    bare = yaml.safe_load(path.read_text())
    del bare["playbooks"]
    (bare_path := path.with_name("bare.yaml")).write_text(yaml.safe_dump(bare))
    [refused] = unable(load_config(bare_path), [REST_ONLY])
    assert "reboot-node, reboot-then-replace, replace-node, reset-gpu need" in refused, refused


@pytest.mark.parametrize("name", ALL + WITH_COMPONENT)
def test_the_replace_rbac_is_the_configured_strategys_and_no_other(name: str) -> None:
    r = rendered(name)
    found = {(o["kind"], o["metadata"]["name"]) for o in r.objects if "-replace-" in o["metadata"]["name"]}
    if name.startswith("base+"):  # an operator's own overlay: the component alone decides
        assert found == replace_objects(name.removeprefix("base+"))
        return
    config = yaml.safe_load(r.config_text())
    assert config["integrations"]["cluster"] == "kubernetes"
    assert config["kubernetes"]["in_cluster"] is True
    strategy = config["kubernetes"]["replace"]["strategy"]
    assert strategy == STRATEGY[name]
    assert found == replace_objects(strategy), f"{name}: {strategy} needs exactly its component"


def test_a_secret_the_deployment_does_not_mount_is_named_by_check_config(tmp_path: Path) -> None:
    r = rendered("base")
    broken = copy.deepcopy(r.one("Deployment", "pitcrew"))
    pod = broken["spec"]["template"]["spec"]
    pod["containers"][0]["volumeMounts"] = [
        m for m in container(broken)["volumeMounts"] if m["name"] != "webhook-token"
    ]
    objects = tuple(broken if o is r.one("Deployment", "pitcrew") else o for o in r.objects)
    config = mounted_sandbox(type(r)(r.name, r.text, objects), tmp_path / "root")
    result = subprocess.run(
        [sys.executable, "-m", "bot.cli", "check-config", "-c", str(config)],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": os.environ.get("PYTHONPATH", str(REPO))},
        timeout=60,
    )
    assert result.returncode != 0
    assert "/etc/pitcrew/secrets/webhook/token" in result.stderr + result.stdout


def test_auto_overlay_changes_only_what_pitcrew_may_do() -> None:
    base = yaml.safe_load(rendered("base").config_text())
    observe = yaml.safe_load(rendered("observe").config_text())
    auto = yaml.safe_load(rendered("auto").config_text())
    assert base["mode"] == observe["mode"] == "observe" and auto["mode"] == "auto"
    action_keys = {"mode", "playbook_modes", "approvals", "playbooks"}
    assert {k: v for k, v in observe.items() if k not in action_keys} == {
        k: v for k, v in auto.items() if k not in action_keys
    }
    # The observe overlay is the base with a replace strategy chosen, nothing else.
    assert observe["kubernetes"]["replace"] == {"strategy": "cluster-api"}
    observe["kubernetes"]["replace"] = base["kubernetes"]["replace"]
    assert observe == base
    # The ha overlay is the auto overlay with the store on Postgres, nothing else.
    ha = yaml.safe_load(rendered("ha").config_text())
    assert ha["store"]["url"].startswith("postgresql://") and ha["store"]["password_file"]
    assert {k: v for k, v in ha.items() if k != "store"} == {k: v for k, v in auto.items() if k != "store"}
    assert ha["store"]["path"] == auto["store"]["path"]
    # Outside observe, nothing that changes a system may go to the dry-run journal (bot.safety).
    assert "journal" not in {auto["integrations"]["scheduler"], auto["integrations"]["cluster"]}


def test_prometheusrule_and_alertmanagerconfig_are_the_shipped_ones() -> None:
    assert (BASE / "prometheusrule.yaml").read_text() == (
        REPO / "rules/gpu-faults.prometheusrule.yaml"
    ).read_text(), "run `python rules/render.py`"
    assert (BASE / "alertmanagerconfig.yaml").read_text() == (
        REPO / "alertmanager/alertmanagerconfig.yaml"
    ).read_text(), "copy alertmanager/alertmanagerconfig.yaml to deploy/kubernetes/"
    rule = rendered("base").one("PrometheusRule")
    shipped = yaml.safe_load((REPO / "rules/gpu-faults.rules.yml").read_text())
    assert rule["spec"] == shipped


def test_service_monitor_network_policy_and_route_agree() -> None:
    r = rendered("base")
    service, c = r.one("Service", "pitcrew"), container(r.one("Deployment", "pitcrew"))
    pod_labels = r.one("Deployment", "pitcrew")["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= pod_labels.items()
    (port,) = service["spec"]["ports"]
    assert port["targetPort"] in {p["name"] for p in c["ports"]}
    url = r.one("AlertmanagerConfig")["spec"]["receivers"][0]["webhookConfigs"][0]["url"]
    assert (
        url
        == f"http://{service['metadata']['name']}.{service['metadata']['namespace']}.svc:{port['port']}/api/v1/alerts"
    )
    monitor = r.one("ServiceMonitor")
    assert monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    assert [e["port"] for e in monitor["spec"]["endpoints"]] == [port["name"]]
    assert monitor["spec"]["endpoints"][0]["path"] == "/metrics"
    policy = r.one("NetworkPolicy")
    assert policy["spec"]["policyTypes"] == ["Ingress"]
    assert policy["spec"]["podSelector"]["matchLabels"].items() <= pod_labels.items()
    (rule,) = policy["spec"]["ingress"]
    assert [p["port"] for p in rule["ports"]] == [port["targetPort"]]
    (source,) = rule["from"]  # namespace AND pod selector in one entry: both must match
    assert set(source) == {"namespaceSelector", "podSelector"}
    (admitted,) = source["podSelector"]["matchExpressions"]
    assert admitted["operator"] == "In" and sorted(admitted["values"]) == ["alertmanager", "prometheus"]


def test_the_loader_reads_kustomize_output_as_kubernetes_does() -> None:
    (doc,) = load_all("kind: X\nmatchType: =\nvalue: '='\n")
    assert doc == {"kind": "X", "matchType": "=", "value": "="}


def _admits(policy: dict[str, Any], to: dict[str, Any]) -> bool:
    """Whether a NetworkPolicy's egress rules admit a connection to ``to`` (an address, a port and
    protocol as the policy sees them: the pod's port, after a Service's; and, for a pod, its labels
    and its namespace's; ``host``: an endpoint on the node's own network, which no pod or namespace
    selector matches). Rules are ORed; a rule without ``to`` or without ``ports`` admits any."""

    def peer(p: dict[str, Any]) -> bool:
        if "ipBlock" in p:
            block = p["ipBlock"]
            address = ipaddress.ip_address(to["ip"])
            return address in ipaddress.ip_network(block["cidr"]) and not any(
                address in ipaddress.ip_network(e) for e in block.get("except", [])
            )
        if to.get("host"):
            return False
        namespace = p.get("namespaceSelector")
        pods = p.get("podSelector", {})
        in_namespace = (
            to["namespace"]["name"] == "pitcrew"
            if namespace is None
            else namespace.get("matchLabels", {}).items() <= to["namespace"]["labels"].items()
        )
        return bool(in_namespace and pods.get("matchLabels", {}).items() <= to["labels"].items())

    def port(p: dict[str, Any]) -> bool:
        return bool(p["port"] == to["port"] and p.get("protocol", "TCP") == to["protocol"])

    return any(
        ("to" not in rule or any(peer(p) for p in rule["to"]))
        and ("ports" not in rule or any(port(p) for p in rule["ports"]))
        for rule in policy["spec"]["egress"]
    )


#: Where clusters serve their pods' DNS, as an egress policy sees it (the pod's own port).
DNS_SERVERS: dict[str, dict[str, Any]] = {
    "CoreDNS": {
        "ip": "10.244.1.7",
        "labels": {"k8s-app": "kube-dns"},
        "namespace": {"name": "kube-system", "labels": {"kubernetes.io/metadata.name": "kube-system"}},
    },
    # NodeLocal DNSCache (GKE Autopilot, many large clusters): the pods' resolver is a
    # link-local address (or the kube-dns ClusterIP, taken over) served on every node's own
    # network, by a hostNetwork DaemonSet.
    "NodeLocal DNSCache": {"ip": "169.254.20.10", "host": True},
    "NodeLocal DNSCache on the ClusterIP": {"ip": "10.96.0.10", "host": True},
    # OpenShift: the DNS operator's pods, answering on 5353 behind the Service's 53.
    "OpenShift": {
        "ip": "10.128.2.5",
        "port": 5353,
        "labels": {"dns.operator.openshift.io/daemonset-dns": "default"},
        "namespace": {"name": "openshift-dns", "labels": {"kubernetes.io/metadata.name": "openshift-dns"}},
    },
}


@pytest.mark.parametrize("server", sorted(DNS_SERVERS))
@pytest.mark.parametrize("protocol", ["UDP", "TCP"])
def test_the_egress_policy_lets_the_pods_resolve_names_wherever_the_cluster_serves_dns(
    server: str, protocol: str
) -> None:
    """A policy that admitted DNS to kube-dns's pods only left pitcrew unable to resolve Postgres,
    Slack or the API server on a cluster with NodeLocal DNSCache (no pod selector matches a
    hostNetwork endpoint) or on OpenShift (other labels, port 5353): every connection failed."""
    egress = rendered("ha").one("NetworkPolicy", "pitcrew-egress")
    to = {"port": 53, **DNS_SERVERS[server], "protocol": protocol}
    assert _admits(egress, to), f"{server}: DNS over {protocol} is refused by the egress policy"
    # The evaluator itself: a pod of no DNS server on the DNS port of a policy with only a pod rule.
    only_pods = {"spec": {"egress": [{"to": [{"podSelector": {"matchLabels": {"k8s-app": "kube-dns"}}}]}]}}
    assert not _admits(only_pods, {**to, "host": True})
