"""checkov (Kubernetes and Dockerfile policies) on what we ship, in one run:

- ``deploy/`` as written, each overlay as rendered, and the Dockerfile: no failed check, and every
  skipped check carries its justification inline (``checkov.io/skipN`` annotation or
  ``# checkov:skip=ID: why`` comment);
- in the same run, a copy of the rendered Deployment with a writable root filesystem fails
  exactly the check that forbids it, so a silent checkov (no policies loaded, nothing parsed)
  cannot pass this test.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import yaml

from tests.packaging.manifests import DEPLOY, DOCKERFILE, OVERLAYS, container, rendered, tool

CHECKOV_INSTALL = "python3 -m venv .venv-checkov && .venv-checkov/bin/pip install checkov (.ci/run does this)"


def test_checkov_passes_on_deploy_dockerfile_and_rendered_overlays(tmp_path: Path) -> None:
    checkov = tool("checkov", CHECKOV_INSTALL, env="CHECKOV")
    scan = tmp_path / "scan"
    shutil.copytree(DEPLOY, scan / "deploy")
    shutil.copy2(DOCKERFILE, scan / "Dockerfile")
    for name in OVERLAYS:
        # One object a file: checkov reads nothing of kustomize's multi-document output.
        (scan / "rendered" / name).mkdir(parents=True)
        for i, obj in enumerate(rendered(name).objects):
            (scan / "rendered" / name / f"{i:02d}-{obj['kind']}.yaml").write_text(yaml.safe_dump(obj))
    broken = rendered("base").one("Deployment", "pitcrew")
    broken = json.loads(json.dumps(broken))
    container(broken)  # one container
    broken["spec"]["template"]["spec"]["containers"][0]["securityContext"]["readOnlyRootFilesystem"] = False
    (scan / "broken").mkdir()
    (scan / "broken" / "deployment.yaml").write_text(yaml.safe_dump(broken))

    result = subprocess.run(
        [checkov, "-d", str(scan), "--framework", "kubernetes", "dockerfile", "-o", "json", "--compact",
         "--skip-download"],
        capture_output=True, text=True, timeout=600, cwd=scan,
    )  # fmt: skip
    assert result.returncode in (0, 1), result.stderr[-3000:]
    reports = json.loads(result.stdout)
    reports = reports if isinstance(reports, list) else [reports]
    by_type = {r["check_type"]: r for r in reports}
    assert set(by_type) == {"kubernetes", "dockerfile"}
    failed = [c for r in reports for c in r["results"]["failed_checks"]]
    assert {(c["check_id"], _file(c)) for c in failed} == {("CKV_K8S_22", "/broken/deployment.yaml")}
    passed = [c for r in reports for c in r["results"]["passed_checks"]]
    files_checked = {_file(c) for c in passed}
    rendered_deployments = {
        name: f"/rendered/{name}/{_index(name, 'Deployment'):02d}-Deployment.yaml" for name in OVERLAYS
    }
    assert {
        "/Dockerfile",
        "/deploy/kubernetes/deployment.yaml",
        *rendered_deployments.values(),
    } <= files_checked
    deployment_checks = {c["check_id"] for c in passed if _file(c) == rendered_deployments["auto"]}
    assert {"CKV_K8S_20", "CKV_K8S_22", "CKV_K8S_28", "CKV_K8S_37", "CKV_K8S_40"} <= deployment_checks
    skipped = [c for r in reports for c in r["results"]["skipped_checks"]]
    assert skipped, "the justified exceptions (token mount, image digest, HEALTHCHECK) should show"
    for check in skipped:
        why = str(check.get("check_result", {}).get("suppress_comment") or "")
        assert len(why.strip()) > 20, f"{check['check_id']} in {_file(check)} skipped without a justification"
    # CKV_K8S_21 (default namespace): only the node-events Role and its binding, where node events live.
    assert {c["check_id"] for c in skipped} <= {"CKV_K8S_21", "CKV_K8S_38", "CKV_K8S_43", "CKV_DOCKER_2"}
    assert {c["resource"].split(".")[0] for c in skipped if c["check_id"] == "CKV_K8S_21"} == {
        "Role",
        "RoleBinding",
    }


def _file(check: dict[str, Any]) -> str:
    return str(check.get("file_path", ""))


def _index(overlay: str, kind: str) -> int:
    return [o["kind"] for o in rendered(overlay).objects].index(kind)
