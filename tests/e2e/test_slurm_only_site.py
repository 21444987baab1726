"""A Slurm-only site (``integrations.cluster: none``) in auto mode, on a real Slurm cluster.

This is the configuration the refusal points Slurm-only sites to, run by the real
``pitcrew serve`` (no simulator): XID 79 under a checkpointing job. Cases: pitcrew records
the job and sets the node DOWN with its reason; cordon and drain are recorded as not
applicable; ``replace`` is handed to humans (a notice says so); the job track confirms the
job running again on another node and says so at once, while the node track waits; the
broken node stays DOWN with pitcrew's reason as long as its slurmd is the one it had at the
fault — nothing returns an unrepaired node to service; once the node's slurmd starts again
(the repair), pitcrew resumes it and the incident resolves with both times reported; the
dry-run journal holds only the notices. Both backends; ``rest`` as the REST-only image runs it,
with no ``scontrol`` on PATH (the slurmd start time, DOWN and RESUME all over slurmrestd), on
Slurm 24.11 only: 22.05's slurmrestd cannot update nodes.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from proving_ground.slurm import SlurmCluster
from tests.e2e.slurm_engine import open_incident, training_on_a_node
from tests.harness.engine_scans import scrape, wait_scans
from tests.harness.proc import wait_until
from tests.harness.scenarios import delivery, events, notices, step_result

pytestmark = pytest.mark.slow


@pytest.mark.every_slurm
@pytest.mark.parametrize("backend", ["scontrol", "rest"])
def test_slurm_only_site_hands_the_repair_to_humans_and_resumes_only_a_repaired_node(
    slurm: SlurmCluster, pitcrew_factory: Any, backend: str, tmp_path: Path
) -> None:
    env: dict[str, str] = {}
    if backend == "rest":
        if slurm.version == "22.05":
            pytest.skip("slurmrestd v0.0.38 cannot update nodes (test_slurm_rest_only)")
        (tmp_path / "empty-path").mkdir()
        env["PATH"] = str(tmp_path / "empty-path")  # the REST-only image: no Slurm client
    settings = slurm.pitcrew_settings(backend, command_timeout=5)
    if backend == "rest":
        settings["slurm"].pop("bin_dir", None)  # type: ignore[attr-defined]
    settings["integrations"] = {"scheduler": "slurm", "cluster": "none"}
    server = pitcrew_factory(
        "slurm-only",
        config={
            "mode": "auto",
            "guards": {"breaker": {"max_nodes": 10, "max_fraction": 1.0}},
            "playbooks": {
                "replace-node": {
                    "steps": [
                        "notify",
                        "slurm_down",
                        "cordon",
                        "drain",
                        "replace",
                        "wait_ready",
                        {"step": "slurm_resume", "options": {"requeue_wait_seconds": 5}},
                        "confirm_resumed",
                        "close",
                    ]
                }
            },
            **settings,
        },
        simulated=False,
        env=env,
    ).start()
    job_id, node = training_on_a_node(slurm)
    incident_id = open_incident(server, delivery("xid79-firing.json", node=node))

    # The job track ends while the node track waits for humans.
    running = server.wait_event(incident_id, "job_running", timeout=60)
    # The step announces training is back, then commits its result: read the incident after.
    server.wait_event(incident_id, "step_finished", "confirm_resumed", timeout=30)
    incident = server.incident(incident_id)
    assert incident["state"] == "verifying", incident["outcome"]
    [handover] = notices(server.journal_records(), "handover")
    assert handover["incident_id"] == incident_id and "replace" in handover["title"]
    assert step_result(incident, "replace")["handed_over"] is True
    for step in ("cordon", "drain"):
        assert "no Kubernetes cluster" in step_result(incident, step)["not_applicable"]
    [job] = step_result(incident, "confirm_resumed")["jobs"]
    assert job["job_id"] == job_id and job["status"] == "resumed" and node not in job["new_nodes"]
    assert running["data"]["seconds"] > 0
    assert notices(server.journal_records(), "job_running")

    wait_scans(scrape(server), 5)  # several polls: an unrepaired node must stay out
    state = slurm.node(node)
    assert state.down and state.reason.startswith(f"pitcrew: {incident_id} "), state
    assert server.incident(incident_id)["state"] == "verifying"

    slurm.restart_slurmd(node)  # the humans' repair
    final = server.wait_incident(incident_id, "resolved", timeout=60)
    assert step_result(final, "slurm_resume")["resumed"] == [node]
    wait_until(lambda: slurm.node(node).in_service, timeout=60, what=f"{node} in service after RESUME")
    actions = [e["data"]["action"] for e in events(final, "action")]
    assert actions == ["slurm_down", "slurm_resume"]
    closed = step_result(final, "close")
    assert 0 < closed["time_to_job_running_seconds"] < closed["time_to_node_back_seconds"]
    assert {r["op"] for r in server.journal_records()} == {"notice"}

    wait_until(
        lambda: (j := slurm.job(job_id)) is not None and j.running, timeout=60, what=f"job {job_id} running"
    )
