"""GPU died, training didn't — pitcrew itself (a subprocess, mode auto) against a real Slurm cluster.

The Kubernetes and notifier far sides are simulated (``tests.simulator``); Slurm is real (``slurm``
fixture: slurmctld + gpu-001..003, Kubernetes node name = Slurm node name). Cases:

* fatal fault (XID 79), both backends: pitcrew records the checkpointing training job, sets
  its node DOWN with ``pitcrew: <incident> …`` → Slurm requeues the job → it runs on another
  node and resumes from its checkpoint → ``confirm_resumed`` records job id, old and new node,
  restart count and timings → pitcrew RESUMEs the node (its own reason). Timings are printed;
* a ``--no-requeue`` job on the faulty node is reported lost (``job_lost`` notice with id and
  owner) at once, never waited for;
* a node someone else downed stays DOWN with their reason: slurm_down records it not-owned,
  slurm_resume and a rollback leave it alone;
* DRAIN (``row-remap-pending``, not job-fatal): the running job is left alone until it ends;
  with a short drain grace the job is requeued instead and resumes elsewhere; a ``--no-requeue``
  job is never asked for (Slurm would refuse): it runs on past the grace, its owner is told once
  (``job_not_requeueable``: job, name, owner, why, ``scancel``), and the drain goes on once its
  owner has ended it.
"""

from __future__ import annotations

import time
from typing import Any

import pytest

from proving_ground.slurm import SlurmCluster
from proving_ground.train_job import read_checkpoint, read_events, read_progress
from tests.e2e.slurm_engine import (
    TERMINAL,
    action_at,
    drain_fault,
    epoch,
    open_incident,
    reset_gpu_with_drain_grace,
    running_on,
    start_pitcrew,
    training_on_a_node,
)
from tests.harness.figures import show_figure
from tests.harness.proc import wait_until
from tests.harness.scenarios import delivery, events, notices, step_result

pytestmark = pytest.mark.slow

# --------------------------------------------------------------------------- fatal fault


@pytest.mark.every_slurm
@pytest.mark.parametrize("backend", ["scontrol", "rest"])
def test_fatal_fault_job_resumes_from_checkpoint_on_another_node(
    slurm: SlurmCluster, pitcrew_factory: Any, backend: str, capsys: pytest.CaptureFixture[str]
) -> None:
    server = start_pitcrew(pitcrew_factory, slurm, f"resume-{backend}", backend)
    job_id, node = training_on_a_node(slurm)
    step_before = read_checkpoint(slurm.job_dir, job_id)
    incident_id = open_incident(server, delivery("xid79-firing.json", node=node))

    # Watch Slurm and the job while pitcrew works: the DOWN it sets, the requeue, the move,
    # and the first step past the checkpoint.
    seen: dict[str, float] = {}
    down_reason = ""
    final: dict[str, Any] = {}
    deadline = time.monotonic() + 90
    while "past_checkpoint" not in seen or final.get("state") not in TERMINAL:
        assert time.monotonic() < deadline, f"incident {final.get('state')}, seen {sorted(seen)}"
        now = time.time()
        state = slurm.node(node)
        if state.down and not down_reason:
            down_reason = state.reason
        job = slurm.job(job_id)
        if job is not None and job.restarts >= 1:
            seen.setdefault("requeued", now)
            if job.state == "RUNNING" and node not in job.nodes:
                seen.setdefault("running_elsewhere", now)
        progress = read_progress(slurm.job_dir, job_id)
        if progress and progress["restart_count"] >= 1 and progress["step"] > progress["resumed_from"]:
            seen.setdefault("past_checkpoint", now)
        if final.get("state") not in TERMINAL:
            final = server.incident(incident_id)
        time.sleep(0.1)

    assert final["state"] == "resolved", final["outcome"]
    assert final["playbook"] == "replace-node"
    # Slurm showed the node DOWN with pitcrew's reason for this incident.
    assert down_reason.startswith(f"pitcrew: {incident_id} "), down_reason
    down = step_result(final, "slurm_down")
    assert down["action"] == "down"
    assert down["owned"] == {node: True}
    assert [j["job_id"] for j in down["jobs"]] == [job_id]
    # DOWN is read back at once, whichever backend and Slurm read it (24.11's slurmrestd may show
    # the node MIXED while its job is killed: the reason naming the incident says it is DOWN).
    assert not events(final, "step_retry"), [e["detail"] for e in events(final, "step_retry")]

    # The job was requeued, moved, and resumed from its checkpoint.
    job = slurm.job(job_id)
    assert job is not None
    assert job.state == "RUNNING"
    assert job.restarts == 1
    assert node not in job.nodes
    progress = read_progress(slurm.job_dir, job_id)
    assert progress is not None
    [fault_line] = [e for e in read_events(slurm.job_dir, job_id) if "SIGTERM" in e]
    step_at_fault = int(fault_line.rsplit("step=", 1)[1])
    assert f"node={node}" in fault_line
    assert progress["restart_count"] == 1
    assert progress["node"] == job.nodes[0]
    assert progress["resumed_from"] == step_at_fault >= step_before > 0  # from the checkpoint, not 0
    assert read_checkpoint(slurm.job_dir, job_id) > step_at_fault

    # confirm_resumed says the same, with the timings.
    [record] = step_result(final, "confirm_resumed")["jobs"]
    assert record["job_id"] == job_id
    assert record["status"] == "resumed", record["detail"]
    assert record["old_nodes"] == [node]
    assert record["new_nodes"] == list(job.nodes)
    assert (record["restarts_before"], record["restarts_now"]) == (0, 1)
    assert record["down_at"] is not None
    assert record["restarted_at"] is not None
    assert record["resumed_at"] is not None
    assert 0 < record["seconds_to_restart"] <= record["seconds_to_resumed"]

    # The node is pitcrew's to return, and it did.
    t_down = action_at(final, "slurm_down")
    t_resume = action_at(final, "slurm_resume")
    assert epoch(record["restarted_at"]) <= t_resume  # held out until the job ran elsewhere
    wait_until(lambda: slurm.node(node).in_service, timeout=60, what=f"{node} back in service")
    # 22.05 and 26.05 clear the reason on RESUME; 24.11 keeps the last one on the node back in service.
    assert slurm.node(node).reason == (down_reason if slurm.keeps_reason_on_resume else "")

    show_figure(
        capsys,
        f"\n[pitcrew + slurm {slurm.version} {backend}] {incident_id}: job {job_id} {node} -> {job.nodes[0]} "
        f"restarts 0->1 checkpoint {step_at_fault} -> step {progress['step']} | "
        f"DOWN->requeued {seen['requeued'] - t_down:.2f}s, "
        f"requeued->running elsewhere {seen['running_elsewhere'] - seen['requeued']:.2f}s, "
        f"running->past checkpoint {seen['past_checkpoint'] - seen['running_elsewhere']:.2f}s, "
        f"DOWN->RESUME {t_resume - t_down:.2f}s | confirm_resumed: restart after "
        f"{record['seconds_to_restart']:.2f}s, confirmed after {record['seconds_to_resumed']:.2f}s | "
        f"incident {epoch(final['closed_at']) - epoch(final['opened_at']):.2f}s",
    )


# --------------------------------------------------------------------------- not requeueable


def test_no_requeue_job_is_reported_lost_and_not_waited_for(
    slurm: SlurmCluster, pitcrew_factory: Any
) -> None:
    server = start_pitcrew(pitcrew_factory, slurm, "lost")
    job_id = slurm.submit("--no-requeue", "--job-name=no-requeue", "--gres=gpu:h100:8", "--wrap=sleep 300")
    node = running_on(slurm, job_id).nodes[0]
    incident_id = open_incident(server, delivery("xid79-firing.json", node=node))
    final = server.wait_incident(incident_id, *TERMINAL, timeout=60)

    assert final["state"] == "resolved", final["outcome"]
    job = slurm.job(job_id)
    assert job is not None
    assert job.state == "NODE_FAIL"
    [record] = step_result(final, "confirm_resumed")["jobs"]
    assert record["job_id"] == job_id
    assert record["status"] == "lost"
    assert "NODE_FAIL" in record["detail"]
    assert record["old_nodes"] == [node]
    assert record["restarts_now"] == 0
    # Reported, not waited for: neither the resume nor the confirmation polled for it.
    assert not events(final, "step_waiting", "slurm_resume")
    assert not events(final, "step_waiting", "confirm_resumed")
    [lost] = notices(server.journal_records(), "job_lost")
    assert lost["incident_id"] == incident_id
    assert f"Job {job_id} (no-requeue, owner root)" in lost["title"]
    wait_until(lambda: slurm.node(node).in_service, timeout=60, what=f"{node} back in service")


# --------------------------------------------------------------------------- not pitcrew's node


def test_node_downed_by_someone_else_is_never_resumed(slurm: SlurmCluster, pitcrew_factory: Any) -> None:
    server = start_pitcrew(pitcrew_factory, slurm, "theirs")
    node, theirs = "gpu-002", "hw check by ops"
    slurm.run("scontrol", "update", f"NodeName={node}", "State=DOWN", f"Reason={theirs}")
    incident_id = open_incident(server, delivery("xid79-firing.json", node=node))
    final = server.wait_incident(incident_id, *TERMINAL, timeout=60)

    assert final["state"] == "resolved", final["outcome"]
    assert step_result(final, "slurm_down")["owned"] == {node: False}
    [note] = events(final, "not_owned", "slurm_down")
    assert theirs in note["detail"]
    assert step_result(final, "slurm_resume")["resumed"] == []
    assert not [e for e in events(final, "action") if e["data"]["action"].startswith("slurm_")]
    state = slurm.node(node)
    assert state.down
    assert state.reason == theirs

    status, answer = server.command(f"/api/v1/incidents/{incident_id}/rollback", "alice")
    assert status == 200, answer
    assert f"slurm_down: {node} left DOWN (reason {theirs!r} is not pitcrew's)" in answer["report"]
    assert server.incident(incident_id)["state"] == "rolled_back"
    state = slurm.node(node)
    assert state.down
    assert state.reason == theirs


# --------------------------------------------------------------------------- DRAIN


STEPS = 20  # of the job the DRAIN leaves alone, one a second


def test_drain_leaves_the_running_job_alone_until_it_ends(slurm: SlurmCluster, pitcrew_factory: Any) -> None:
    server = start_pitcrew(pitcrew_factory, slurm, "drain")
    # Long enough to be seen running on the drained node several times, however slow each look
    # at Slurm and pitcrew is on a loaded machine.
    job_id, node = training_on_a_node(slurm, steps=STEPS, min_step=2)
    incident_id = open_incident(server, drain_fault(node))

    running_while_drained = 0
    final: dict[str, Any] = {}
    deadline = time.monotonic() + 120
    while final.get("state") not in TERMINAL:
        assert time.monotonic() < deadline, f"incident still {final.get('state')}"
        state, job = slurm.node(node), slurm.job(job_id)
        if state.drained and job is not None and job.state == "RUNNING":
            assert job.nodes == (node,)
            assert job.restarts == 0
            running_while_drained += 1
        final = server.incident(incident_id)
        time.sleep(0.2)

    assert final["state"] == "resolved", final["outcome"]
    assert final["playbook"] == "reset-gpu"
    down = step_result(final, "slurm_down")
    assert down["action"] == "drain"
    assert down["reason"].startswith(f"pitcrew: {incident_id} ")
    assert running_while_drained >= 3, "the job ran on, on the DRAIN node"
    assert events(final, "step_waiting", "drain")[0]["detail"].startswith("waiting for 1 job(s) to finish")
    job = slurm.job(job_id)
    assert job is not None
    assert (job.state, job.restarts, job.nodes) == ("COMPLETED", 0, (node,))
    progress = read_progress(slurm.job_dir, job_id)
    assert progress is not None
    assert (progress["step"], progress["restart_count"]) == (STEPS, 0)  # never interrupted
    assert not [e for e in events(final, "action") if e["data"]["action"] == "slurm_requeue"]
    [record] = step_result(final, "confirm_resumed")["jobs"]
    assert record["status"] == "finished"
    wait_until(lambda: slurm.node(node).in_service, timeout=60, what=f"{node} back in service")


def test_drain_grace_expired_requeues_the_job_elsewhere(slurm: SlurmCluster, pitcrew_factory: Any) -> None:
    server = start_pitcrew(pitcrew_factory, slurm, "drain-grace", playbooks=reset_gpu_with_drain_grace(2))
    job_id, node = training_on_a_node(slurm)
    incident_id = open_incident(server, drain_fault(node))
    final = server.wait_incident(incident_id, *TERMINAL, timeout=60)

    assert final["state"] == "resolved", final["outcome"]
    assert step_result(final, "slurm_down")["action"] == "drain"
    [requeue] = [e for e in events(final, "action") if e["data"]["action"] == "slurm_requeue"]
    assert job_id in requeue["detail"]
    job = slurm.job(job_id)
    assert job is not None
    assert job.state == "RUNNING"
    assert job.restarts == 1
    assert node not in job.nodes
    [record] = step_result(final, "confirm_resumed")["jobs"]
    assert (record["status"], record["old_nodes"], record["new_nodes"]) == (
        "resumed",
        [node],
        list(job.nodes),
    )
    wait_until(
        lambda: (
            (p := read_progress(slurm.job_dir, job_id)) is not None
            and p["restart_count"] == 1
            and p["step"] > p["resumed_from"] > 0
        ),
        timeout=60,
        what="progress past the checkpoint after the requeue",
    )


def test_drain_grace_leaves_a_no_requeue_job_running_and_tells_its_owner(
    slurm: SlurmCluster, pitcrew_factory: Any
) -> None:
    playbooks = reset_gpu_with_drain_grace(2, timeout="90s")
    server = start_pitcrew(pitcrew_factory, slurm, "drain-no-requeue", playbooks=playbooks)
    job_id = slurm.submit_training(requeue=False)
    node = running_on(slurm, job_id).nodes[0]
    incident_id = open_incident(server, drain_fault(node))
    wait_until(
        lambda: notices(server.journal_records(), "job_not_requeueable"), timeout=30, what="the owner told"
    )
    [told] = notices(server.journal_records(), "job_not_requeueable")
    text = told["title"] + " " + " ".join(told["lines"])
    assert told["incident_id"] == incident_id
    assert f"job {job_id} (ckpt-train, owner root)" in told["title"], text
    assert "--no-requeue" in text and f"scancel {job_id}" in text, text

    time.sleep(3)  # past the grace, pitcrew waits: the job trains on, on the drained node
    job = slurm.job(job_id)
    assert job is not None
    assert (job.state, job.nodes, job.restarts) == ("RUNNING", (node,), 0)
    assert server.incident(incident_id)["state"] == "running"
    slurm.run("scancel", job_id)  # its owner ends it, having saved what it needs
    final = server.wait_incident(incident_id, *TERMINAL, timeout=60)

    assert final["state"] == "resolved", final["outcome"]
    assert not [e for e in events(final, "action") if e["data"]["action"] == "slurm_requeue"]
    assert len(notices(server.journal_records(), "job_not_requeueable")) == 1
    assert events(final, "job_not_requeueable", "drain")
