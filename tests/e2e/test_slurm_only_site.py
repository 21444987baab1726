"""A Slurm-only site (``integrations.cluster: none``) in auto mode, on a real Slurm cluster.

This is the configuration the refusal points Slurm-only sites to, run by the real
``pitcrew serve`` (no simulator): XID 79 under a checkpointing job. Cases: pitcrew records
the job and sets the node DOWN with its reason; Slurm requeues the job onto another node;
cordon and drain find no Kubernetes node and do nothing; ``replace`` cannot be done without
Kubernetes, so the incident fails and an escalation tells humans to take over; the broken
node stays DOWN with pitcrew's reason — nothing returns it to service; the dry-run journal
holds only the notices.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.e2e.slurm_engine import open_incident, training_on_a_node
from tests.harness.proc import wait_until
from tests.harness.scenarios import delivery, events, notices, step_result
from tests.harness.slurm import SlurmCluster

pytestmark = pytest.mark.slow


def test_slurm_only_site_takes_the_node_out_and_hands_replace_to_humans(
    slurm: SlurmCluster, pitcrew_factory: Any
) -> None:
    settings = slurm.pitcrew_settings("scontrol", command_timeout=5)
    settings["integrations"] = {"scheduler": "slurm", "cluster": "none"}
    server = pitcrew_factory(
        "slurm-only",
        config={"mode": "auto", "guards": {"breaker": {"max_nodes": 10, "max_fraction": 1.0}}, **settings},
        simulated=False,
    ).start()
    job_id, node = training_on_a_node(slurm)
    incident_id = open_incident(server, delivery("xid79-firing.json", node=node))

    failed = server.wait_incident(incident_id, "failed", timeout=60)
    assert failed["playbook"] == "replace-node"
    assert failed["outcome"].startswith(
        "replace failed: replace cannot succeed: integrations.cluster is none"
    )
    down = step_result(failed, "slurm_down")
    assert down["owned"] == {node: True} and [j["job_id"] for j in down["jobs"]] == [job_id]
    assert step_result(failed, "cordon") == {"owned": False, "absent": True}
    assert step_result(failed, "drain") == {"evicted": []}
    assert [e["data"]["action"] for e in events(failed, "action")] == ["slurm_down"]
    assert not step_result(failed, "slurm_resume")

    [escalation] = notices(server.journal_records(), "escalation")
    assert escalation["incident_id"] == incident_id
    assert any("a human takes over" in line for line in escalation["lines"])
    assert {r["op"] for r in server.journal_records()} == {"notice"}

    def moved() -> bool:  # Slurm requeued the job off the DOWN node; pitcrew had nothing to do with it
        job = slurm.job(job_id)
        return job is not None and job.running and job.restarts == 1 and node not in job.nodes

    wait_until(moved, timeout=30, interval=0.2, what=f"job {job_id} running again on another node")
    state = slurm.node(node)  # seconds after the failure: a (wrong) resume would have happened by now
    assert state.down and state.reason.startswith(f"pitcrew: {incident_id} "), state
