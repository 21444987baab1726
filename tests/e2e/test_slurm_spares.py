"""A gang job that fills its partition, XID 79 on one of its nodes, on a real Slurm cluster
(Slurm-only site, ``integrations.cluster: none``) whose spares wait in a reservation.

Four nodes: ``gpu-001``/``gpu-002`` run the job (``-N2``, every node the reservation leaves
to it), ``gpu-003``/``gpu-004`` are held by the Slurm reservation ``spares``. Cases:

- with the pool configured, pitcrew takes ``gpu-003`` out of the reservation once the requeued
  job is pending for lack of nodes; the job runs again on ``gpu-002``+``gpu-003`` from its
  checkpoint while the broken node is still DOWN (the repair not even begun); the take is
  audited and counted; after the humans' repair (slurmd restarted) and ``slurm_resume``, the
  repaired node joins the reservation: it is whole again (two nodes) and the incident resolves;
- ``min_idle: 1`` with one spare left: nothing is taken, the timeline says which guard stopped
  it, and the job stays pending until the repair returns its node — then runs there;
- ``pitcrew plan --live`` reads the reservation (and changes nothing): it names the spare a take
  would choose now, and with ``min_idle: 1`` and one spare left, none and the guard that says so;
  a reservation with ``REPLACE_DOWN`` (Slurm keeps its size itself and refuses any change of its
  nodes) is said to be no pool at the read, before a take could begin.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from bot.cli import main
from proving_ground.slurm import SlurmCluster
from proving_ground.train_job import read_checkpoint
from tests.e2e.slurm_engine import open_incident, running_on, shipped, wait_for_step
from tests.harness.engine_scans import scrape, wait_scans
from tests.harness.proc import wait_until
from tests.harness.scenarios import delivery, events, step_result
from tests.harness.slurm import require_slurm

pytestmark = pytest.mark.slow

NODES = ("gpu-001", "gpu-002", "gpu-003", "gpu-004")


@pytest.fixture(scope="module")
def four_nodes() -> Iterator[SlurmCluster]:
    """Its own cluster: a reservation of two spares beside the job's two nodes."""
    require_slurm()
    run_dir = Path(tempfile.mkdtemp(prefix="pitcrew-spares-"))
    cluster = SlurmCluster(run_dir, nodes=NODES, rest=False).start()
    try:
        yield cluster
    finally:
        cluster.stop()
        shutil.rmtree(run_dir, ignore_errors=True)


@pytest.fixture
def spares(four_nodes: SlurmCluster) -> Iterator[SlurmCluster]:
    four_nodes.reset()
    four_nodes.run(
        "scontrol",
        "create",
        "reservation",
        "ReservationName=spares",
        "Nodes=gpu-003,gpu-004",
        "StartTime=now",
        "Duration=infinite",
        "Users=root",
        "Flags=MAINT,IGNORE_JOBS",
    )
    yield four_nodes
    four_nodes.run("scontrol", "delete", "ReservationName=spares", check=False)


def reserved(slurm: SlurmCluster) -> set[str]:
    line = slurm.run("scontrol", "show", "reservation", "-o", "spares").stdout
    fields = dict(part.split("=", 1) for part in line.split() if "=" in part)
    out = slurm.run("scontrol", "show", "hostnames", fields["Nodes"]).stdout
    return set(out.split())


def start(factory: Any, slurm: SlurmCluster, name: str, pool: dict[str, Any], **config: Any) -> Any:
    settings = slurm.pitcrew_settings("scontrol", command_timeout=5)
    settings["integrations"] = {"scheduler": "slurm", "cluster": "none"}
    return factory(
        name,
        config={
            "mode": "auto",
            "guards": {"breaker": {"max_nodes": 10, "max_fraction": 1.0}},
            "engine": {"poll_interval": "1s"},
            "capacity": {"pools": [pool]},
            **settings,
            **config,
        },
        simulated=False,
    ).start()


def gang_job(slurm: SlurmCluster) -> tuple[str, str]:
    job_id = slurm.submit_training(extra=("-N2",))
    job = running_on(slurm, job_id)
    assert set(job.nodes) == {"gpu-001", "gpu-002"}, job  # the reservation holds the rest
    wait_for_step(slurm, job_id, 3)
    return job_id, "gpu-001"


def test_a_spare_leaves_the_reservation_the_job_runs_there_and_the_repair_refills_it(
    spares: SlurmCluster, pitcrew_factory: Any
) -> None:
    slurm = spares
    server = start(
        pitcrew_factory, slurm, "spares", {"name": "spares", "kind": "spare", "reservation": "spares"}
    )
    job_id, node = gang_job(slurm)
    before = read_checkpoint(slurm.job_dir, job_id)
    incident_id = open_incident(server, delivery("xid79-firing.json", node=node))

    server.wait_event(incident_id, "job_running", timeout=90)
    job = slurm.job(job_id)
    assert job is not None and job.running and set(job.nodes) == {"gpu-002", "gpu-003"}, (
        job,
        _debug(server, incident_id),
        slurm.run("squeue", "-h", "-o", "%i %T %r %N").stdout,
    )
    assert job.restarts == 1
    assert reserved(slurm) == {"gpu-004"}
    assert slurm.node(node).down  # the job runs again before any repair began
    incident = server.incident(incident_id)
    took = step_result(incident, "capacity")
    assert took["node"] == "gpu-003" and took["pool"] == "spares" and took["taken_at"]
    [take] = [e for e in events(incident, "action") if e["data"]["action"] == "capacity_take"]
    assert "gpu-003" in take["detail"]
    wait_until(
        lambda: read_checkpoint(slurm.job_dir, job_id) > before,
        timeout=30,
        what="training past its checkpoint on the spare",
    )
    assert b'pitcrew_capacity_lent_nodes{pool="spares"} 1.0' in scrape(server)()

    slurm.restart_slurmd(node)  # the humans' repair
    final = server.wait_incident(incident_id, "resolved", timeout=90)
    assert step_result(final, "give_back")["node"] == node
    assert reserved(slurm) == {"gpu-004", node}  # whole again: two spares
    actions = [e["data"]["action"] for e in events(final, "action")]
    assert actions == ["slurm_down", "capacity_take", "capacity_give_back", "slurm_resume"]
    metrics = scrape(server)()
    assert b'pitcrew_capacity_lent_nodes{pool="spares"} 0.0' in metrics
    assert b'pitcrew_capacity_away_seconds_count{pool="spares"} 1.0' in metrics
    job = slurm.job(job_id)
    assert job is not None and job.running and set(job.nodes) == {"gpu-002", "gpu-003"}


def test_min_idle_keeps_the_last_spare_and_the_incident_says_why(
    spares: SlurmCluster, pitcrew_factory: Any
) -> None:
    slurm = spares
    slurm.run("scontrol", "update", "ReservationName=spares", "Nodes=gpu-003")  # one spare left
    slurm.run("scontrol", "update", "NodeName=gpu-004", "State=DOWN", "Reason=elsewhere")
    pool = {"name": "spares", "kind": "spare", "reservation": "spares", "min_idle": 1}
    # The requeued job cannot start elsewhere (no spare may go): after the repair slurm_resume
    # holds the node out for requeue_wait_seconds before it returns it, 3 s here (60 s as shipped).
    hold = {"options": {"requeue_wait_seconds": 3}}
    server = start(
        pitcrew_factory, slurm, "min-idle", pool, playbooks=shipped("replace-node", slurm_resume=hold)
    )
    job_id, node = gang_job(slurm)
    incident_id = open_incident(server, delivery("xid79-firing.json", node=node))

    said = server.wait_event(incident_id, "capacity_none", timeout=60)
    assert "min_idle" in said["detail"] and "spares" in said["detail"], said
    wait_scans(scrape(server), 3)  # several polls: still nothing taken
    job = slurm.job(job_id)
    assert job is not None and job.pending, job
    assert reserved(slurm) == {"gpu-003"}
    assert step_result(server.incident(incident_id), "capacity").get("node") is None

    slurm.restart_slurmd(node)  # the repair returns the job's node
    final = server.wait_incident(incident_id, "resolved", timeout=90)
    assert "min_idle" in step_result(final, "capacity")["waiting"]
    held = [e["detail"] for e in events(final, "requeue_wait_expired")]
    assert held == ["requeued job(s) still pending after 3s: resuming"], held  # nowhere else to run
    actions = [e["data"]["action"] for e in events(final, "action")]
    assert actions == ["slurm_down", "slurm_resume"]
    assert reserved(slurm) == {"gpu-003"}
    job = slurm.job(job_id)
    assert job is not None and job.running and node in job.nodes
    slurm.run("scontrol", "update", "NodeName=gpu-004", "State=RESUME")


def test_plan_live_names_the_spare_a_take_would_choose_or_the_guard_that_stops_it(
    spares: SlurmCluster, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    slurm = spares
    payload = tmp_path / "xid79.json"
    payload.write_bytes(delivery("xid79-firing.json", node="gpu-001"))

    def plan(pool: dict[str, Any]) -> dict[str, Any]:
        settings = slurm.pitcrew_settings("scontrol", command_timeout=5)
        settings["integrations"] = {"scheduler": "slurm", "cluster": "none"}
        config = tmp_path / "pitcrew.yaml"
        body = {"mode": "auto", "store": {"path": str(tmp_path / "none.db")}, "capacity": {"pools": [pool]}}
        config.write_text(yaml.safe_dump({**body, **settings}))
        assert main(["plan", str(payload), "--live", "--json", "-c", str(config)]) == 0
        found: dict[str, Any]
        [found] = json.loads(capsys.readouterr().out)
        assert main(["plan", str(payload), "--live", "-c", str(config)]) == 0
        said = [ln.strip() for ln in capsys.readouterr().out.splitlines() if "spare  now:" in ln]
        assert said == [f"spare  {found['capacity'][-1]}"]
        return found

    found = plan({"name": "spares", "kind": "spare", "reservation": "spares"})
    choice = found["capacity_choice"]
    assert (choice["node"], choice["pool"]) == ("gpu-003", "spares"), found
    assert found["capacity"][-1] == "now: would take gpu-003 from spare pool spares"
    assert reserved(slurm) == {"gpu-003", "gpu-004"}  # read only

    slurm.run("scontrol", "update", "ReservationName=spares", "Nodes=gpu-003")  # one spare left
    found = plan({"name": "spares", "kind": "spare", "reservation": "spares", "min_idle": 1})
    choice = found["capacity_choice"]
    assert choice["node"] is None and choice["guards"] == ["min_idle"], found
    assert found["capacity"][-1] == (
        "now: would take none — no node to take: spares: min_idle — 1 idle, keeps at least 1"
    )
    assert reserved(slurm) == {"gpu-003"}

    # A reservation Slurm keeps at its size itself refuses any change of its nodes (23.11-24.11's
    # update_resv, and 22.05's here): said at the read, before a take could begin.
    slurm.run("scontrol", "delete", "ReservationName=spares")
    slurm.run(
        "scontrol",
        "create",
        "reservation",
        "ReservationName=spares",
        "NodeCnt=2",
        "StartTime=now",
        "Duration=infinite",
        "Users=root",
        "Flags=REPLACE_DOWN",
    )  # fmt: skip (REPLACE takes a count, never a node list)
    held = reserved(slurm)
    refused = slurm.run("scontrol", "update", "ReservationName=spares", f"Nodes={min(held)}", check=False)
    assert refused.returncode != 0, refused
    found = plan({"name": "spares", "kind": "spare", "reservation": "spares"})
    assert found["capacity_choice"] is None, found
    assert found["capacity"][-1].startswith(
        "now: the pools could not be read (reservation spares has flag REPLACE_DOWN: Slurm keeps its size"
    ), found
    assert reserved(slurm) == held


def _debug(server: Any, incident_id: str) -> str:
    incident = server.incident(incident_id)
    return "\n".join(
        f"{e.get('at')} {e['kind']} {e.get('step')} {e.get('detail')}" for e in incident["events"]
    )
