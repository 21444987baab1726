"""The job track and the node track, concurrently, against a real Slurm cluster.

pitcrew (a subprocess, mode auto) drives the session's real Slurm; the Kubernetes side is
the simulator, whose replaced node stays NotReady for ``replace_seconds`` (a slow
replacement, so the node track takes a long time). Cases:

* a slow node track: the checkpointing job is requeued by Slurm and runs on another node
  within seconds; the ``job_running`` notice, its event and the ``confirm_resumed`` result
  arrive within seconds of that restart, while the node track still waits for the
  replacement; the incident closes only when the node is back, and reports both times;
* no free node: the other nodes are busy, so the requeued job can only run on the repaired
  node; the job track waits for exactly that node, and both tracks end;
* SIGKILL while both tracks run: after a restart both resume where the store says and no
  destructive call reaches Slurm or the cluster twice.
"""

from __future__ import annotations

import time
from typing import Any

import pytest

from proving_ground.slurm import SlurmCluster
from tests.e2e.slurm_engine import (
    busy_but,
    epoch,
    open_incident,
    running_on,
    start_pitcrew,
    training_on_a_node,
)
from tests.harness.proc import wait_until
from tests.harness.scenarios import delivery, destructive_calls, events, notices, step_result

pytestmark = pytest.mark.slow

SLOW_REPLACEMENT = 34.0  # seconds the replaced node stays NotReady (the job is back after ~7, ~10 under load)


def _playbook(requeue_wait: float = 60) -> dict[str, Any]:
    steps: list[Any] = ["notify", "slurm_down", "cordon", "drain", "replace"]
    steps += [{"step": "wait_ready", "timeout": "10m"}]
    steps += [{"step": "slurm_resume", "options": {"requeue_wait_seconds": requeue_wait}}]
    steps += [{"step": "confirm_resumed", "timeout": "10m"}, "close"]
    return {"replace-node": {"steps": steps}}


@pytest.mark.every_slurm  # both tracks at once: on 22.05 and 24.11 in CI
def test_training_is_back_long_before_a_slow_replacement_is(
    slurm: SlurmCluster, pitcrew_factory: Any
) -> None:
    server = start_pitcrew(
        pitcrew_factory,
        slurm,
        "tracks-slow",
        playbooks=_playbook(),
        world={"replace_seconds": SLOW_REPLACEMENT},
    )
    job_id, node = training_on_a_node(slurm)
    incident_id = open_incident(server, delivery("xid79-firing.json", node=node))

    restarted = running_elsewhere(slurm, job_id, node)
    running = server.wait_event(incident_id, "job_running", timeout=30)
    told_after = epoch(running["at"]) - restarted
    assert told_after < 5, f"job_running {told_after:.1f}s after the job restarted"
    server.wait_event(incident_id, "step_finished", "confirm_resumed", timeout=30)  # recorded just after
    incident = server.incident(incident_id)
    assert incident["state"] == "verifying"
    assert [r["status"] for r in incident["step_records"] if r["step"] == "confirm_resumed"] == ["ok"]
    [job] = step_result(incident, "confirm_resumed")["jobs"]
    assert job["job_id"] == job_id and job["status"] == "resumed" and node not in job["new_nodes"]
    [notice] = notices(server.journal_records(), "job_running")
    assert notice["incident_id"] == incident_id and job_id in " ".join(notice["lines"])
    assert not step_result(incident, "slurm_resume")  # the node track is still waiting
    waiting = [e["detail"] for e in events(incident, "step_waiting", "wait_ready")]
    assert waiting and "not Ready" in waiting[-1]

    final = server.wait_incident(incident_id, "resolved", timeout=SLOW_REPLACEMENT + 60)
    closed = step_result(final, "close")
    assert closed["time_to_job_running_seconds"] + SLOW_REPLACEMENT / 2 < closed["time_to_node_back_seconds"]
    assert epoch(final["closed_at"]) - epoch(running["at"]) > SLOW_REPLACEMENT / 2
    print(
        f"\n[tracks] job {job_id}: running again {told_after:.2f}s after its restart, "
        f"job track {closed['time_to_job_running_seconds']:.1f}s, node track {closed['time_to_node_back_seconds']:.1f}s"
    )


def test_with_no_free_node_the_job_waits_for_the_repaired_node(
    slurm: SlurmCluster, pitcrew_factory: Any
) -> None:
    server = start_pitcrew(
        pitcrew_factory,
        slurm,
        "tracks-full",
        playbooks=_playbook(requeue_wait=3),
        world={"replace_seconds": 8},
    )
    job_id, node = training_on_a_node(slurm)
    busy_but(slurm, node)
    incident_id = open_incident(server, delivery("xid79-firing.json", node=node))

    final = server.wait_incident(incident_id, "resolved", "failed", timeout=120)
    assert final["state"] == "resolved", final["outcome"]
    [job] = step_result(final, "confirm_resumed")["jobs"]
    assert job["status"] == "resumed" and job["new_nodes"] == [node], job
    assert job["detail"] == "running again on the repaired node"
    assert step_result(final, "slurm_resume")["resumed"] == [node]
    assert running_on(slurm, job_id).nodes == (node,)


@pytest.mark.every_slurm  # SIGKILL mid-tracks: on 22.05 and 24.11 in CI (the no-free-node case: --slurm all)
def test_sigkill_during_both_tracks_resumes_both_without_repeating(
    slurm: SlurmCluster, pitcrew_factory: Any
) -> None:
    server = start_pitcrew(
        pitcrew_factory,
        slurm,
        "tracks-kill",
        playbooks=_playbook(),
        world={"replace_seconds": 14},  # still waiting for the replacement after the restart
        store={"lease": {"ttl": "2s", "renew_every": "0.5s"}},  # the restart acts once it lapses
    )
    _, node = training_on_a_node(slurm)
    incident_id = open_incident(server, delivery("xid79-firing.json", node=node))
    server.wait_call("replace", node, timeout=30)  # the node track is at wait_ready...
    incident = server.incident(incident_id)
    assert not [r for r in incident["step_records"] if r["step"] == "confirm_resumed" and r["status"] == "ok"]
    server.kill()  # ...and the job track has not confirmed the job yet (it restarts ~6 s after DOWN)

    server.start()
    final = server.wait_incident(incident_id, "resolved", "failed", timeout=120)
    assert final["state"] == "resolved", final["outcome"]
    [job] = step_result(final, "confirm_resumed")["jobs"]
    assert job["status"] == "resumed" and node not in job["new_nodes"]
    assert len(events(final, "job_running")) == 1
    calls = destructive_calls(server.journal_records())
    assert calls[("cordon", node)] == 1 and calls[("replace", node)] == 1
    slurm_actions = [
        e["data"]["action"] for e in events(final, "action") if e["data"]["action"].startswith("slurm")
    ]
    assert slurm_actions == ["slurm_down", "slurm_resume"]


def running_elsewhere(slurm: SlurmCluster, job_id: str, node: str) -> float:
    """Wait until Slurm runs the requeued job on another node; when it was seen so."""
    seen: list[float] = []

    def moved() -> bool:
        job = slurm.job(job_id)
        if job is not None and job.running and job.restarts >= 1 and node not in job.nodes:
            seen.append(time.time())
            return True
        return False

    wait_until(moved, timeout=60, interval=0.1, what=f"job {job_id} running on another node")
    return seen[0]
