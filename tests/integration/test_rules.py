"""pitcrew's Prometheus rules, checked with the real promtool and against their generator.

Cases:
- ``promtool check rules`` accepts the shipped rule file and the FAST profile the e2e tests load;
- ``promtool test rules rules/tests/*.test.yml`` passes;
- every alert rule has at least one firing and one non-firing promtool case (a check that fails
  when someone adds a rule without tests);
- the checked-in rule file and PrometheusRule are exactly rules/render.py's output, and the CRD's
  groups are the rule file's groups;
- every alert carries a ``fault`` from pitcrew's vocabulary, a severity, summary and description,
  and a runbook_url only where the renderer is told where the runbook is published (pitcrew has no
  address of its own to link); hardware alerts keep firing through exporter blips; no alert keeps a
  pod label;
- the XID classes come from pitcrew's catalog: application XIDs never page, fatal ones are critical;
- the collectors CSV enables every exporter metric the rules read.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from bot.domain.catalog import parse_catalog
from bot.domain.faults import RECOVERY_XID
from rules import promql, render
from tests.harness.proc import require_binary

RULES = Path(render.__file__).resolve().parent
RULE_TESTS = sorted((RULES / "tests").glob("*.test.yml"))
FAULTS = {
    "xid",
    "ecc-dbe",
    "row-remap-failure",
    "row-remap-pending",
    "remapped-rows-uncorrectable",
    "health-fail",
    "gpu-missing",
    "exporter-down",
    "nvlink-errors",
    "thermal",
    "link-down",
    "link-flapping",
    "link-errors",
    "pitcrew",
}
HARDWARE_FAULTS = FAULTS - {"exporter-down", "pitcrew"}
#: labels that change without the fault changing: workload pod churn, exporter restarts, exporter upgrades
CHURNING_LABELS = {
    "pod",
    "namespace",
    "container",
    "instance",
    "Hostname",
    "hostname",
    "exported_pod",
    "DCGM_FI_DRIVER_VERSION",
    "err_msg",
}


def run(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False)


def alert_rules() -> list[dict[str, Any]]:
    groups = yaml.safe_load(render.RULE_FILE.read_text())["groups"]
    return [rule for group in groups for rule in group["rules"] if "alert" in rule]


def test_promtool_check_rules_accepts_shipped_and_fast_rules(tmp_path: Path) -> None:
    promtool = require_binary("promtool", "prometheus")
    fast = tmp_path / "fast.rules.yml"
    fast.write_text(render.render_rule_file(render.FAST))
    for path in (render.RULE_FILE, fast):
        result = run(promtool, "check", "rules", str(path))
        assert result.returncode == 0, result.stdout + result.stderr


def test_promtool_unit_tests_pass() -> None:
    promtool = require_binary("promtool", "prometheus")
    assert RULE_TESTS, "no promtool tests under rules/tests"
    result = run(promtool, "test", "rules", *map(str, RULE_TESTS))
    assert result.returncode == 0, result.stdout + result.stderr


def test_every_alert_has_a_firing_and_a_quiet_promtool_case() -> None:
    firing: set[str] = set()
    quiet: set[str] = set()
    for path in RULE_TESTS:
        for case in yaml.safe_load(path.read_text())["tests"]:
            for check in case.get("alert_rule_test", []):
                (firing if check.get("exp_alerts") else quiet).add(check["alertname"])
    names = {rule["alert"] for rule in alert_rules()}
    assert not names - firing, f"alerts without a firing promtool case: {sorted(names - firing)}"
    assert not names - quiet, f"alerts without a non-firing promtool case: {sorted(names - quiet)}"
    assert not (firing | quiet) - names, (
        f"tests for alerts that do not exist: {sorted((firing | quiet) - names)}"
    )


def test_checked_in_files_are_the_generators_output() -> None:
    assert render.main(["--check"]) == 0, "rules are stale: run `python rules/render.py`"
    crd = yaml.safe_load(render.CRD_FILE.read_text())
    assert (crd["apiVersion"], crd["kind"]) == ("monitoring.coreos.com/v1", "PrometheusRule")
    assert crd["spec"] == yaml.safe_load(render.RULE_FILE.read_text())


def test_generator_detects_a_hand_edit(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    edited = tmp_path / "gpu-faults.rules.yml"
    edited.write_text(render.RULE_FILE.read_text().replace("keep_firing_for: 10m", "keep_firing_for: 1m", 1))
    monkeypatch.setattr(render, "RULE_FILE", edited)
    assert render.main(["--check"]) == 1


def test_a_runbook_base_links_every_alert_to_its_heading(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in ("RULE_FILE", "CRD_FILE", "DEPLOY_CRD_FILE"):
        monkeypatch.setattr(render, name, tmp_path / name)
    assert render.main(["--runbook-base", "https://docs.example/pitcrew/alerting"]) == 0
    rules = [
        r for g in yaml.safe_load(render.RULE_FILE.read_text())["groups"] for r in g["rules"] if "alert" in r
    ]
    assert rules and all(
        r["annotations"]["runbook_url"] == f"https://docs.example/pitcrew/alerting#{r['alert'].lower()}"
        for r in rules
    )
    # The anchor is each alert's heading in docs/alerting.md, the runbook the base points at.
    headings = re.findall(r"^### (\w+)$", (RULES.parent / "docs" / "alerting.md").read_text(), re.M)
    assert {r["alert"].lower() for r in rules} <= {h.lower() for h in headings}


@pytest.mark.parametrize("rule", alert_rules(), ids=lambda rule: rule["alert"])
def test_alert_labels_and_annotations(rule: dict[str, Any]) -> None:
    assert rule["labels"]["fault"] in FAULTS
    assert rule["labels"]["severity"] in {"critical", "warning"}
    assert set(rule["annotations"]) == {"summary", "description"}
    if rule["labels"]["fault"] in HARDWARE_FAULTS:
        assert rule.get("keep_firing_for") == render.PRODUCTION.keep_firing_for
    kept = {label.strip() for by in re.findall(r"by \(([^)]*)\)", rule["expr"]) for label in by.split(",")}
    assert not kept & CHURNING_LABELS, (
        f"{rule['alert']} keeps {kept & CHURNING_LABELS}: churn would open new alerts"
    )


def test_xid_classes_follow_the_catalog() -> None:
    classes = promql.xid_classes()
    assert not set(classes.critical) & set(classes.no_page)
    assert {48, 79, 95, 119} <= set(classes.critical)
    assert {13, 31, 43, 45, 68, 69} <= set(classes.no_page)
    # An XID whose catalog entry names a playbook of its own reaches pitcrew whatever NVIDIA's
    # bucket: 94 (reset when convenient), 92, 157, 163-165 (a notice). A rule that never sends it
    # would make that entry dead.
    catalog = parse_catalog(yaml.safe_load(promql.CATALOG.read_text()))
    own = {code for code, entry in catalog.xids.items() if entry.playbook not in (None, "ignore")}
    assert {92, 94, 157, 163, 164, 165} <= own
    assert not own & set(classes.no_page), sorted(own & set(classes.no_page))
    quiet = {code for code, entry in catalog.xids.items() if catalog.xid_playbook(code) == "ignore"}
    assert quiet <= set(classes.no_page), sorted(quiet - set(classes.no_page))
    assert classes.recovery == RECOVERY_XID  # the XID whose alert the rules label with the action
    assert f"version {classes.version}" in render.RULE_FILE.read_text().splitlines()[0]


def test_collectors_csv_enables_every_exporter_metric_the_rules_read() -> None:
    csv_fields = {
        line.split(",")[0].strip()
        for line in (RULES / "dcgm-counters.csv").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    }
    read = set(re.findall(r"\bDCGM_(?:FI|EXP)_[A-Z0-9_]+", render.RULE_FILE.read_text()))
    assert read, "the rules read no exporter metric?"
    assert not read - csv_fields, f"rules read metrics the CSV does not enable: {sorted(read - csv_fields)}"
