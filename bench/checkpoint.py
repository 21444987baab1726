"""Progress redone and time to running again after a degrading fault, with the checkpoint step and without.

A real Slurm cluster (``proving_ground.slurm``), the training job (``proving_ground.train_job``)
checkpointing on its own every ``--interval`` steps and at once on SIGUSR1, its progress served by
``ProgressServer`` and scraped each second by a real Prometheus, pitcrew (``pitcrew serve``, auto
mode, ``scontrol``) in front of the simulated Kubernetes side. The fault is the same in both cases:
NVLink error counters rising under the running job (``nvlink-errors``, a fault that degrades but
does not kill), sent to pitcrew's webhook once the job has made ``--fault-at`` steps past its
last own checkpoint; ``catalog.overrides`` sends it to:

- ``checkpoint first``: ``checkpoint-reset-gpu`` as shipped: the job is signalled
  (``scancel --signal=USR1 --batch``), pitcrew waits for its checkpoint metric to move, then DOWN;
- ``without``: the same playbook without its ``checkpoint`` step (the baseline): DOWN at once,
  the job restarts from its last own checkpoint.

Printed per case (min/median/max over runs): training steps done before the fault and done
again after the restart (the job's own progress file: the last step of the first run minus the
step the restarted run resumed from), seconds from the alert to the job RUNNING again
(``scontrol show job``, polled every 0.1 s) and to its first new step, and the incident's own
``job_running`` figure. The baseline is the ``without`` case of the same run; the job makes
about one step a second, so a step redone is about a second of training lost, on every GPU.

Usage: python bench/checkpoint.py [--runs 3] [--interval 20] [--fault-at 6] [--slurm 24.11]   (as root)
       python bench/mttr.py --checkpoint [--skip-demo] ...                     (the same, beside the demo's figures)
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from contextlib import ExitStack
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # run as a script from anywhere

from proving_ground.pitcrew import Pitcrew  # noqa: E402
from proving_ground.prometheus import Prometheus  # noqa: E402
from proving_ground.slurm import SlurmCluster  # noqa: E402
from proving_ground.slurm_root import VERSIONS, chosen_version  # noqa: E402
from proving_ground.train_job import CHECKPOINT_METRIC, METRIC, ProgressServer, read_progress  # noqa: E402
from tests.harness.scenarios import fault_delivery  # noqa: E402

FAULT, ALERTNAME = "nvlink-errors", "GpuNvlinkErrors"
PROGRESS = f'max({METRIC}{{job_id="{{job_id}}"}})'
CHECKPOINTED = f'max({CHECKPOINT_METRIC}{{job_id="{{job_id}}"}})'
#: The far side pitcrew acts on for Kubernetes (cordon, drain, reset, wait Ready): the tests' simulator.
SIMULATOR = "tests.simulator.serve"
AFTER_CHECKPOINT = ["slurm_down", "cordon", "drain", "reset_gpu", "wait_ready", "slurm_resume"]
CASES = {"checkpoint first": True, "without": False}
#: The job's own checkpoint interval and the step the fault comes at, as the e2e test has them.
INTERVAL, FAULT_AT = 20, 6


def playbook(ask: bool) -> dict[str, Any]:
    """checkpoint-reset-gpu as shipped, or the same without its checkpoint step."""
    steps: list[Any] = ["notify", *(["checkpoint"] if ask else []), *AFTER_CHECKPOINT]
    steps += [{"step": "confirm_resumed", "timeout": "90s"}, "close"]
    return {"checkpoint-reset-gpu": {"slurm_action": "down", "steps": steps}}


def one_run(
    slurm: SlurmCluster, prometheus: Prometheus, workdir: Path, case: str, interval: int, fault_at: int
) -> dict[str, float | bool]:
    slurm.reset()
    config: dict[str, Any] = {
        "mode": "auto",
        "guards": {"breaker": {"max_nodes": 10, "max_fraction": 1.0}},
        **slurm.pitcrew_settings("scontrol", command_timeout=5),
        "resumption": {
            "progress_query": PROGRESS,
            "checkpoint_query": CHECKPOINTED,
            "prometheus_url": prometheus.url,
            "require_progress": True,
        },
        "playbooks": playbook(CASES[case]),
        "catalog": {"overrides": {FAULT: {"playbook": "checkpoint-reset-gpu"}}},
    }
    run = workdir / f"{case.replace(' ', '-')}-{time.monotonic_ns()}"
    server = Pitcrew(run, config=config, simulator=SIMULATOR).start()
    try:
        job_id = slurm.submit_training(ckpt_every=interval)
        _until(lambda: (j := slurm.job(job_id)) is not None and j.running and bool(j.nodes), 30)
        job = slurm.job(job_id)
        assert job is not None
        _until(lambda: _step(slurm, job_id) >= fault_at, 60)
        _until(lambda: _sampled(prometheus, job_id), 15)  # pitcrew reads a value before the fault
        status, answer = server.post_alerts(fault_delivery(FAULT, alertname=ALERTNAME, node=job.nodes[0]))
        assert status == 200, answer
        alerted = time.monotonic()
        [incident_id] = answer["opened"]
        reached, running, training = 0, None, None
        while training is None:
            progress = read_progress(slurm.job_dir, job_id) or {}
            if progress.get("restart_count") == 0:
                reached = max(reached, int(progress["step"]))
            elif progress.get("restart_count") == 1 and progress["step"] > progress["resumed_from"]:
                training = time.monotonic() - alerted
                resumed_from = int(progress["resumed_from"])
            now = slurm.job(job_id)
            if running is None and now is not None and now.state == "RUNNING" and now.restarts >= 1:
                running = time.monotonic() - alerted
            if time.monotonic() - alerted > 120:
                raise SystemExit(f"{case}: the job did not train again (see {run})")
            time.sleep(0.1)
        final = server.wait_incident(incident_id, "resolved", "failed", timeout=120)
        event = next((e for e in final["events"] if e["kind"] == "job_running"), None)
        return {
            "redone": float(reached - resumed_from),
            "reached": float(reached),
            "running": running if running is not None else training,
            "training": training,
            "pitcrew": float(event["data"]["seconds"]) if event else float("nan"),
            "resolved": final["state"] == "resolved",
        }
    finally:
        server.stop()


def _step(slurm: SlurmCluster, job_id: str) -> int:
    return int((read_progress(slurm.job_dir, job_id) or {}).get("step", 0))


def _sampled(prometheus: Prometheus, job_id: str) -> bool:
    return any(float(s["value"][1]) >= 1 for s in prometheus.query(PROGRESS.replace("{job_id}", job_id)))


def _until(predicate: Callable[[], bool], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise SystemExit("timed out")
        time.sleep(0.1)


def measure(
    count: int, interval: int = INTERVAL, fault_at: int = FAULT_AT, slurm_version: str | None = None
) -> dict[str, list[dict[str, float | bool]]]:
    """Each case ``count`` times, interleaved, on one three-node cluster and one Prometheus."""
    binary = shutil.which("prometheus")
    if binary is None:
        raise SystemExit("prometheus is not installed (scripts/setup installs it)")
    run_dir = Path(tempfile.mkdtemp(prefix="pitcrew-bench-checkpoint-"))
    work = Path(tempfile.mkdtemp(prefix="pitcrew-bench-checkpoint-pitcrew-"))
    results: dict[str, list[dict[str, float | bool]]] = {case: [] for case in CASES}
    with ExitStack() as running:  # whatever started is stopped, whatever failed to start
        running.callback(shutil.rmtree, work, ignore_errors=True)
        running.callback(shutil.rmtree, run_dir, ignore_errors=True)
        slurm = SlurmCluster(run_dir, rest=False, version=slurm_version)
        running.callback(slurm.stop)
        slurm.start()
        exporter = ProgressServer(slurm.job_dir).start()
        running.callback(exporter.stop)
        prometheus = Prometheus(
            binary,
            _made(work / "prometheus"),
            {
                "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
                "scrape_configs": [
                    {"job_name": "train", "static_configs": [{"targets": [exporter.url.split("/")[2]]}]}
                ],
            },
        )
        running.callback(prometheus.stop)
        prometheus.start()
        for _ in range(count):
            for case in CASES:
                results[case].append(one_run(slurm, prometheus, work, case, interval, fault_at))
                print(f"  {case}: {_line(results[case][-1])}", flush=True)
    return results


def _made(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    return path


def _line(run: dict[str, float | bool]) -> str:
    return (
        f"reached step {run['reached']:g}, {run['redone']:g} redone, RUNNING again after {run['running']:.1f}s, "
        f"training after {run['training']:.1f}s (pitcrew's job_running {run['pitcrew']:.1f}s)"
    )


def report(
    results: dict[str, list[dict[str, float | bool]]],
    count: int,
    interval: int,
    fault_at: int,
    slurm_version: str | None = None,
) -> str:
    """The two cases side by side; the baseline is the ``without`` case of the same run."""
    lines = [
        f"degrading fault ({FAULT}) under a training job {fault_at} steps past its checkpoint "
        f"(interval {interval}), Slurm {chosen_version(slurm_version)}, {count} run(s); min/median/max",
        f"  {'case':<17} {'steps redone':>14} {'-> RUNNING (s)':>16} {'-> training (s)':>16} "
        f"{'pitcrew job_running (s)':>24}  resolved",
    ]
    for case, runs in results.items():

        def spread(key: str, runs: list[dict[str, float | bool]] = runs) -> str:
            values = [float(r[key]) for r in runs]
            return f"{min(values):g}/{statistics.median(values):g}/{max(values):g}"

        def seconds(key: str, runs: list[dict[str, float | bool]] = runs) -> str:
            values = [float(r[key]) for r in runs]
            return f"{min(values):.1f}/{statistics.median(values):.1f}/{max(values):.1f}"

        lines.append(
            f"  {case:<17} {spread('redone'):>14} {seconds('running'):>16} {seconds('training'):>16} "
            f"{seconds('pitcrew'):>24}  {all(r['resolved'] for r in runs)!s:>8}"
        )
    asked = {
        k: statistics.median(float(r[k]) for r in results["checkpoint first"]) for k in ("redone", "running")
    }
    base = {k: statistics.median(float(r[k]) for r in results["without"]) for k in ("redone", "running")}
    lines.append(
        f"  baseline (this run): without the step {base['redone']:g} steps redone, RUNNING again after "
        f"{base['running']:.1f}s; with it {asked['redone']:g} redone, {asked['running'] - base['running']:+.1f}s "
        "to RUNNING (the wait for the checkpoint)"
    )
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument(
        "--interval", type=int, default=INTERVAL, help="the job's own checkpoint interval (steps)"
    )
    parser.add_argument(
        "--fault-at", type=int, default=FAULT_AT, help="the fault this many steps into the job"
    )
    parser.add_argument("--slurm", choices=VERSIONS, default=None, help="the Slurm to run on")
    args = parser.parse_args()
    if not 0 < args.fault_at < args.interval:
        parser.error(
            "--fault-at must fall between two of the job's own checkpoints (0 < fault-at < interval)"
        )
    results = measure(args.runs, args.interval, args.fault_at, args.slurm)
    print(report(results, args.runs, args.interval, args.fault_at, args.slurm))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
