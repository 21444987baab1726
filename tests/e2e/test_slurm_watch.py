"""Slurm as a second source: pitcrew (a subprocess, mode auto, ``engine.slurm_watch``) against real Slurm.

Kubernetes and the notifier are simulated (``tests.simulator``); Slurm is real (gpu-001..003,
Kubernetes node name = Slurm node name). Cases, each on both backends:

* a node a health-check script drains (``scontrol update ... state=drain reason="NHC: ..."``) opens an
  incident within a poll of pitcrew's watch (``follow-slurm``): the Kubernetes node is cordoned with
  pitcrew's mark, humans are told Slurm's reason, and Slurm's reason is never touched; a person's
  RESUME closes the incident (resolved) and pitcrew uncordons the node;
* the same with power saving on (``power_saving``): the node a health check set DOWN is powered
  down while out; a person's RESUME leaves it IDLE+POWERED_DOWN+NOT_RESPONDING, in service for Slurm
  (it wakes the node for the next job), so the incident closes and pitcrew uncordons the node.
  Failed before: the incident waited in ``slurm_returned`` for the node to answer;
* a Prometheus alert already open on a node and a Slurm drain of the same node are one incident;
* a node a health check sets DOWN under a training job: Slurm requeues the job at once (PENDING,
  restart count grown, no node list: without slurmdbd nothing Slurm serves says where it ran), so
  the incident follows the job the watch saw there at its last look before, and confirms it
  resumed elsewhere; a person's RESUME closes it. A job that may not be requeued ends NODE_FAIL:
  the incident reports it lost, once, to humans;
* the same DOWN while pitcrew is dead (SIGKILL after the watch saw the job, restarted once Slurm
  took the job off the node): the watch's memory is in the store, so the incident still follows
  the job and confirms it resumed.
"""

from __future__ import annotations

import contextlib
import json
import sqlite3
import time
from typing import Any

import pytest

from bot.engine.slurm_watch import RECEIVER, Seen
from bot.store.codec import decode_record
from proving_ground.slurm import SlurmCluster
from tests.e2e.slurm_engine import (
    TERMINAL,
    open_incident,
    running_on,
    start_pitcrew,
    training_on_a_node,
    wait_for_step,
)
from tests.harness.figures import show_figure
from tests.harness.proc import wait_until
from tests.harness.scenarios import destructive_calls, events, fault_delivery, notices, step_result

pytestmark = pytest.mark.slow
NHC_REASON = "NHC: check_fs_mount: /scratch not mounted"
POLL = 1.0


def _incident_on(server: Any, node: str, interval: float = 0.1) -> str:
    """The id of the incident the watch opens on ``node``, once it has (within 30 s)."""
    found: list[dict[str, Any]] = []

    def opened() -> bool:
        found[:] = server.incidents(node)
        return bool(found)

    wait_until(opened, timeout=30, interval=interval, what=f"an incident on {node}")
    return str(found[0]["id"])


def watching(factory: Any, slurm: SlurmCluster, name: str, backend: str, **config: Any) -> Any:
    return start_pitcrew(
        factory, slurm, name, backend, engine={"slurm_watch": True, "poll_interval": f"{POLL:g}s"}, **config
    )


@pytest.mark.parametrize("backend", ["scontrol", "rest"])
def test_a_health_check_drain_cordons_and_a_human_resume_closes(
    slurm: SlurmCluster, pitcrew_factory: Any, backend: str, capsys: pytest.CaptureFixture[str]
) -> None:
    server = watching(pitcrew_factory, slurm, f"watch-{backend}", backend)
    node = "gpu-002"
    drained_at = time.monotonic()
    slurm.run("scontrol", "update", f"NodeName={node}", "State=DRAIN", f"Reason={NHC_REASON}")
    incident_id = _incident_on(server, node, interval=0.05)
    seen_after = time.monotonic() - drained_at

    # Cordoned with pitcrew's mark; Slurm's reason untouched; humans told Slurm's reason.
    server.wait_event(incident_id, "action", timeout=30)
    wait_until(
        lambda: destructive_calls(server.journal_records())[("cordon", node)] == 1, timeout=30, what="cordon"
    )
    incident = server.incident(incident_id)
    assert incident["playbook"] == "follow-slurm"
    assert step_result(incident, "cordon")["owned"] is True
    assert step_result(incident, "slurm_down")["owned"] == {node: False}
    state = slurm.node(node)
    assert state.drained and state.reason == NHC_REASON, state
    [told] = notices(server.journal_records(), "incident")
    assert any(NHC_REASON in line for line in told["lines"]), told["lines"]
    assert not [c for c in destructive_calls(server.journal_records()) if c[0].startswith("slurm_")]

    # A person returns the node: the incident closes and pitcrew gives the Kubernetes node back.
    slurm.run("scontrol", "update", f"NodeName={node}", "State=RESUME")
    final = server.wait_incident(incident_id, *TERMINAL, timeout=60)
    assert final["state"] == "resolved", final["outcome"]
    assert destructive_calls(server.journal_records())[("uncordon", node)] == 1
    assert step_result(final, "slurm_returned")["uncordoned"] is True
    assert slurm.node(node).in_service
    assert [e["kind"] for e in events(final, "alert_resolved")], "the watch resolved its alert"
    show_figure(
        capsys, f"\n[slurm watch {backend}] drain -> incident visible {seen_after:.2f}s (poll {POLL:g}s)"
    )


@pytest.mark.parametrize("backend", ["scontrol", "rest"])
def test_a_node_resumed_while_powered_down_is_given_back(
    slurm: SlurmCluster, power_saving: str, pitcrew_factory: Any, backend: str
) -> None:
    server = watching(pitcrew_factory, slurm, f"watch-power-{backend}", backend)
    node = power_saving
    slurm.run("scontrol", "update", f"NodeName={node}", "State=DOWN", f"Reason={NHC_REASON}")
    incident_id = _incident_on(server, node, interval=0.05)
    wait_until(
        lambda: destructive_calls(server.journal_records())[("cordon", node)] == 1, timeout=30, what="cordon"
    )
    wait_until(lambda: "POWERED_DOWN" in slurm.node(node).states, timeout=60, what=f"{node} powered down")

    slurm.run("scontrol", "update", f"NodeName={node}", "State=RESUME")
    assert {"IDLE", "POWERED_DOWN", "NOT_RESPONDING"} <= slurm.node(node).states  # Slurm's shape
    final = server.wait_incident(incident_id, *TERMINAL, timeout=60)
    assert final["state"] == "resolved", final["outcome"]
    assert destructive_calls(server.journal_records())[("uncordon", node)] == 1
    assert step_result(final, "slurm_returned")["uncordoned"] is True


def test_a_prometheus_alert_and_a_slurm_drain_of_one_node_are_one_incident(
    slurm: SlurmCluster, pitcrew_factory: Any
) -> None:
    server = watching(pitcrew_factory, slurm, "watch-dedupe", "scontrol")
    node = "gpu-003"
    incident_id = open_incident(server, fault_delivery("thermal", alertname="GpuThermal", node=node))
    slurm.run("scontrol", "update", f"NodeName={node}", "State=DRAIN", f"Reason={NHC_REASON}")

    def attached() -> bool:
        alerts = server.incident(incident_id)["alerts"]
        return any(a["alertname"] == "SlurmNodeOut" for a in alerts)

    wait_until(attached, timeout=30, interval=0.1, what="the Slurm drain attached to the open incident")
    assert [i["id"] for i in server.incidents(node)] == [incident_id]
    assert slurm.node(node).reason == NHC_REASON


def _seen_by_the_watch(server: Any, job_id: str, node: str) -> None:
    """Until the watch's memory in pitcrew's store (``watch_memory``, what a restarted pitcrew
    reads back) names ``job_id`` on ``node``. The watch looks at a busy node's jobs once per poll
    at best: a loaded machine may take several polls' time for its first look."""

    def seen() -> bool:
        try:
            with contextlib.closing(sqlite3.connect(f"file:{server.store}?mode=ro", uri=True)) as db:
                row = db.execute(
                    "SELECT value_json FROM watch_memory WHERE watch = ? AND key = ?", (RECEIVER, node)
                ).fetchone()
        except sqlite3.OperationalError:  # no store or no table yet
            return False
        return row is not None and job_id in [j.job_id for j in decode_record(Seen, json.loads(row[0])).jobs]

    wait_until(seen, timeout=60, interval=0.2, what=f"the watch to see job {job_id} on {node}")


def _set_down_by_slurm(slurm: SlurmCluster, job_id: str, node: str) -> None:
    """A health check sets ``node`` DOWN; Slurm takes ``job_id`` off it (and requeues it)."""
    slurm.run("scontrol", "update", f"NodeName={node}", "State=DOWN", f"Reason={NHC_REASON}")
    wait_until(
        lambda: node not in getattr(slurm.job(job_id), "nodes", (node,)),
        timeout=30,
        interval=0.05,
        what=f"Slurm taking job {job_id} off {node}",
    )


def _followed_until_resumed_and_closed(server: Any, slurm: SlurmCluster, job_id: str, node: str) -> None:
    """The incident on ``node`` names the job seen there, confirms it running elsewhere with its
    restart count grown, leaves Slurm's reason alone, and closes when a human RESUMEs the node."""
    incident_id = _incident_on(server, node)
    server.wait_event(incident_id, "job_running", timeout=90)
    # The step announces training is back, then commits its result: read the incident after.
    server.wait_event(incident_id, "step_finished", "confirm_resumed", timeout=30)
    incident = server.incident(incident_id)
    [recorded] = step_result(incident, "slurm_down")["jobs"]
    assert (recorded["job_id"], recorded["nodes"], recorded["restarts"]) == (job_id, [node], 0)
    [job] = step_result(incident, "confirm_resumed")["jobs"]
    assert (job["job_id"], job["status"], job["old_nodes"]) == (job_id, "resumed", [node]), job
    assert node not in job["new_nodes"] and job["restarts_now"] >= 1
    assert slurm.node(node).reason == NHC_REASON  # Slurm's reason untouched

    slurm.run("scontrol", "update", f"NodeName={node}", "State=RESUME")
    final = server.wait_incident(incident_id, *TERMINAL, timeout=60)
    assert final["state"] == "resolved", final["outcome"]


@pytest.mark.parametrize("backend", ["scontrol", "rest"])
def test_the_jobs_slurm_took_off_a_node_it_set_down_are_followed_until_they_resume(
    slurm: SlurmCluster, pitcrew_factory: Any, backend: str
) -> None:
    server = watching(pitcrew_factory, slurm, f"watch-down-{backend}", backend)
    job_id, node = training_on_a_node(slurm)
    _seen_by_the_watch(server, job_id, node)
    _set_down_by_slurm(slurm, job_id, node)
    _followed_until_resumed_and_closed(server, slurm, job_id, node)


@pytest.mark.parametrize("backend", ["scontrol", "rest"])
def test_a_node_set_down_while_pitcrew_was_killed_still_names_its_jobs(
    slurm: SlurmCluster, pitcrew_factory: Any, backend: str
) -> None:
    lease = {"lease": {"ttl": "2s", "renew_every": "0.5s"}}  # the restart acts once it lapses
    server = watching(pitcrew_factory, slurm, f"watch-killed-{backend}", backend, store=lease)
    job_id, node = training_on_a_node(slurm)
    _seen_by_the_watch(server, job_id, node)
    server.kill()
    _set_down_by_slurm(slurm, job_id, node)
    server.start()
    _followed_until_resumed_and_closed(server, slurm, job_id, node)


def test_a_job_slurm_could_not_requeue_off_a_node_it_set_down_is_reported_lost(
    slurm: SlurmCluster, pitcrew_factory: Any
) -> None:
    server = watching(pitcrew_factory, slurm, "watch-down-lost", "scontrol")
    job_id = slurm.submit_training(requeue=False)
    node = running_on(slurm, job_id).nodes[0]
    wait_for_step(slurm, job_id, 3)
    _seen_by_the_watch(server, job_id, node)
    slurm.run("scontrol", "update", f"NodeName={node}", "State=DOWN", f"Reason={NHC_REASON}")
    incident_id = _incident_on(server, node)
    wait_until(
        lambda: bool(notices(server.journal_records(), "job_lost")), timeout=60, what="the job reported lost"
    )
    [lost] = notices(server.journal_records(), "job_lost")
    assert job_id in lost["title"], lost
    job = slurm.job(job_id)
    assert job is not None and job.state == "NODE_FAIL"
    slurm.run("scontrol", "update", f"NodeName={node}", "State=RESUME")
    final = server.wait_incident(incident_id, *TERMINAL, timeout=60)
    [verdict] = step_result(final, "confirm_resumed")["jobs"]
    assert (verdict["job_id"], verdict["status"], verdict["old_nodes"]) == (job_id, "lost", [node]), verdict
