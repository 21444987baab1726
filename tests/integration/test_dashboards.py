"""Dashboard lint: what CI checks of grafana/ without a Grafana.

Cases: the committed dashboards and the ConfigMap are exactly grafana/render.py's output, and the
ConfigMap (label ``grafana_dashboard: "1"``) carries each dashboard unchanged; uids are stable and
unique; panel ids are unique; every panel sits inside the 24-column grid without overlapping
another; every panel and query reads ``${datasource}`` (no hard-coded datasource id; annotations
use Grafana's built-in source); every query parses (promtool, with Grafana's interval variables
set); every metric a query names is in pitcrew's registry or the dcgm-exporter stand-in's output;
a gauge every replica exports (the leader's value, the others' 0) is read aggregated, one value;
the incident table links to the incident and the runbook; the provisioning files are valid; each
dashboard conforms to Grafana's schema as grafana-foundation-sdk's generated types encode it
(tests/grafana/schema.py), and that check refuses an unknown key, a wrong type, a value outside an
enum, an unknown panel or datasource type, at each level it reads.
"""

from __future__ import annotations

import copy
import json
import re
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from bot.config import Settings
from bot.engine.metrics import Metrics
from grafana import render
from proving_ground.assets import COLLECTORS_CSV
from proving_ground.dcgm import Node, load_collectors
from tests.grafana.dashboards import DASHBOARD_DIR, REPO, concrete, dashboards, metric_names, panels, queries
from tests.grafana.schema import violations
from tests.harness.proc import require_binary

DASHBOARDS = dashboards()
PROMETHEUS_BUILTIN = {"up"}  # every scrape's own series


def test_the_committed_files_are_the_generators_output() -> None:
    assert render.main(["--check"]) == 0, "run python grafana/render.py"
    assert set(DASHBOARDS) == {"gpu-fleet-health.json", "pitcrew-incidents.json"}


def test_the_configmap_carries_every_dashboard_for_the_sidecar() -> None:
    [document] = yaml.safe_load_all(render.CONFIGMAP.read_text())
    assert (document["kind"], document["metadata"]["name"]) == ("ConfigMap", "pitcrew-dashboards")
    assert document["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert {name: json.loads(text) for name, text in document["data"].items()} == DASHBOARDS
    assert render.CONFIGMAP == REPO / "deploy" / "kubernetes" / "grafana-dashboards.yaml"


def test_uids_are_stable_and_unique() -> None:
    uids = {name: d["uid"] for name, d in DASHBOARDS.items()}
    assert uids == {
        "gpu-fleet-health.json": "pitcrew-gpu-fleet-health",
        "pitcrew-incidents.json": "pitcrew-incidents",
    }
    grafana = Settings().grafana
    assert {grafana.fleet_dashboard_uid, grafana.incidents_dashboard_uid} == set(uids.values())


@pytest.mark.parametrize("name", DASHBOARDS)
def test_panels_have_unique_ids_inside_the_grid_without_overlap(name: str) -> None:
    every = list(panels(DASHBOARDS[name]))
    ids = [p["id"] for p in every]
    assert len(ids) == len(set(ids)), ids
    cells: dict[tuple[int, int], str] = {}
    for panel in every:
        box = panel["gridPos"]
        assert box["w"] > 0 and box["h"] > 0 and box["x"] >= 0 and box["y"] >= 0, panel["title"]
        assert box["x"] + box["w"] <= 24, f"{panel['title']} leaves the 24-column grid"
        for x in range(box["x"], box["x"] + box["w"]):
            for y in range(box["y"], box["y"] + box["h"]):
                assert (x, y) not in cells, f"{panel['title']} overlaps {cells[(x, y)]}"
                cells[(x, y)] = panel["title"]


@pytest.mark.parametrize("name", DASHBOARDS)
def test_every_query_reads_the_datasource_variable(name: str) -> None:
    dashboard = DASHBOARDS[name]
    [variable] = [v for v in dashboard["templating"]["list"] if v["name"] == "datasource"]
    assert (variable["type"], variable["query"]) == ("datasource", "prometheus")
    for panel in panels(dashboard):
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, panel["title"]
        assert panel["targets"], f"{panel['title']} has no query"
    for title, target in queries(dashboard):
        assert target["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, title
    for annotation in dashboard["annotations"]["list"]:
        assert annotation["datasource"] == {"type": "grafana", "uid": "-- Grafana --"}
        assert annotation["target"]["tags"] == ["pitcrew"]
    text = json.dumps(dashboard)
    assert '"datasource": "' not in text and "datasourceId" not in text  # no legacy id or name


def _registry_names() -> set[str]:
    names: set[str] = set()
    for family in Metrics().registry.collect():
        suffixes = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count"), "info": ("_info",)}
        names.update(family.name + s for s in suffixes.get(family.type, ("",)))
    return names


def _dcgm_names() -> set[str]:
    collectors, fields = load_collectors(COLLECTORS_CSV)
    node = Node("gpu-node-01", collectors=collectors, fields=fields)
    node.inject("xid", gpu=3, xid=79)  # the XID families appear with the first XID
    return {line.split()[2] for line in node.render().splitlines() if line.startswith("# TYPE")}


def test_every_metric_a_panel_reads_exists() -> None:
    known = _registry_names() | _dcgm_names() | PROMETHEUS_BUILTIN
    for name, dashboard in DASHBOARDS.items():
        for title, target in queries(dashboard):
            unknown = metric_names(target["expr"]) - known
            assert not unknown, (
                f"{name} / {title}: {sorted(unknown)} is in neither pitcrew's registry nor dcgm-exporter's output"
            )


#: Gauges every pitcrew replica exports: the one that leads the store's state, every other 0 (they
#: forget what they showed when they stop leading). A panel that reads one bare shows a value per
#: replica: "Approvals waiting" said 3 and 0 side by side on the ``ha`` overlay. Summed across
#: replicas, a failover counts twice: a deposed leader shows what its scan last saw until it
#: notices (at most a lease TTL), beside the new leader's, and "Active incidents" (a sum) doubled.
#: So each is read through ``max`` (or ``min``) first, across replicas; a sum may follow, over labels.
PER_REPLICA = (
    "pitcrew_incidents_active",
    "pitcrew_nodes_under_remediation",
    "pitcrew_approvals_waiting",
    "pitcrew_incident_oldest_active_seconds",
    "pitcrew_breaker_open",
    "pitcrew_paused",
    "pitcrew_outbox_pending",
    "pitcrew_capacity_idle_nodes",
    "pitcrew_capacity_idle_gpus",
    "pitcrew_capacity_lent_nodes",
)
#: What may come right before a gauge every replica exports: ``max`` or ``min``, by or without
#: labels, opening its argument.
_ACROSS_REPLICAS = re.compile(r"\b(max|min)\s*(?:(?:by|without)\s*\([^()]*\)\s*)?\(\s*$")


def across_replicas(expr: str, gauge: str) -> bool:
    """Whether every read of ``gauge`` in ``expr`` is the argument of a ``max`` or ``min``."""
    reads = [m.start() for m in re.finditer(rf"\b{re.escape(gauge)}\b", expr)]
    return bool(reads) and all(_ACROSS_REPLICAS.search(expr[:at]) for at in reads)


@pytest.mark.parametrize(
    ("expr", "one"),
    [
        ("max(pitcrew_paused)", True),
        ("sum(max by (state) (pitcrew_incidents_active))", True),
        ("max by (pool) (pitcrew_capacity_lent_nodes) or vector(0)", True),
        ("min without (pod) (pitcrew_paused{job='x'})", True),
        ("sum(pitcrew_incidents_active)", False),
        ("sum by (pool) (pitcrew_capacity_lent_nodes)", False),
        ("pitcrew_paused", False),
        ("max(pitcrew_paused) + pitcrew_paused", False),
        ("count(pitcrew_paused)", False),
    ],
)
def test_the_lint_tells_a_read_across_replicas(expr: str, one: bool) -> None:
    gauge = next(name for name in PER_REPLICA if name in expr)
    assert across_replicas(expr, gauge) is one


def test_a_gauge_each_replica_exports_is_read_as_one_value() -> None:
    for name, dashboard in DASHBOARDS.items():
        for title, target in queries(dashboard):
            for gauge in sorted(metric_names(target["expr"]) & set(PER_REPLICA)):
                assert across_replicas(target["expr"], gauge), (
                    f"{name} / {title}: {target['expr']!r} reads {gauge} per replica (summed, a failover "
                    "counts it twice); read it through max() first"
                )


def test_every_query_parses(tmp_path: Path) -> None:
    promtool = require_binary("promtool", "prometheus")
    rules = [
        {"record": f"dashboard:query_{i}", "expr": concrete(target["expr"])}
        for i, (_, target) in enumerate(q for d in DASHBOARDS.values() for q in queries(d))
    ]
    rule_file = tmp_path / "queries.rules.yml"
    rule_file.write_text(yaml.safe_dump({"groups": [{"name": "dashboards", "rules": rules}]}))
    checked = subprocess.run(
        [promtool, "check", "rules", str(rule_file)], capture_output=True, text=True, check=False
    )
    assert checked.returncode == 0, checked.stderr + checked.stdout
    assert f"{len(rules)} rules found" in checked.stdout


def test_the_incident_table_links_to_the_slack_thread_the_incident_and_its_runbook() -> None:
    dashboard = DASHBOARDS["pitcrew-incidents.json"]
    [table] = [p for p in panels(dashboard) if p["title"] == "Active incidents by node"]
    assert [t["expr"] for t in table["targets"]] == ["time() - pitcrew_incident_info"]
    overrides = {o["matcher"]["options"]: o["properties"] for o in table["fieldConfig"]["overrides"]}
    links = {
        field: [link["url"] for p in properties if p["id"] == "links" for link in p["value"]]
        for field, properties in overrides.items()
    }
    assert links == {
        "incident": ["${__data.fields.thread}", "${pitcrew_url}/api/v1/incidents/${__data.fields.incident}"],
        "playbook": ["${runbook_url}"],
        "thread": [],
    }
    # The permalink column is hidden, not excluded: a data link reads only the fields of its row.
    assert overrides["thread"] == [{"id": "custom.hidden", "value": True}]
    [organize] = [t for t in table["transformations"] if t["id"] == "organize"]
    assert "thread" not in organize["options"]["excludeByName"]
    variables = {v["name"] for v in dashboard["templating"]["list"]}
    assert {"pitcrew_url", "runbook_url"} <= variables


def _provisioning(kind: str) -> dict[str, Any]:
    [path] = (REPO / "grafana" / "provisioning" / kind).glob("*.yaml")
    document: dict[str, Any] = yaml.safe_load(path.read_text())
    assert document["apiVersion"] == 1
    return document


def test_the_provisioning_files_are_valid() -> None:
    [source] = _provisioning("datasources")["datasources"]
    assert source["type"] == "prometheus" and source["access"] == "proxy" and source["url"].startswith("http")
    [provider] = _provisioning("dashboards")["providers"]
    assert provider["type"] == "file" and provider["options"]["path"].startswith("/")
    assert set(provider) <= {
        "name", "orgId", "folder", "folderUid", "type", "disableDeletion", "allowUiUpdates",
        "updateIntervalSeconds", "options",
    }  # fmt: skip
    assert DASHBOARD_DIR.is_dir()


@pytest.mark.parametrize("name", DASHBOARDS)
def test_every_dashboard_conforms_to_grafanas_schema(name: str) -> None:
    assert violations(DASHBOARDS[name]) == []


def _panel(dashboard: dict[str, Any], title: str) -> dict[str, Any]:
    [panel] = [p for p in panels(dashboard) if p["title"] == title]
    return panel


def _foreign_datasource(dashboard: dict[str, Any]) -> None:
    panel = _panel(dashboard, "Active incidents")
    panel["datasource"] = panel["targets"][0]["datasource"] = {"type": "influxdb", "uid": "influx"}


Mutation = Callable[[dict[str, Any]], None]
BROKEN: dict[str, tuple[Mutation, str]] = {
    "unknown dashboard key": (
        lambda d: d.update(refreshInterval="30s"),
        "dashboard.refreshInterval: not in Grafana's schema",
    ),
    "unknown panel key": (
        lambda d: _panel(d, "Active incidents").update(gridpos={}),
        "dashboard.panels[0].gridpos: not in Grafana's schema",
    ),
    "grid width as a string": (
        lambda d: _panel(d, "Active incidents")["gridPos"].update(w="4"),
        "dashboard.panels[0].grid_pos.w: '4' is not a int",
    ),
    "cursor sync outside its enum": (
        lambda d: d.update(graphTooltip=7),
        "dashboard.graph_tooltip: 7 is not one of [0, 1, 2]",
    ),
    "repeat direction outside its literal": (
        lambda d: _panel(d, "Active incidents").update(repeatDirection="x"),
        "dashboard.panels[0].repeat_direction: 'x' is not one of ['h', 'v']",
    ),
    "unknown stat option": (
        lambda d: _panel(d, "Active incidents")["options"].update(reduceOption={}),
        "dashboard.panels[0].options.reduceOption: not in Grafana's schema",
    ),
    "stat option outside its enum": (
        lambda d: _panel(d, "Active incidents")["options"].update(graphMode="bars"),
        "dashboard.panels[0].options.graph_mode: 'bars' is not one of ['none', 'line', 'area']",
    ),
    "unknown Prometheus query key": (
        lambda d: _panel(d, "Active incidents")["targets"][0].update(legend="x"),
        "dashboard.panels[0].targets[0].legend: not in Grafana's schema",
    ),
    "table cell alignment outside its enum": (
        lambda d: _panel(d, "Active incidents by node")["fieldConfig"]["defaults"].update(
            custom={"align": "middle"}
        ),
        "dashboard.panels[6].field_config.defaults.custom.align: 'middle' is not one of",
    ),
    "value mapping text not a string": (
        lambda d: _panel(d, "Circuit breaker")["fieldConfig"]["defaults"]["mappings"][0]["options"][
            "0"
        ].update(text=0),
        "dashboard.panels[3].field_config.defaults.mappings[0].options.0.text: 0 is not a str",
    ),
    "transformation flag not a boolean": (
        lambda d: _panel(d, "Active incidents by node")["transformations"][0].update(disabled="no"),
        "dashboard.panels[6].transformations[0].disabled: 'no' is not a bool",
    ),
    "unknown dashboard link key": (
        lambda d: d["links"][0].update(keeptime=True),
        "dashboard.links[0].keeptime: not in Grafana's schema",
    ),
    "variable visibility outside its enum": (
        lambda d: d["templating"]["list"][1].update(hide=5),
        "dashboard.templating.list_val[1].hide: 5 is not one of [0, 1, 2]",
    ),
    "unknown panel type": (
        lambda d: _panel(d, "Active incidents").update(type="stats"),
        "dashboard.panels[0]: no schema for panel type 'stats'",
    ),
    "query of a datasource without a schema": (
        _foreign_datasource,
        "dashboard.panels[0].targets[0]: no schema for its datasource type",
    ),
}


@pytest.mark.parametrize("case", BROKEN)
def test_the_schema_check_refuses_what_grafanas_schema_does_not_allow(case: str) -> None:
    mutate, expected = BROKEN[case]
    dashboard = copy.deepcopy(DASHBOARDS["pitcrew-incidents.json"])
    mutate(dashboard)
    [violation] = violations(dashboard)
    assert violation.startswith(expected), violation
