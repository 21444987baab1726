"""Shared steps of the engine-on-real-Slurm tests (``test_slurm_remediation``, ``test_slurm_engine_*``).

pitcrew runs as a subprocess in mode auto against the session's real cluster; Kubernetes and
the notifier are simulated (``tests.simulator``). These helpers start it, open incidents from
deliveries and wait for jobs; the assertions stay in the tests.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from bot.config import load_playbooks
from bot.domain.jobs import JobSnapshot
from proving_ground import pitcrew as runner
from proving_ground.slurm import SlurmCluster
from proving_ground.train_job import read_checkpoint
from tests.harness.pitcrew import Pitcrew
from tests.harness.proc import wait_until
from tests.harness.scenarios import events, fault_delivery

TERMINAL = ("resolved", "failed", "suppressed", "rolled_back")


def start_pitcrew(
    factory: Any,
    slurm: SlurmCluster,
    name: str,
    backend: str = "scontrol",
    *,
    slurm_options: dict[str, Any] | None = None,
    world: dict[str, Any] | None = None,
    **config: Any,
) -> Pitcrew:
    """pitcrew in auto mode on the cluster; the breaker relaxed (three nodes are the whole fleet).
    ``world``: the simulated Kubernetes side's knobs (``latency``, ``replace_seconds``)."""
    settings = {
        "mode": "auto",
        "guards": {"breaker": {"max_nodes": 10, "max_fraction": 1.0}},
        **slurm.pitcrew_settings(backend, **({"command_timeout": 5} | (slurm_options or {}))),
        **config,
    }
    server: Pitcrew = factory(name, config=settings, world=world, slurm=slurm)
    return server.start()


def replace_node(**budgets: dict[str, Any]) -> dict[str, Any]:
    """The shipped replace-node playbook with some steps' budgets or options overridden."""
    steps = ["notify", "slurm_down", "cordon", "drain", "replace", "wait_ready", "slurm_resume"]
    steps += ["confirm_resumed", "close"]
    return {"replace-node": {"steps": [{"step": s, **budgets.get(s, {})} for s in steps]}}


def shipped(playbook: str, **changes: dict[str, Any]) -> dict[str, Any]:
    """The shipped ``playbook`` (``bot/data/playbooks.yaml``), every step and budget as shipped, with
    some steps' budgets or options replaced (``slurm_resume={"options": {...}}``)."""
    steps = load_playbooks().playbooks[playbook].steps
    return {
        playbook: {
            "steps": [spec.model_dump(exclude_defaults=True) | changes.get(spec.step, {}) for spec in steps]
        }
    }


def open_incident(server: runner.Pitcrew, body: bytes) -> str:
    status, answer = server.post_alerts(body)
    assert status == 200, answer
    [incident_id] = answer["opened"]
    return str(incident_id)


def running_on(slurm: SlurmCluster, job_id: str, timeout: float = 60) -> JobSnapshot:
    """Wait until the job is RUNNING; return its snapshot."""
    found: list[JobSnapshot] = []

    def running() -> bool:
        job = slurm.job(job_id)
        if job is not None and job.state == "RUNNING" and job.nodes:
            found.append(job)
            return True
        return False

    wait_until(running, timeout=timeout, interval=0.1, what=f"job {job_id} RUNNING")
    return found[-1]


def training_on_a_node(slurm: SlurmCluster, steps: int = 600, min_step: int = 3) -> tuple[str, str]:
    """Submit the checkpointing job and wait until it has made ``min_step`` steps; (job id, node)."""
    job_id = slurm.submit_training(steps=steps)
    job = running_on(slurm, job_id)
    wait_for_step(slurm, job_id, min_step)
    return job_id, job.nodes[0]


def busy_but(slurm: SlurmCluster, node: str) -> None:
    """Every node of the cluster but ``node`` taken by a long job using all its GPUs: a job taken
    off ``node`` has nowhere else to run."""
    blockers = [
        slurm.submit(f"--nodelist={other}", "--gres=gpu:h100:8", "--job-name=blocker", "--wrap=sleep 600")
        for other in slurm.nodes
        if other != node
    ]
    for blocker in blockers:
        running_on(slurm, blocker)


def wait_for_step(slurm: SlurmCluster, job_id: str, step: int) -> None:
    wait_until(
        lambda: read_checkpoint(slurm.job_dir, job_id) >= step,
        timeout=60,
        interval=0.1,
        what=f"job {job_id} to checkpoint step {step}",
    )


def epoch(stamp: str) -> float:
    return datetime.fromisoformat(stamp).timestamp()


def action_at(incident: dict[str, Any], action: str) -> float:
    """When pitcrew made its one ``action`` (e.g. ``slurm_down``) of the incident, as a Unix time."""
    [event] = [e for e in events(incident, "action") if e["data"].get("action") == action]
    return epoch(event["at"])


def drain_fault(node: str) -> bytes:
    """A pending row remap: not job-fatal, so reset-gpu DRAINs the node and lets the job finish."""
    return fault_delivery("row-remap-pending", alertname="GpuRowRemapPending", node=node)


def reset_gpu_with_drain_grace(seconds: int, timeout: str = "12s") -> dict[str, Any]:
    return {
        "reset-gpu": {
            "steps": [
                "notify",
                "slurm_down",
                "cordon",
                {"step": "drain", "timeout": timeout, "options": {"slurm_drain_grace_seconds": seconds}},
                "reset_gpu",
                "wait_ready",
                "slurm_resume",
                "confirm_resumed",
                "close",
            ]
        }
    }
