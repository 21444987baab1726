"""Generates pitcrew's Prometheus rules: the plain rule file and its PrometheusRule (CRD) rendering.

Owns the rule set - which alerts exist, their labels, annotations and durations - so nothing is
copied by hand: ``rules/gpu-faults.rules.yml``, ``rules/gpu-faults.prometheusrule.yaml`` and its copy
in the kustomize base (``deploy/kubernetes/prometheusrule.yaml``) are this script's output; ``python
rules/render.py`` rewrites them, ``--check`` (run in CI by tests/integration/test_rules.py) fails when
any differs from what it would write. It must not hold policy about what pitcrew *does* with a
fault (that is pitcrew's catalog): the rules only say what fired, on which node and GPU, and how
bad it is. Expressions come from rules/promql.py.

``PRODUCTION`` renders the shipped files. ``FAST`` renders the same expressions with second-scale
windows for the end-to-end tests and the bench, so a cleared fault resolves in seconds.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import yaml

if __package__ in (None, ""):  # run as a script: python rules/render.py
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from rules import promql as q
from rules.annotations import TEXT

HERE = Path(__file__).resolve().parent
RULE_FILE = HERE / "gpu-faults.rules.yml"
CRD_FILE = HERE / "gpu-faults.prometheusrule.yaml"
DEPLOY_CRD_FILE = HERE.parent / "deploy" / "kubernetes" / "prometheusrule.yaml"  # the kustomize base's copy
GPU_TEMP_MAX, MEMORY_TEMP_MAX, NVLINK_BURST = 87, 95, 100
#: Link downs within ``flap_window`` that make a flapping link; physical-layer errors per
#: ``link_error_window`` that make a degrading one (IB's symbol error counter has thresholds of
#: this order in the fabric managers' error reports; a healthy link counts none).
LINK_FLAPS, LINK_ERRORS_MAX = 3, 10
#: Interfaces that are no fabric link: loopback, pod veths and CNI bridges and tunnels (their
#: carrier changes with every pod), container and VM bridges.
NON_FABRIC_INTERFACES = (
    "lo|veth.*|docker.*|br-.*|virbr.*|cali.*|cilium.*|lxc.*|flannel.*|cni.*|vxlan.*|genev.*|tunl.*"
    "|kube-ipvs.*|tap.*|tun.*|nodelocaldns|dummy.*"
)
# Fields without which whole rules are blind: ECC is off in dcgm-exporter's default CSV, and 4.9's
# default CSV renames them all (rules/dcgm-counters.csv pins these names).
REQUIRED_FIELDS = ("DCGM_FI_DEV_XID_ERRORS", "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", "DCGM_FI_DEV_GPU_TEMP")


@dataclass(frozen=True)
class Profile:
    """Durations that differ between production and the fast end-to-end proving ground."""

    xid_window: str = "10m"  # a counted XID keeps its alert this long; a repeat after it re-fires
    counter_window: str = "10m"  # ECC and remapped-row increases
    keep_firing_for: str = "10m"  # an exporter blip must not resolve a hardware fault
    exporter_down_for: str = "2m"
    gpu_missing_for: str = "1m"
    thermal_for: str = "5m"
    nvlink_window: str = "5m"
    gpus_seen_window: str = "1d"  # the expected GPU count of a node is the most it reported here
    exporter_seen_window: str = "1h"  # without kube-state-metrics: nodes that had an exporter here
    # A GPU's energy counter unmoved this long, for frozen_for more: readings no longer taken
    # (dcgm-exporter reads DCGM every 30 s by default; at least 20 readings fit in the window).
    frozen_window: str = "10m"
    frozen_for: str = "5m"
    link_seen_window: str = "1h"  # a link counts as down only if it was up within this
    link_down_for: str = "1m"  # a link renegotiating (a few seconds) is not down
    flap_window: str = "15m"  # LINK_FLAPS downs within this: flapping
    link_error_window: str = "1h"  # physical-layer errors counted over this...
    link_errors_for: str = "15m"  # ...above LINK_ERRORS_MAX for this long: a rising error rate
    # Where docs/alerting.md is published for the people paged (its headings are the alert names,
    # lower case): `--runbook-base URL` gives every alert `runbook_url: URL#<alert>`. pitcrew has no
    # address of its own to put there, so the shipped files carry none.
    runbook_base: str | None = None


PRODUCTION = Profile()
FAST = replace(
    PRODUCTION,
    **dict.fromkeys(("xid_window", "counter_window", "nvlink_window"), "30s"),
    **dict.fromkeys(("gpu_missing_for", "thermal_for"), "2s"),
    # Ten scrapes, not two: a stand-in serving twenty nodes on a busy CI machine misses a 1 s
    # scrape now and then, and no test waits for this alert.
    exporter_down_for="10s",
    # The stand-in's DCGM reads every second; a missed scrape leaves a gap, never a repeat.
    frozen_window="15s",
    frozen_for="5s",
    **dict.fromkeys(("link_down_for", "link_errors_for"), "2s"),
    **dict.fromkeys(("flap_window", "link_error_window"), "1m"),
    **dict.fromkeys(("gpus_seen_window", "exporter_seen_window", "link_seen_window"), "10m"),
    keep_firing_for="5s",
)


def alert(name: str, expr: str, fault: str, severity: str, p: Profile, *, for_: str = "0s") -> dict[str, Any]:
    summary, description = TEXT[name]
    values = {
        **asdict(p),
        "nvlink_burst": NVLINK_BURST,
        "gpu_temp_max": GPU_TEMP_MAX,
        "memory_temp_max": MEMORY_TEMP_MAX,
        "link_flaps": LINK_FLAPS,
        "link_errors_max": LINK_ERRORS_MAX,
    }
    rule: dict[str, Any] = {"alert": name, "expr": expr}
    if for_ != "0s":
        rule["for"] = for_
    if fault not in ("exporter-down", "pitcrew"):  # a hardware fault outlives its exporter's blips
        rule["keep_firing_for"] = p.keep_firing_for
    rule["labels"] = {"fault": fault, "severity": severity}
    rule["annotations"] = {"summary": summary, "description": description.format(**values)}
    if p.runbook_base:
        rule["annotations"]["runbook_url"] = f"{p.runbook_base}#{name.lower()}"
    return rule


def gpu_rules(p: Profile) -> list[dict[str, Any]]:
    xids = q.xid_classes()
    critical, no_page = "|".join(map(str, xids.critical)), "|".join(map(str, xids.no_page))
    count = "pitcrew:dcgm_gpus:count"
    return [
        {"record": "pitcrew:gpu_xid:recent", "expr": q.xid_recent(p.xid_window)},
        {"record": count, "expr": f"count by (cluster, node) ({q.present('DCGM_FI_DEV_GPU_TEMP')})"},
        alert("GpuXidCritical", f'pitcrew:gpu_xid:recent{{xid=~"{critical}"}}', "xid", "critical", p),
        alert(
            "GpuXidWarning",
            q.with_recovery_action("pitcrew:gpu_xid:recent", f'xid!~"{critical}|{no_page}"', xids.recovery),
            "xid",
            "warning",
            p,
        ),
        alert(
            "GpuEccDoubleBitError",
            q.any_of(
                *(q.increased(f"DCGM_FI_DEV_ECC_DBE_{s}_TOTAL", p.counter_window) for s in ("VOL", "AGG"))
            ),
            "ecc-dbe",
            "critical",
            p,
        ),
        alert(
            "GpuRowRemapFailure",
            f"{q.per_gpu('DCGM_FI_DEV_ROW_REMAP_FAILURE')} > 0",
            "row-remap-failure",
            "critical",
            p,
        ),
        alert(
            "GpuRowRemapPending",
            f"{q.per_gpu('DCGM_FI_DEV_ROW_REMAP_PENDING')} > 0",
            "row-remap-pending",
            "warning",
            p,
        ),
        alert(
            "GpuUncorrectableRemappedRows",
            q.increased("DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS", p.counter_window),
            "remapped-rows-uncorrectable",
            "warning",
            p,
        ),
        alert(
            "GpuHealthFail",
            q.per_gpu("DCGM_EXP_GPU_HEALTH_STATUS == 20", "health_watch"),
            "health-fail",
            "critical",
            p,
        ),
        alert(
            "GpuMissingFromNode",
            f"max_over_time({count}[{p.gpus_seen_window}]) - {count} > 0",
            "gpu-missing",
            "critical",
            p,
            for_=p.gpu_missing_for,
        ),
        alert(
            "GpuNvlinkErrors", q.nvlink_burst(p.nvlink_window, NVLINK_BURST), "nvlink-errors", "warning", p
        ),
        alert(
            "GpuThermal",
            q.any_of(
                f"{q.per_gpu('DCGM_FI_DEV_GPU_TEMP')} >= {GPU_TEMP_MAX}",
                f"{q.per_gpu('DCGM_FI_DEV_MEMORY_TEMP')} >= {MEMORY_TEMP_MAX}",
            ),
            "thermal",
            "warning",
            p,
            for_=p.thermal_for,
        ),
    ]


def network_rules(p: Profile) -> list[dict[str, Any]]:
    """IB/RoCE ports (node-exporter's infiniband collector) and Ethernet carriers (its netclass)."""
    skipped = NON_FABRIC_INTERFACES
    return [
        alert(
            "NetworkLinkDown",
            q.any_of(q.ib_link_down(p.link_seen_window), q.ethernet_link_down(skipped, p.link_seen_window)),
            "link-down",
            "critical",
            p,
            for_=p.link_down_for,
        ),
        alert(
            "NetworkLinkFlapping",
            q.any_of(
                q.ib_link_flaps(p.flap_window, LINK_FLAPS),
                q.ethernet_link_flaps(skipped, p.flap_window, LINK_FLAPS),
            ),
            "link-flapping",
            "critical",
            p,
        ),
        alert(
            "NetworkLinkErrors",
            f"{q.ib_link_errors(p.link_error_window)} > {LINK_ERRORS_MAX}",
            "link-errors",
            "warning",
            p,
            for_=p.link_errors_for,
        ),
        alert(
            "NetworkCounterFull", q.ib_counters_full(), "link-errors", "warning", p, for_=p.link_errors_for
        ),
    ]


def exporter_rules(p: Profile) -> list[dict[str, Any]]:
    up, ksm = f'up{{job=~"{q.EXPORTER_JOB}"}}', 'kube_node_status_capacity{resource="nvidia_com_gpu"}'
    gpu_nodes = f"max by (cluster, node) ({ksm} > 0)"
    seen = f"max by (cluster, node) (max_over_time({up}[{p.exporter_seen_window}]))"
    no_target = f"unless on (cluster, node)\n  {q.exporter_up()}"
    absent = q.any_of(f"{gpu_nodes}\n  {no_target}", f"({seen}\n  {no_target})\n  and on ()\n  absent({ksm})")
    down_for = p.exporter_down_for
    return [
        alert("DcgmExporterDown", f"{q.exporter_up()} == 0", "exporter-down", "warning", p, for_=down_for),
        alert("DcgmExporterAbsent", absent, "exporter-down", "warning", p, for_=down_for),
        alert(
            "DcgmExporterFieldsMissing",
            q.fields_missing(REQUIRED_FIELDS),
            "exporter-down",
            "warning",
            p,
            for_="15m",
        ),
        alert("DcgmExporterNoTargets", f"absent({up})", "exporter-down", "warning", p, for_="10m"),
        alert(
            "DcgmExporterFrozen", q.frozen(p.frozen_window), "exporter-down", "warning", p, for_=p.frozen_for
        ),
    ]


def pitcrew_rules(p: Profile) -> list[dict[str, Any]]:
    requests = 'sum by (cluster, code) (increase(pitcrew_webhook_requests_total{code=~"%s"}[5m])) > 0'
    return [
        alert(
            "PitcrewDown",
            'max by (cluster, job) (up{job="pitcrew"}) == 0 or absent(up{job="pitcrew"})',
            "pitcrew",
            "critical",
            p,
            for_="2m",
        ),
        alert("PitcrewWebhookRejecting", requests % "4..", "pitcrew", "critical", p),
        alert("PitcrewWebhookErrors", requests % "5..", "pitcrew", "warning", p, for_="5m"),
        alert(
            "PitcrewStepsFailing",
            'sum by (cluster, step) (increase(pitcrew_steps_total{outcome="failed"}[15m])) > 0',
            "pitcrew",
            "warning",
            p,
        ),
        alert("PitcrewBreakerOpen", "max by (cluster) (pitcrew_breaker_open) > 0", "pitcrew", "critical", p),
        # Replicas answer (so PitcrewDown is quiet) but none holds the store's lease: nobody acts.
        alert(
            "PitcrewNoLeader", "max by (cluster) (pitcrew_leader) == 0", "pitcrew", "critical", p, for_="1m"
        ),
        # The store's Postgres streams to standbys without waiting for them: a failover may lose
        # acknowledged alerts and recorded steps. Long enough to ride out a standby's re-sync.
        alert(
            "PitcrewStoreReplicationAsynchronous",
            'max by (cluster) (pitcrew_store_replication{mode="asynchronous"}) == 1',
            "pitcrew",
            "warning",
            p,
            for_="15m",
        ),
        alert(
            "PitcrewIncidentStuck",
            "max by (cluster) (pitcrew_incident_oldest_active_seconds) > 4 * 3600",
            "pitcrew",
            "warning",
            p,
            for_="5m",
        ),
        alert(
            "PitcrewSlackSocketDisconnected",
            "max by (cluster) (pitcrew_slack_socket_connected) == 0",
            "pitcrew",
            "warning",
            p,
            for_="5m",
        ),
        alert(
            "PitcrewNoticesStuck",
            "(max by (cluster, destination) (pitcrew_outbox_pending) > 0) unless on (cluster, destination) "
            '(sum by (cluster, destination) (increase(pitcrew_notices_total{outcome="delivered"}[10m])) > 0)',
            "pitcrew",
            "warning",
            p,
            for_="5m",
        ),
    ]


def rule_groups(p: Profile) -> dict[str, Any]:
    return {
        "groups": [
            {"name": "pitcrew-gpu-faults", "rules": gpu_rules(p)},
            {"name": "pitcrew-network", "rules": network_rules(p)},
            {"name": "pitcrew-dcgm-exporter", "rules": exporter_rules(p)},
            {"name": "pitcrew-self", "rules": pitcrew_rules(p)},
        ]
    }


class _Dumper(yaml.SafeDumper):
    """Multi-line expressions as literal blocks; nothing folded, so each line reads as written."""


_Dumper.add_representer(
    str, lambda d, s: d.represent_scalar("tag:yaml.org,2002:str", s, style="|" if "\n" in s else None)
)


def _dump(document: dict[str, Any]) -> str:
    header = (
        "# Generated by rules/render.py (XID classes from bot/data/catalog.yaml version"
        f" {q.xid_classes().version}): do not edit; run `python rules/render.py`.\n"
    )
    return header + yaml.dump(document, Dumper=_Dumper, sort_keys=False, width=4096)


def render_rule_file(p: Profile = PRODUCTION) -> str:
    return _dump(rule_groups(p))


def render_crd(p: Profile = PRODUCTION) -> str:
    labels = {"app.kubernetes.io/name": "pitcrew", "app.kubernetes.io/component": "alert-rules",
              "release": "kube-prometheus-stack"}  # kube-prometheus-stack selects rules by this label # fmt: skip
    metadata = {"name": "pitcrew-gpu-faults", "labels": labels}
    return _dump(
        {
            "apiVersion": "monitoring.coreos.com/v1",
            "kind": "PrometheusRule",
            "metadata": metadata,
            "spec": rule_groups(p),
        }
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Render pitcrew's rule file and PrometheusRule.")
    parser.add_argument("--check", action="store_true", help="exit 1 if the checked-in files are stale")
    parser.add_argument(
        "--runbook-base",
        metavar="URL",
        help="where docs/alerting.md is published: every alert gets runbook_url URL#<alert name, lower case>",
    )
    args = parser.parse_args(argv)
    stale = []
    p = replace(PRODUCTION, runbook_base=args.runbook_base)
    outputs = ((RULE_FILE, render_rule_file(p)), (CRD_FILE, render_crd(p)), (DEPLOY_CRD_FILE, render_crd(p)))
    for path, text in outputs:
        if not args.check:
            path.write_text(text)
        elif not path.exists() or path.read_text() != text:
            stale.append(path.name)
    if stale:
        print(f"stale: {', '.join(stale)}; run `python rules/render.py`", file=sys.stderr)
    return 1 if stale else 0


if __name__ == "__main__":
    sys.exit(main())
