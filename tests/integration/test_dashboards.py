"""Dashboard lint: what CI checks of grafana/ without a Grafana.

Cases: the committed dashboards and the ConfigMap are exactly grafana/render.py's output, and the
ConfigMap (label ``grafana_dashboard: "1"``) carries each dashboard unchanged; uids are stable and
unique; panel ids are unique; every panel sits inside the 24-column grid without overlapping
another; every panel and query reads ``${datasource}`` (no hard-coded datasource id; annotations
use Grafana's built-in source); every query parses (promtool, with Grafana's interval variables
set); every metric a query names is in pitcrew's registry or the dcgm-exporter stand-in's output;
the incident table links to the incident and the runbook; the provisioning files are valid.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from bot.config import Settings
from bot.engine.metrics import Metrics
from grafana import render
from tests.grafana.dashboards import DASHBOARD_DIR, REPO, concrete, dashboards, metric_names, panels, queries
from tests.harness.proc import require_binary
from tests.harness.prometheus.stack import COLLECTORS_CSV
from tests.standins.dcgm_exporter import Node, load_collectors

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
    names = set()
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
