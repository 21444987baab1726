"""The REST-only deployment (the default image: no Slurm client) against a real Slurm.

pitcrew runs with ``slurm.backend: rest`` and a PATH holding no ``scontrol`` (the test empties
it, as the image has none), in front of the simulated Kubernetes side. Cases, on each Slurm:

* 24.11 (slurmrestd v0.0.40-42; pitcrew picks v0.0.42), or 26.05 (v0.0.42-45; pitcrew picks
  v0.0.45, with ``--slurm 26.05``): an XID 79 incident resolves through
  slurmrestd alone — the jobs on the node, DOWN with pitcrew's reason, the requeued job running
  elsewhere, RESUME — and no step retries for want of a command;
* ``check-config --live`` in that same environment says what it cannot do: requeue (no
  slurmrestd version before v0.0.45 has it), and names the playbooks that may need it after a
  DRAIN; on 26.05 (v0.0.45 requeues) nothing is missing;
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
from tests.e2e.slurm_engine import (
    TERMINAL,
    drain_fault,
    open_incident,
    reset_gpu_with_drain_grace,
    training_on_a_node,
)
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
    # Refused where something is missing; 26.05 misses nothing.
    assert done.returncode == (0 if slurm.version == "26.05" else 1), done.stdout + done.stderr
    line = line_of(done.stdout, "slurm")
    if slurm.version == "22.05":
        assert line.split()[0] == "FAIL", line
        assert "v0.0.38" in line and "node updates need scontrol" in line, line
        assert "slurm: scontrol on PATH" in done.stderr, done.stderr
    elif slurm.version == "24.11":
        # Every read and node update works over REST: the far side is reachable, yet one
        # operation is missing and the playbooks that may need it are named.
        assert line.split()[0] == "ok", line
        assert "v0.0.42: partitions: gpu; node updates over REST; no requeue" in line, line
        [refusal] = [ln for ln in done.stderr.splitlines() if "requeue" in ln]
        assert "slurmrestd v0.0.42 has no requeue operation and scontrol is unusable here" in refusal
        assert "replace-node" in refusal and "reset-gpu" in refusal
        assert "docker build --target scontrol" in refusal
    else:  # 26.05's v0.0.45 requeues too: nothing is missing without scontrol
        assert line.split()[0] == "ok", line
        assert "v0.0.45: partitions: gpu; node updates and requeue over REST" in line, line
        assert not [ln for ln in done.stderr.splitlines() if "requeue" in ln], done.stderr


def test_rest_only_xid79_resolves_without_scontrol(
    slurm: SlurmCluster, pitcrew_factory: Any, tmp_path: Path
) -> None:
    if slurm.version == "22.05":
        pytest.skip("slurmrestd v0.0.38 cannot update nodes: check-config refuses this (test above)")
    server = pitcrew_factory(
        "rest-only", config=_settings(slurm), env=_no_scontrol(tmp_path), slurm=slurm
    ).start()
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
    wait_until(lambda: slurm.node(node).in_service, timeout=60, what=f"{node} back in service")
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


def test_rest_only_drain_grace_requeues_over_rest_where_slurmrestd_can(
    slurm: SlurmCluster, pitcrew_factory: Any, tmp_path: Path
) -> None:
    """A DRAIN fault whose job outlives the drain grace, which pitcrew must requeue, with no
    scontrol. 26.05's slurmrestd (v0.0.45) requeues: the job runs again elsewhere from its
    checkpoint, the incident resolves, and nothing asked for scontrol. Before v0.0.45 there is
    no way: the step fails saying so, as ``check-config --live`` warned (test above)."""
    if slurm.version == "22.05":
        pytest.skip("slurmrestd v0.0.38 cannot update nodes: check-config refuses this (test above)")
    config = _settings(slurm) | {"playbooks": reset_gpu_with_drain_grace(2)}
    server = pitcrew_factory("rest-only-drain", config=config, env=_no_scontrol(tmp_path)).start()
    job_id, node = training_on_a_node(slurm)
    incident_id = open_incident(server, drain_fault(node))
    final = server.wait_incident(incident_id, *TERMINAL, timeout=90)

    requeues = [e for e in events(final, "action") if e["data"]["action"] == "slurm_requeue"]
    if slurm.version == "24.11":
        assert final["state"] == "failed", final["outcome"]
        assert "scontrol" in final["outcome"] and not requeues, final["outcome"]
        return
    assert final["state"] == "resolved", final["outcome"]
    assert [job_id in e["detail"] for e in requeues] == [True]
    assert "scontrol" not in server.log.read_text()
    job = slurm.job(job_id)
    assert job is not None and job.running and job.restarts == 1 and node not in job.nodes
    wait_until(
        lambda: (p := read_progress(slurm.job_dir, job_id)) is not None and p["restart_count"] == 1,
        timeout=30,
        what=f"job {job_id} to report its restart",
    )
