"""confirm_resumed's PromQL progress check: a real Prometheus scraping the training job's step.

pitcrew runs (subprocess, mode auto, backend scontrol) with ``resumption.progress_query`` on
``pitcrew_train_step``, which ``ProgressServer`` serves for every job of the cluster and a real
Prometheus scrapes every second. Cases:

* the job resumes from its checkpoint on another node: ``confirm_resumed`` records the value
  before the fault (read before DOWN) and a value after it that is larger, and passes;
* the job is requeued and runs again but makes no progress (stuck at step 0): the step waits
  for progress past the pre-fault value, times out (10 s budget) and the incident escalates:
  ``failed``, with an ``escalation`` notice in the journal;
* a job that hangs with no fault anywhere (``engine.hung_job_after``): exactly one notice naming
  the job, its node and its last progress, and Slurm is never touched;
* the same hung job at a site that opted into ``requeue-hung-job``, on each backend: the job, and
  only it, is requeued (``scontrol requeue``), its node keeps no reason and never leaves service,
  and the restarted run's progress past the stall confirms it;
* checkpoint before a planned drain (``checkpoint-reset-gpu`` on a pending row remap): the job is
  signalled, saves at once, the node goes DOWN, the job resumes from that checkpoint with 0 steps
  redone; the same playbook without the checkpoint step redoes every step since its last own
  checkpoint (interval 20). Both figures are printed.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from proving_ground.prometheus import Prometheus
from proving_ground.slurm import SlurmCluster
from proving_ground.train_job import CHECKPOINT_METRIC, METRIC, ProgressServer, read_progress
from tests.e2e.slurm_engine import (
    TERMINAL,
    open_incident,
    replace_node,
    running_on,
    start_pitcrew,
    training_on_a_node,
    wait_for_step,
)
from tests.harness.figures import show_figure
from tests.harness.proc import require_binary, wait_until
from tests.harness.scenarios import delivery, events, fault_delivery, notices, step_result

pytestmark = pytest.mark.slow
QUERY = f'max({METRIC}{{job_id="{{job_id}}"}})'

# The requeued run hangs before its first step and says so: step 0, never more.
STALLED_JOB = """#!/bin/bash
if [ "${{SLURM_RESTART_COUNT:-0}}" -gt 0 ]; then
  f="$PITCREW_JOB_DIR/metrics/$SLURM_JOB_ID.prom"
  printf '{metric}{{job_id="%s",node="%s"}} 0\\n' "$SLURM_JOB_ID" "$SLURMD_NODENAME" > "$f.tmp"
  mv "$f.tmp" "$f"
  exec sleep 600
fi
exec {python} {train_job}
"""


@pytest.fixture(scope="module")
def prometheus(slurm_cluster: SlurmCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Prometheus]:
    """A real Prometheus scraping every job's progress each second."""
    binary = require_binary("prometheus", "prometheus")
    exporter = ProgressServer(slurm_cluster.job_dir).start()
    target = exporter.url.split("/")[2]
    config = {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "scrape_configs": [{"job_name": "train", "static_configs": [{"targets": [target]}]}],
    }
    server = Prometheus(binary, tmp_path_factory.mktemp("prometheus-progress"), config)
    try:
        server.start()
        server.wait(
            lambda: [s["value"][1] for s in server.query('up{job="train"}')] == ["1"],
            timeout=60,
            what="the progress exporter scraped",
        )
        yield server
    finally:
        server.stop()
        exporter.stop()


def progress_config(prometheus: Prometheus) -> dict[str, Any]:
    return {
        "resumption": {"progress_query": QUERY, "prometheus_url": prometheus.url, "require_progress": True}
    }


def wait_scraped(prometheus: Prometheus, job_id: str) -> None:
    """Prometheus has a sample of the job's progress (else there is no pre-fault value)."""

    def sampled() -> bool:
        return any(float(s["value"][1]) >= 1 for s in prometheus.query(QUERY.replace("{job_id}", job_id)))

    prometheus.wait(sampled, timeout=60, what=f"a progress sample of job {job_id}")


def test_progress_past_the_pre_fault_value_confirms_the_resume(
    slurm: SlurmCluster,
    pitcrew_factory: Any,
    prometheus: Prometheus,
    capsys: pytest.CaptureFixture[str],
) -> None:
    server = start_pitcrew(pitcrew_factory, slurm, "progress", **progress_config(prometheus))
    job_id, node = training_on_a_node(slurm)
    wait_scraped(prometheus, job_id)
    incident_id = open_incident(server, delivery("xid79-firing.json", node=node))
    final = server.wait_incident(incident_id, *TERMINAL, timeout=90)

    assert final["state"] == "resolved", final["outcome"]
    before = step_result(final, "slurm_down")["progress_before"][job_id]
    [record] = step_result(final, "confirm_resumed")["jobs"]
    assert record["status"] == "resumed", record["detail"]
    assert record["progress_before"] == before >= 1
    # Past the value before the fault, and moving after the restart (not just its last pre-fault sample).
    assert record["progress_now"] > record["progress_before"]
    assert record["progress_now"] > record["progress_at_restart"]
    assert record["new_nodes"] != [node]
    assert record["restarts_now"] == 1
    show_figure(
        capsys,
        f"\n[pitcrew + prometheus] job {job_id} {node} -> {record['new_nodes'][0]}: progress "
        f"{record['progress_before']:g} (at restart {record['progress_at_restart']:g}) -> "
        f"{record['progress_now']:g}; restart after "
        f"{record['seconds_to_restart']:.2f}s, progress past pre-fault confirmed after "
        f"{record['seconds_to_resumed']:.2f}s",
    )


def test_no_progress_after_the_restart_times_out_and_escalates(
    slurm: SlurmCluster, pitcrew_factory: Any, prometheus: Prometheus, tmp_path: Path
) -> None:
    playbooks = replace_node(confirm_resumed={"timeout": "10s"})
    server = start_pitcrew(
        pitcrew_factory, slurm, "no-progress", playbooks=playbooks, **progress_config(prometheus)
    )
    script = tmp_path / "stalled.sh"
    script.write_text(STALLED_JOB.format(metric=METRIC, python=slurm.job_python, train_job=slurm.train_job))
    job_id = slurm.submit(
        "--requeue", "--open-mode=append", "--gres=gpu:h100:8", "--job-name=stalls", script=script
    )
    node = running_on(slurm, job_id).nodes[0]
    wait_for_step(slurm, job_id, 3)
    wait_scraped(prometheus, job_id)
    incident_id = open_incident(server, delivery("xid79-firing.json", node=node))
    final = server.wait_incident(incident_id, *TERMINAL, timeout=90)

    assert final["state"] == "failed"
    assert final["outcome"].startswith(
        "confirm_resumed failed: confirm_resumed did not finish within its budget"
    )
    job = slurm.job(job_id)
    assert job is not None
    assert (job.state, job.restarts) == ("RUNNING", 1)  # it did come back, it just does not train
    assert node not in job.nodes
    before = step_result(final, "slurm_down")["progress_before"][job_id]
    assert before >= 1
    [record] = step_result(final, "confirm_resumed")["last"]
    assert (record["status"], record["progress_before"], record["progress_now"]) == ("waiting", before, 0)
    waits = [e["detail"] for e in events(final, "step_waiting", "confirm_resumed")]
    assert any(w.startswith(f"{job_id}: progress 0 not past pre-fault ") for w in waits), waits
    [escalation] = notices(server.journal_records(), "escalation")
    assert escalation["incident_id"] == incident_id
    assert escalation["severity"] == "critical"
    assert "confirm_resumed failed" in escalation["title"]


# A run that reports a step, then hangs (a collective waiting on a peer for ever): step 7, never more.
HUNG_JOB = """#!/bin/bash
mkdir -p "$PITCREW_JOB_DIR/metrics"
f="$PITCREW_JOB_DIR/metrics/$SLURM_JOB_ID.prom"
printf '{metric}{{job_id="%s",node="%s"}} 7\\n' "$SLURM_JOB_ID" "$SLURMD_NODENAME" > "$f.tmp"
mv "$f.tmp" "$f"
exec sleep 600
"""


def test_a_hung_job_gets_exactly_one_notice_and_no_action(
    slurm: SlurmCluster, pitcrew_factory: Any, prometheus: Prometheus, tmp_path: Path
) -> None:
    server = start_pitcrew(
        pitcrew_factory,
        slurm,
        "hung",
        engine={"hung_job_after": "4s", "poll_interval": "1s"},
        **progress_config(prometheus),
    )
    script = tmp_path / "hung.sh"
    script.write_text(HUNG_JOB.format(metric=METRIC))
    job_id = slurm.submit("--gres=gpu:h100:8", "--job-name=hangs", script=script)
    node = running_on(slurm, job_id).nodes[0]
    wait_scraped(prometheus, job_id)

    def told() -> list[dict[str, Any]]:
        return notices(server.journal_records(), "incident")

    wait_until(lambda: bool(told()), timeout=60, what="the hung-job notice")
    time.sleep(4)  # several more looks at the same stall
    [notice] = told()
    words = " ".join([notice["title"], *notice["lines"]])
    assert job_id in words and "hangs" in words and node in words and "progress stands at 7" in words
    assert "no other alert on its nodes in the last 1h" in words
    incident = server.incident(notice["incident_id"])
    assert (incident["node"], incident["playbook"]) == (node, "notify-only")
    assert not events(incident, "action")
    state, job = slurm.node(node), slurm.job(job_id)
    assert not state.reason and not state.down and not state.drained  # Slurm never touched
    assert job is not None and (job.state, job.restarts) == ("RUNNING", 0)


# Hangs at step 7 on its first run; the requeued run trains (from step 0: the first run saved nothing).
HUNG_THEN_TRAINS = """#!/bin/bash
if [ "${{SLURM_RESTART_COUNT:-0}}" -gt 0 ]; then
  exec {python} {train_job}
fi
mkdir -p "$PITCREW_JOB_DIR/metrics"
f="$PITCREW_JOB_DIR/metrics/$SLURM_JOB_ID.prom"
printf '{metric}{{job_id="%s",node="%s"}} 7\\n' "$SLURM_JOB_ID" "$SLURMD_NODENAME" > "$f.tmp"
mv "$f.tmp" "$f"
exec sleep 600
"""


@pytest.mark.parametrize("backend", ["scontrol", "rest"])
def test_an_opted_in_site_requeues_the_hung_job_and_sees_it_train(
    slurm: SlurmCluster,
    pitcrew_factory: Any,
    prometheus: Prometheus,
    tmp_path: Path,
    backend: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    server = start_pitcrew(
        pitcrew_factory,
        slurm,
        f"hung-requeue-{backend}",
        backend,
        engine={"hung_job_after": "4s", "poll_interval": "1s"},
        catalog={"overrides": {"job-hung": {"playbook": "requeue-hung-job"}}},
        **progress_config(prometheus),
    )
    script = tmp_path / "hung.sh"
    script.write_text(
        HUNG_THEN_TRAINS.format(metric=METRIC, python=slurm.job_python, train_job=slurm.train_job)
    )
    job_id = slurm.submit(
        "--requeue", "--open-mode=append", "--gres=gpu:h100:8", "--job-name=hangs", script=script
    )
    node = running_on(slurm, job_id).nodes[0]
    wait_scraped(prometheus, job_id)

    def told() -> list[dict[str, Any]]:
        return notices(server.journal_records(), "incident")

    wait_until(lambda: bool(told()), timeout=60, what="the hung-job notice")
    [notice] = told()
    incident_id = notice["incident_id"]
    final = server.wait_incident(incident_id, *TERMINAL, timeout=180)
    assert final["state"] == "resolved", final["outcome"]
    assert final["playbook"] == "requeue-hung-job"
    [action] = events(final, "action")
    assert action["data"]["action"] == "slurm_requeue" and action["data"]["job"] == job_id
    [record] = step_result(final, "confirm_requeued")["jobs"]
    assert (record["status"], record["restarts_before"], record["restarts_now"]) == ("resumed", 0, 1)
    assert record["progress_before"] == 7 and record["progress_now"] > 7
    state, job = slurm.node(node), slurm.job(job_id)
    assert not state.reason and not state.down and not state.drained  # the node never left service
    assert job is not None and job.state == "RUNNING" and job.restarts == 1
    assert len(told()) == 1
    show_figure(
        capsys,
        f"\n[hung job requeued, {backend}] job {job_id} {node} -> {record['new_nodes'][0]}: restarted "
        f"{record['seconds_to_restart']:.2f}s after the requeue, progress {record['progress_now']:g} past "
        f"the stall at {record['progress_before']:g} confirmed after {record['seconds_to_resumed']:.2f}s",
    )


CHECKPOINT_QUERY = f'max({CHECKPOINT_METRIC}{{job_id="{{job_id}}"}})'
AFTER_CHECKPOINT = ["slurm_down", "cordon", "drain", "reset_gpu", "wait_ready", "slurm_resume"]


def planned_drain(ask: bool) -> dict[str, Any]:
    """checkpoint-reset-gpu as shipped, or the same without its checkpoint step (the baseline)."""
    steps: list[Any] = ["notify", *(["checkpoint"] if ask else []), *AFTER_CHECKPOINT]
    steps += [{"step": "confirm_resumed", "timeout": "60s"}, "close"]
    return {"checkpoint-reset-gpu": {"slurm_action": "down", "steps": steps}}


@pytest.mark.parametrize("ask", [True, False], ids=["checkpoint-first", "without"])
def test_a_checkpoint_before_the_planned_drain_redoes_nothing(
    slurm: SlurmCluster,
    pitcrew_factory: Any,
    prometheus: Prometheus,
    ask: bool,
    capsys: pytest.CaptureFixture[str],
) -> None:
    settings = progress_config(prometheus)
    settings["resumption"]["checkpoint_query"] = CHECKPOINT_QUERY
    server = start_pitcrew(
        pitcrew_factory,
        slurm,
        f"checkpoint-{ask}",
        playbooks=planned_drain(ask),
        catalog={"overrides": {"row-remap-pending": {"playbook": "checkpoint-reset-gpu"}}},
        **settings,
    )
    job_id = slurm.submit_training(ckpt_every=20)  # its own checkpoint only every 20 steps
    node = running_on(slurm, job_id).nodes[0]
    wait_until(
        lambda: (read_progress(slurm.job_dir, job_id) or {}).get("step", 0) >= 6, timeout=60, what="6 steps"
    )
    wait_scraped(prometheus, job_id)
    fault = fault_delivery("row-remap-pending", alertname="GpuRowRemapPending", node=node)
    incident_id = open_incident(server, fault)

    reached, after = 0, None
    deadline = time.monotonic() + 90
    while after is None:
        assert time.monotonic() < deadline, "the job never trained again after the restart"
        progress = read_progress(slurm.job_dir, job_id) or {}
        if progress.get("restart_count") == 0:
            reached = max(reached, progress["step"])
        elif progress.get("restart_count") == 1 and progress["step"] > progress["resumed_from"]:
            after = progress
        time.sleep(0.1)
    final = server.wait_incident(incident_id, *TERMINAL, timeout=90)
    assert final["state"] == "resolved", final["outcome"]
    assert step_result(final, "slurm_down")["action"] == "down"
    redone = reached - after["resumed_from"]
    if ask:
        saved = step_result(final, "checkpoint")["saved"]
        assert saved == {job_id: after["resumed_from"]}
        assert redone == 0
    else:
        assert after["resumed_from"] == 0 and redone >= 6  # back to its last own checkpoint
    show_figure(
        capsys,
        f"\n[checkpoint before drain: {'asked' if ask else 'not asked'}] job {job_id} reached step {reached},"
        f" resumed from {after['resumed_from']}: {redone} step(s) redone (checkpoint interval 20)",
    )
