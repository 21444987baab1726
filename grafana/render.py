"""Generates pitcrew's Grafana dashboards and their kube-prometheus-stack ConfigMap.

Owns what each panel asks and where it sits, so nothing is copied by hand:
``grafana/dashboards/*.json`` and ``deploy/kubernetes/grafana-dashboards.yaml`` are this script's
output; ``python grafana/render.py`` rewrites them, ``--check`` (run in CI by
tests/integration/test_dashboards.py) fails when any differs from what it would write.

Every query runs on the ``${datasource}`` variable (no datasource id is hard-coded); the only
other datasource is Grafana's built-in one, for the ``pitcrew`` region annotations. GPU series
are folded to one ``node`` label the way pitcrew's rules do it (rules/promql.py), so a panel and
an alert never disagree about which node a GPU is on. Uids are stable: links and provisioning
depend on them.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

if __package__ in (None, ""):  # run as a script: python grafana/render.py
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from rules import promql as q

HERE = Path(__file__).resolve().parent
DASHBOARDS = HERE / "dashboards"
CONFIGMAP = HERE.parent / "deploy" / "kubernetes" / "grafana-dashboards.yaml"
FLEET_UID = "pitcrew-gpu-fleet-health"
INCIDENTS_UID = "pitcrew-incidents"
DS = {"type": "prometheus", "uid": "${datasource}"}
GRID = 24
RUNBOOK = "https://github.com/pitcrew/pitcrew/blob/main/docs/catalog.md#buckets--default-playbooks"


@dataclass(frozen=True)
class Query:
    expr: str
    legend: str = ""
    instant: bool = False
    table: bool = False
    heatmap: bool = False


@dataclass(frozen=True)
class Panel:
    title: str
    description: str
    queries: tuple[Query, ...]
    kind: str = "timeseries"
    width: int = 12
    height: int = 8
    unit: str = "short"
    options: dict[str, Any] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)


def _target(query: Query, ref: str) -> dict[str, Any]:
    target: dict[str, Any] = {"datasource": DS, "expr": query.expr, "refId": ref}
    if query.legend:
        target["legendFormat"] = query.legend
    if query.instant:
        target["instant"], target["range"] = True, False
    if query.table:
        target["format"] = "table"
    if query.heatmap:
        target["format"] = "heatmap"
    return target


def _layout(panels: Sequence[Panel]) -> list[dict[str, Any]]:
    """Left to right, wrapping at the 24-column grid; ids are positions (stable while the order is)."""
    out, x, y, row_height = [], 0, 0, 0
    for number, panel in enumerate(panels, start=1):
        if x + panel.width > GRID:
            x, y, row_height = 0, y + row_height, 0
        out.append(
            {
                "id": number,
                "type": panel.kind,
                "title": panel.title,
                "description": panel.description,
                "datasource": DS,
                "gridPos": {"x": x, "y": y, "w": panel.width, "h": panel.height},
                "fieldConfig": {"defaults": {"unit": panel.unit}, "overrides": []},
                "options": panel.options,
                "targets": [_target(query, chr(ord("A") + i)) for i, query in enumerate(panel.queries)],
                **panel.extra,
            }
        )
        x, row_height = x + panel.width, max(row_height, panel.height)
    return out


def _dashboard(
    uid: str, title: str, description: str, panels: Sequence[Panel], extra_vars: Sequence[dict[str, Any]] = ()
) -> dict[str, Any]:
    return {
        "uid": uid,
        "title": title,
        "description": description,
        "tags": ["pitcrew", "gpu"],
        "timezone": "utc",
        "editable": True,
        "graphTooltip": 1,
        "refresh": "30s",
        "schemaVersion": 39,
        "time": {"from": "now-24h", "to": "now"},
        "links": [
            {"title": "GPU fleet health", "type": "link", "url": f"/d/{FLEET_UID}", "keepTime": True},
            {"title": "pitcrew incidents", "type": "link", "url": f"/d/{INCIDENTS_UID}", "keepTime": True},
        ],
        "annotations": {
            "list": [
                {
                    "name": "pitcrew incidents",
                    "datasource": {"type": "grafana", "uid": "-- Grafana --"},
                    "enable": True,
                    "iconColor": "red",
                    "target": {"type": "tags", "tags": ["pitcrew"], "matchAny": True, "limit": 500},
                }
            ]
        },
        "templating": {
            "list": [
                {
                    "name": "datasource",
                    "label": "Prometheus",
                    "type": "datasource",
                    "query": "prometheus",
                    "current": {},
                    "hide": 0,
                },
                *extra_vars,
            ]
        },
        "panels": _layout(panels),
    }


def _stat(title: str, description: str, expr: str, unit: str = "short", **extra: Any) -> Panel:
    return Panel(
        title,
        description,
        (Query(expr, instant=True),),
        "stat",
        4,
        4,
        unit,
        {"reduceOptions": {"calcs": ["lastNotNull"]}},
        extra,
    )


def _state_stat(
    title: str, description: str, expr: str, *, off: tuple[str, str], on: tuple[str, str]
) -> Panel:
    """A stat of a 0/1 state gauge, shown as words in colour: ``off`` for 0, ``on`` for 1 (text, colour)."""
    options = {value: {"text": text, "color": colour} for value, (text, colour) in (("0", off), ("1", on))}
    mappings = [{"type": "value", "options": options}]
    return _stat(title, description, expr, fieldConfig={"defaults": {"mappings": mappings}, "overrides": []})


# ------------------------------------------------------------------ GPU fleet health
def _fold(expr: str, by: str = "node, gpu") -> str:
    return f"max by ({by}) ({q.node_fold(expr)})"


def _gpus_per_node() -> str:
    return f"count by (node) ({_fold('DCGM_FI_DEV_GPU_TEMP')})"


def _xid_class(expr: str) -> str:
    """``class`` from pitcrew's catalog buckets (rules/promql.py): critical, application, or human."""
    classes = q.xid_classes()
    critical = "|".join(map(str, classes.critical))
    quiet = "|".join(map(str, classes.no_page))
    human = f'label_replace({expr}, "class", "needs a human", "xid", ".+")'
    crit = f'label_replace({human}, "class", "critical: reset, reboot or replace", "xid", "{critical}")'
    return f'label_replace({crit}, "class", "application (node untouched)", "xid", "{quiet}")'


XIDS_NOW = _fold('DCGM_EXP_XID_ERRORS_COUNT{xid!=""}', "node, gpu, xid")
EXPORTER_UP = f"max by (node) ({q.node_fold(f'up{{job=~{json.dumps(q.EXPORTER_JOB)}}}')})"


def fleet() -> dict[str, Any]:
    panels = [
        _stat(
            "GPUs reporting",
            "GPUs dcgm-exporter reports now, over the fleet.",
            f"count({_fold('DCGM_FI_DEV_GPU_TEMP')})",
        ),
        _stat(
            "GPUs missing",
            "GPUs a node reported within the last day and no longer does (fallen off the bus): the GpuMissingFromNode alert's measure.",
            f"sum(max_over_time({_gpus_per_node()}[1d:]) - {_gpus_per_node()})",
        ),
        _stat(
            "Exporters up", "dcgm-exporter targets Prometheus scrapes successfully.", f"sum({EXPORTER_UP})"
        ),
        _stat(
            "Exporters down",
            "dcgm-exporter targets Prometheus cannot scrape: GPU faults there are invisible.",
            f"count({EXPORTER_UP} == 0) or vector(0)",
        ),
        _stat(
            "GPUs with a recent XID",
            "GPUs with an XID in dcgm-exporter's window (5 min by default).",
            f"count({XIDS_NOW} > 0) or vector(0)",
        ),
        _stat(
            "Uncorrectable ECC (DBE)",
            "Volatile double-bit ECC errors over the fleet now.",
            f"sum({_fold('DCGM_FI_DEV_ECC_DBE_VOL_TOTAL')})",
        ),
        Panel(
            "XIDs by class",
            "XIDs in dcgm-exporter's window, classed by pitcrew's catalog: critical ones make pitcrew reset, reboot or replace.",
            (Query(f"sum by (class) ({_xid_class(XIDS_NOW)})", "{{class}}"),),
            options={"legend": {"displayMode": "table", "placement": "right"}},
        ),
        Panel(
            "XIDs by node and code",
            "Which node and GPU raised which XID.",
            (Query(f"sum by (node, gpu, xid) ({XIDS_NOW})", "{{node}} gpu{{gpu}} XID {{xid}}"),),
            options={"legend": {"displayMode": "table", "placement": "right"}},
        ),
        Panel(
            "Last XID per GPU",
            "dcgm-exporter's latched last XID per GPU (err_code 0: none since the exporter started).",
            (
                Query(
                    _fold("DCGM_FI_DEV_XID_ERRORS", "node, gpu, err_code, err_msg"), instant=True, table=True
                ),
            ),
            "table",
            24,
        ),
        Panel(
            "ECC errors",
            "Volatile ECC errors per GPU: double-bit (uncorrectable) and the single-bit rate.",
            (
                Query(_fold("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL"), "DBE {{node}} gpu{{gpu}}"),
                Query(
                    _fold("rate(DCGM_FI_DEV_ECC_SBE_VOL_TOTAL[$__rate_interval])"),
                    "SBE/s {{node}} gpu{{gpu}}",
                ),
            ),
        ),
        Panel(
            "Row remapping",
            "Rows remapped for uncorrectable errors and row-remap failures (a failure means replace the GPU).",
            (
                Query(
                    _fold("DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS"), "uncorrectable rows {{node}} gpu{{gpu}}"
                ),
                Query(_fold("DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS"), "correctable rows {{node}} gpu{{gpu}}"),
                Query(_fold("DCGM_FI_DEV_ROW_REMAP_FAILURE"), "remap failure {{node}} gpu{{gpu}}"),
            ),
        ),
        Panel(
            "GPUs per node",
            "GPUs each node's exporter reports; a drop is a GPU fallen off the bus.",
            (Query(_gpus_per_node(), "{{node}}"),),
        ),
        Panel(
            "Exporter up by node",
            "1 while Prometheus scrapes the node's dcgm-exporter.",
            (Query(EXPORTER_UP, "{{node}}"),),
        ),
    ]
    return _dashboard(
        FLEET_UID,
        "GPU fleet health",
        "Is the GPU fleet healthy? XIDs, ECC, row remapping, missing GPUs and exporters, from dcgm-exporter. "
        "Red regions are pitcrew incidents.",
        panels,
    )


# ------------------------------------------------------------------ pitcrew incidents
def _quantile(metric: str, q_: float, window: str, by: str = "") -> str:
    group = f"le, {by}" if by else "le"
    return f"histogram_quantile({q_}, sum by ({group}) (increase({metric}_bucket[{window}])))"


STAGES = (
    ("fault → out of service", "pitcrew_time_to_out_of_service_seconds"),
    ("fault → job running again", "pitcrew_time_to_job_running_seconds"),
    ("fault → node back", "pitcrew_time_to_node_back_seconds"),
    ("fault → incident closed", "pitcrew_time_to_recovery_seconds"),
)
INCIDENT_LINKS = [
    {
        # pitcrew_incident_info's ``thread`` label: the permalink, once the thread is posted.
        "title": "Slack thread of ${__data.fields.incident}",
        "url": "${__data.fields.thread}",
        "targetBlank": True,
    },
    {
        "title": "Incident ${__data.fields.incident} (pitcrew read API: timeline, links; needs the read token)",
        "url": "${pitcrew_url}/api/v1/incidents/${__data.fields.incident}",
        "targetBlank": True,
    },
    {"title": "Runbook: ${__data.fields.playbook}", "url": "${runbook_url}", "targetBlank": True},
]
TEXT_VARS = (
    {
        "name": "pitcrew_url",
        "label": "pitcrew URL",
        "type": "textbox",
        "query": "http://pitcrew.pitcrew.svc:9095",
        "hide": 2,
    },
    {"name": "runbook_url", "label": "Runbook", "type": "textbox", "query": RUNBOOK, "hide": 2},
)


def incidents() -> dict[str, Any]:
    active_table = Panel(
        "Active incidents by node",
        "Every incident not yet ended: node, playbook, the step its node track is at, mode, and age. "
        "Click an incident for its Slack thread or its timeline, a playbook for its runbook.",
        (Query("time() - pitcrew_incident_info", instant=True, table=True),),
        "table",
        24,
        8,
        "s",
        {"showHeader": True, "sortBy": [{"displayName": "age", "desc": True}]},
        {
            "transformations": [
                {
                    "id": "organize",
                    "options": {
                        "excludeByName": {"Time": True},
                        "indexByName": {
                            "incident": 0,
                            "node": 1,
                            "playbook": 2,
                            "step": 3,
                            "mode": 4,
                            "Value": 5,
                            "thread": 6,
                        },
                        "renameByName": {"Value": "age"},
                    },
                }
            ],
            "fieldConfig": {
                "defaults": {"unit": "s"},
                "overrides": [
                    {
                        "matcher": {"id": "byName", "options": "incident"},
                        "properties": [{"id": "links", "value": INCIDENT_LINKS[:2]}],
                    },
                    {
                        "matcher": {"id": "byName", "options": "playbook"},
                        "properties": [{"id": "links", "value": INCIDENT_LINKS[2:]}],
                    },
                    {  # hidden, not excluded: the incident's Slack link reads it from the row
                        "matcher": {"id": "byName", "options": "thread"},
                        "properties": [{"id": "custom.hidden", "value": True}],
                    },
                ],
            },
        },
    )
    panels = [
        _stat("Active incidents", "Incidents not yet ended.", "sum(pitcrew_incidents_active)"),
        _stat(
            "Nodes under remediation",
            "Nodes whose playbook is running or verifying now.",
            "pitcrew_nodes_under_remediation",
        ),
        _stat("Approvals waiting", "Incidents waiting for an approver now.", "pitcrew_approvals_waiting"),
        _state_stat(
            "Circuit breaker",
            "OPEN: pitcrew touches no more nodes until a human resets it (pitcrew breaker reset).",
            "max(pitcrew_breaker_open)",
            off=("closed", "green"),
            on=("OPEN", "red"),
        ),
        _state_stat(
            "Paused",
            "PAUSED: no destructive step starts (pitcrew pause / resume).",
            "max(pitcrew_paused)",
            off=("running", "green"),
            on=("PAUSED", "orange"),
        ),
        _stat(
            "GPU-hours lost",
            "GPU-hours out of service over the time range (each node's GPUs x fault → back in service).",
            "sum(increase(pitcrew_gpu_hours_lost_total[$__range]))",
            "none",
        ),
        active_table,
        Panel(
            "Incidents closed by playbook and outcome",
            "How many incidents ended, how (resolved, failed, rolled back, suppressed), per playbook.",
            (
                Query(
                    "sum by (playbook, state) (increase(pitcrew_incidents_closed_total[$__rate_interval]))",
                    "{{playbook}} {{state}}",
                ),
            ),
            options={"legend": {"displayMode": "table", "placement": "right"}},
            extra={
                "fieldConfig": {
                    "defaults": {"custom": {"drawStyle": "bars", "stacking": {"mode": "normal"}}},
                    "overrides": [],
                }
            },
        ),
        Panel(
            "Time to recovery distribution",
            "Fault → incident closed, all playbooks: where most incidents end.",
            (
                Query(
                    "sum by (le) (increase(pitcrew_time_to_recovery_seconds_bucket[$__rate_interval]))",
                    "{{le}}",
                    heatmap=True,
                ),
            ),
            "heatmap",
            unit="s",
            options={"calculate": False, "yAxis": {"unit": "s"}},
        ),
        Panel(
            "Recovery stages (median over the range)",
            "Median time from the fault to each stage: out of service, training running again, node back, closed.",
            tuple(Query(_quantile(metric, 0.5, "$__range"), label, instant=True) for label, metric in STAGES),
            "bargauge",
            unit="s",
            options={"orientation": "horizontal", "displayMode": "basic"},
        ),
        Panel(
            "Recovery stages p90 by playbook",
            "90th percentile time from the fault to each stage, per playbook.",
            tuple(
                Query(_quantile(metric, 0.9, "$__rate_interval", "playbook"), f"{label} {{{{playbook}}}}")
                for label, metric in STAGES
            ),
            unit="s",
        ),
        Panel(
            "GPU-hours lost over time",
            "GPU-hours out of service per fault class, and training GPU-hours lost by interrupted jobs.",
            (
                Query(
                    "sum by (fault_class) (increase(pitcrew_gpu_hours_lost_total[$__rate_interval]))",
                    "node {{fault_class}}",
                ),
                Query(
                    "sum by (fault_class) (increase(pitcrew_job_gpu_hours_lost_total[$__rate_interval]))",
                    "jobs {{fault_class}}",
                ),
            ),
            unit="none",
        ),
        Panel(
            "GPU-hours lost by fault class",
            "Over the time range: what each class of fault cost.",
            (
                Query(
                    "sort_desc(sum by (fault_class) (increase(pitcrew_gpu_hours_lost_total[$__range])))",
                    "{{fault_class}}",
                    instant=True,
                ),
            ),
            "bargauge",
            unit="none",
            options={"orientation": "horizontal", "displayMode": "gradient"},
        ),
        Panel(
            "Trust ledger",
            "Per playbook and fault class over the range: remediations humans rolled back or rejected, "
            "remediated nodes that passed their retest, and nodes back with the same fault within the escalation window.",
            (
                Query(
                    "sum by (playbook, fault_class, action) (increase(pitcrew_trust_overrides_total[$__range]))",
                    instant=True,
                    table=True,
                ),
                Query(
                    "sum by (playbook, fault_class, outcome) (increase(pitcrew_trust_retests_total[$__range]))",
                    instant=True,
                    table=True,
                ),
            ),
            "table",
            12,
            options={"showHeader": True},
            extra={
                "transformations": [
                    {"id": "merge", "options": {}},
                    {
                        "id": "filterByValue",  # the series are pre-initialised at 0: show what happened
                        "options": {
                            "type": "exclude",
                            "match": "any",
                            "filters": [
                                {
                                    "fieldName": "Value #A",
                                    "config": {"id": "lowerOrEqual", "options": {"value": 0}},
                                },
                                {
                                    "fieldName": "Value #B",
                                    "config": {"id": "lowerOrEqual", "options": {"value": 0}},
                                },
                            ],
                        },
                    },
                ]
            },
        ),
        Panel(
            "False-positive and repeat rates",
            "Overridden remediations per incident closed, and repeats per passed retest, per playbook.",
            (
                Query(
                    "sum by (playbook) (increase(pitcrew_trust_overrides_total[$__range])) / "
                    "sum by (playbook) (increase(pitcrew_incidents_closed_total[$__range]))",
                    "overridden {{playbook}}",
                    instant=True,
                ),
                Query(
                    'sum by (playbook) (increase(pitcrew_trust_retests_total{outcome="repeat"}[$__range])) / '
                    'sum by (playbook) (increase(pitcrew_trust_retests_total{outcome="passed"}[$__range]))',
                    "repeat {{playbook}}",
                    instant=True,
                ),
            ),
            "bargauge",
            unit="percentunit",
            options={"orientation": "horizontal", "displayMode": "basic"},
        ),
        Panel(
            "Step failures and retries",
            "Steps that failed (escalated to a human) or were retried after a far-side error.",
            (
                Query(
                    'sum by (step, outcome) (increase(pitcrew_steps_total{outcome=~"failed|escalated|retried"}[$__rate_interval]))',
                    "{{step}} {{outcome}}",
                ),
            ),
        ),
        Panel(
            "Integration errors",
            "Errors far sides answered with, by system and reason (timeouts, refusals, unreachable).",
            (
                Query(
                    "sum by (system, reason) (increase(pitcrew_integration_errors_total[$__rate_interval]))",
                    "{{system}} {{reason}}",
                ),
            ),
        ),
        Panel(
            "Breaker, pause and approvals",
            "Circuit breaker open, pitcrew paused, approvals waiting, nodes under remediation.",
            (
                Query("max(pitcrew_breaker_open)", "breaker open"),
                Query("max(pitcrew_paused)", "paused"),
                Query("pitcrew_approvals_waiting", "approvals waiting"),
                Query("pitcrew_nodes_under_remediation", "nodes under remediation"),
            ),
        ),
        Panel(
            "Approval wait p90",
            "How long incidents waited for a human's decision, per playbook.",
            (
                Query(
                    _quantile("pitcrew_approval_wait_seconds", 0.9, "$__rate_interval", "playbook"),
                    "{{playbook}}",
                ),
            ),
            unit="s",
        ),
    ]
    return _dashboard(
        INCIDENTS_UID,
        "pitcrew incidents",
        "What is pitcrew doing right now, how fast does the fleet recover, what did each failure cost, "
        "and how often do humans overrule it. Red regions are pitcrew incidents.",
        panels,
        TEXT_VARS,
    )


# ------------------------------------------------------------------ output
FILES = {"gpu-fleet-health.json": fleet, "pitcrew-incidents.json": incidents}


def dashboard_json(dashboard: dict[str, Any]) -> str:
    return json.dumps(dashboard, indent=2, ensure_ascii=False) + "\n"


def configmap() -> str:
    """The dashboards as a ConfigMap the kube-prometheus-stack Grafana sidecar picks up."""
    document = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": "pitcrew-dashboards",
            "namespace": "pitcrew",
            "labels": {"grafana_dashboard": "1", "app.kubernetes.io/name": "pitcrew"},
            "annotations": {"grafana_folder": "pitcrew"},
        },
        "data": {name: dashboard_json(make()) for name, make in FILES.items()},
    }
    header = "# Generated by grafana/render.py from grafana/dashboards/: do not edit; run `python grafana/render.py`.\n"
    return header + yaml.dump(document, Dumper=_BlockDumper, sort_keys=False, width=200)


class _BlockDumper(yaml.SafeDumper):
    """Multi-line strings (the dashboards' JSON) as literal blocks, readable in a diff."""


def _block(dumper: yaml.SafeDumper, text: str) -> yaml.ScalarNode:
    return dumper.represent_scalar("tag:yaml.org,2002:str", text, style="|" if "\n" in text else None)


_BlockDumper.add_representer(str, _block)


def outputs() -> dict[Path, str]:
    files = {DASHBOARDS / name: dashboard_json(make()) for name, make in FILES.items()}
    files[CONFIGMAP] = configmap()
    return files


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="fail if a generated file differs")
    args = parser.parse_args(argv)
    stale = []
    for path, text in outputs().items():
        if args.check:
            if not path.exists() or path.read_text() != text:
                stale.append(str(path.relative_to(HERE.parent)))
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
    if stale:
        print("out of date (run python grafana/render.py): " + ", ".join(stale), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
