"""The REST-only deployment (the default image: no Slurm client) against a real Slurm.

pitcrew runs with ``slurm.backend: rest`` and a PATH holding no ``scontrol`` (the test empties
it, as the image has none), in front of the simulated Kubernetes side. Cases, on each Slurm:

* 24.11 (slurmrestd v0.0.40-42; pitcrew picks v0.0.42), or 26.05 (v0.0.42-45; pitcrew picks
  v0.0.45, with ``--slurm 26.05``): an XID 79 incident resolves through
  slurmrestd alone — the jobs on the node, DOWN with pitcrew's reason, the requeued job running
  elsewhere, RESUME — and no step retries for want of a command;
* ``check-config --live`` in that same environment says what it cannot do: requeue (no
  slurmrestd version has it), and names the playbooks that may need it after a DRAIN;
* 22.05 (slurmrestd v0.0.38 cannot update nodes): ``check-config --live`` refuses, naming the
  missing ``scontrol`` for node updates, before any incident could fail on it.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest

from proving_ground.slurm import SlurmCluster
from proving_ground.train_job import read_progress
from tests.e2e.slurm_engine import TERMINAL, open_incident, training_on_a_node
from tests.harness.check_config import check_live, line_of
from tests.harness.proc import wait_until
from tests.harness.scenarios import delivery, events, step_result

pytestmark = [pytest.mark.slow, pytest.mark.every_slurm]


def _no_scontrol(tmp_path: Path) -> dict[str, str]:
    """The environment of an image without Slurm's client: a PATH with nothing on it."""
    empty = tmp_path / "empty-path"
    empty.mkdir(exist_ok=True)
    assert shutil.which("scontrol", path=str(empty)) is None
    return {"PATH": str(empty)}


def _settings(slurm: SlurmCluster) -> dict[str, Any]:
    values: dict[str, Any] = slurm.pitcrew_settings("rest", command_timeout=5)
    values["slurm"].pop("bin_dir", None)  # the proving ground's scontrol wrapper: not in this image
    return {
        "mode": "auto",
        "guards": {"breaker": {"max_nodes": 10, "max_fraction": 1.0}},
        **values,
    }


def test_rest_only_check_config_names_what_it_cannot_do(slurm: SlurmCluster, tmp_path: Path) -> None:
    # A Slurm-only site (no Kubernetes to reach): only Slurm is probed.
    settings = _settings(slurm) | {"integrations": {"scheduler": "slurm", "cluster": "none"}}
    done = check_live(tmp_path, settings, env=_no_scontrol(tmp_path))
    assert done.returncode == 1, done.stdout + done.stderr
    line = line_of(done.stdout, "slurm")
    if slurm.version == "22.05":
        assert line.split()[0] == "FAIL", line
        assert "v0.0.38" in line and "node updates need scontrol" in line, line
        assert "slurm: scontrol on PATH" in done.stderr, done.stderr
    else:
        # Every read and node update works over REST: the far side is reachable, yet one
        # operation is missing and the playbooks that may need it are named.
        assert line.split()[0] == "ok", line
        picked = {"24.11": "v0.0.42", "26.05": "v0.0.45"}[slurm.version]  # the newest it serves
        assert f"{picked}: partitions: gpu; node updates over REST; no requeue" in line, line
        [refusal] = [ln for ln in done.stderr.splitlines() if "requeue" in ln]
        assert f"slurmrestd {picked} has no requeue operation and scontrol is unusable here" in refusal
        assert "replace-node" in refusal and "reset-gpu" in refusal
        assert "docker build --target scontrol" in refusal


def test_rest_only_xid79_resolves_without_scontrol(
    slurm: SlurmCluster, pitcrew_factory: Any, tmp_path: Path
) -> None:
    if slurm.version == "22.05":
        pytest.skip("slurmrestd v0.0.38 cannot update nodes: check-config refuses this (test above)")
    server = pitcrew_factory("rest-only", config=_settings(slurm), env=_no_scontrol(tmp_path)).start()
    job_id, node = training_on_a_node(slurm)
    incident_id = open_incident(server, delivery("xid79-firing.json", node=node))
    final = server.wait_incident(incident_id, *TERMINAL, timeout=90)

    assert final["state"] == "resolved", final["outcome"]
    down = step_result(final, "slurm_down")
    assert (down["action"], down["owned"]) == ("down", {node: True})
    assert [j["job_id"] for j in down["jobs"]] == [job_id]
    [record] = step_result(final, "confirm_resumed")["jobs"]
    assert record["status"] == "resumed", record["detail"]
    assert record["old_nodes"] == [node] != record["new_nodes"]
    # Nothing failed or was tried again, for want of a command or otherwise; one DOWN, one RESUME.
    assert not events(final, "step_retry"), [e["detail"] for e in events(final, "step_retry")]
    slurm_actions = [
        e["data"]["action"] for e in events(final, "action") if e["data"]["action"].startswith("slurm")
    ]
    assert slurm_actions == ["slurm_down", "slurm_resume"]
    assert "scontrol" not in server.log.read_text()
    wait_until(lambda: slurm.node(node).in_service, timeout=15, what=f"{node} back in service")
    # The job itself says it resumed from its checkpoint on the other node.
    wait_until(
        lambda: (p := read_progress(slurm.job_dir, job_id)) is not None and p["restart_count"] == 1,
        timeout=30,
        what=f"job {job_id} to report its restart",
    )
    progress = read_progress(slurm.job_dir, job_id)
    assert progress is not None
    assert progress["resumed_from"] > 0
    assert progress["node"] == record["new_nodes"][0]
