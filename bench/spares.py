"""Time to a gang job running again after XID 79, with a spare and without, on real Slurm.

A four-node real Slurm cluster (``proving_ground.slurm``), Slurm-only site (``cluster: none``),
the real ``pitcrew serve`` in auto mode. The job needs two nodes (``-N2``): every node the
reservation ``spares`` leaves to it. XID 79 on one of its nodes; the repair (the node's slurmd
started again, as humans do after the hand-over) comes ``--repair-delay`` seconds after the
alert. Cases, side by side:

- ``spare``: ``capacity.pools`` holds the reservation (two spares): pitcrew takes one;
- ``min_idle``: one spare left and ``min_idle: 1``: the guard keeps it, the job waits for the repair;
- ``no pool``: no ``capacity.pools``: the job waits for the repair.

With ``--kubernetes``, the same job on the same cluster with the Kubernetes API emulator as the
cluster (``integrations.cluster: kubernetes``, cluster-api replacement whose new node is Ready
``--repair-delay`` seconds after the alert) and the NodeSet stand-in (a node is in the jobs'
partition while it carries the NodeSet's label); ``gpu-003`` is the pool's node:

- ``k8s spare``: a spare pool by label selector;
- ``k8s lender``: an inference node (its vLLM replica evicted through the service's budget);
- ``k8s no pool``: no pool: the job waits for the replacement (and pitcrew's resume).

Printed per case (min/median/max over runs): seconds from the alert to the job RUNNING again
(``scontrol show job``, polled every 0.1 s), the incident's own ``job_running`` figure, and
whether the reservation held as many nodes at the end as at the start. The baseline is the
repair delay: without a spare the job cannot run before it.

Usage: python bench/spares.py [--runs 3] [--repair-delay 60] [--kubernetes]   (as root, with Slurm installed)
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # run as a script from anywhere

from proving_ground.kubernetes.nodeset import NodeSetStandin  # noqa: E402
from proving_ground.kubernetes.world import (  # noqa: E402
    KubeWorld,
    inference_replicas,
    pod_ready,
    pool_fleet,
    settings_for,
)
from proving_ground.pitcrew import Pitcrew  # noqa: E402
from proving_ground.slurm import SlurmCluster  # noqa: E402
from tests.harness.scenarios import delivery  # noqa: E402

NODES = ("gpu-001", "gpu-002", "gpu-003", "gpu-004")
POOL = {"name": "spares", "kind": "spare", "reservation": "spares"}
CASES: dict[str, dict[str, Any] | None] = {
    "spare": {"pools": [POOL]},
    "min_idle": {"pools": [{**POOL, "min_idle": 1}]},
    "no pool": None,
}


NODESET = {"slinky.slurm.net/nodeset": "gpu"}
K8S_CASES: dict[str, tuple[dict[str, str], dict[str, Any] | None]] = {
    "k8s spare": (
        {"pitcrew.dev/pool": "spare"},
        {"name": "spares", "kind": "spare", "selector": "pitcrew.dev/pool=spare", "join_labels": NODESET},
    ),
    "k8s lender": (
        {"pitcrew.dev/pool": "inference", "workload": "vllm"},
        {
            "name": "inference",
            "kind": "lender",
            "selector": "pitcrew.dev/pool=inference",
            "leave_labels": ["workload"],
            "join_labels": NODESET,
        },
    ),
    "k8s no pool": ({"pitcrew.dev/pool": "spare"}, None),
}


def reserved(slurm: SlurmCluster) -> list[str]:
    line = slurm.run("scontrol", "show", "reservation", "-o", "spares").stdout
    fields = dict(part.split("=", 1) for part in line.split() if "=" in part)
    return slurm.run("scontrol", "show", "hostnames", fields["Nodes"]).stdout.split()


def one_run(slurm: SlurmCluster, workdir: Path, case: str, repair_delay: float) -> dict[str, float | bool]:
    slurm.reset()
    spares = "gpu-003" if case == "min_idle" else "gpu-003,gpu-004"
    if case == "min_idle":  # one spare left: the other is out of service
        slurm.run("scontrol", "update", "NodeName=gpu-004", "State=DOWN", "Reason=bench")
    slurm.run(
        "scontrol", "create", "reservation", "ReservationName=spares", f"Nodes={spares}",
        "StartTime=now", "Duration=infinite", "Users=root", "Flags=MAINT,IGNORE_JOBS",
    )  # fmt: skip
    size = len(reserved(slurm))
    config: dict[str, Any] = {
        "mode": "auto",
        "guards": {"breaker": {"max_nodes": 10, "max_fraction": 1.0}},
        **slurm.pitcrew_settings("scontrol", command_timeout=5),
        "integrations": {"scheduler": "slurm", "cluster": "none"},
    }
    if CASES[case] is not None:
        config["capacity"] = CASES[case]
    server = Pitcrew(workdir / f"{case}-{time.monotonic_ns()}", config=config).start()
    try:
        job_id = slurm.submit_training(extra=("-N2",))
        _until(lambda: (j := slurm.job(job_id)) is not None and j.running, 30)
        status, answer = server.post_alerts(delivery("xid79-firing.json", node="gpu-001"))
        assert status == 200, answer
        alerted = time.monotonic()
        [incident_id] = answer["opened"]
        repaired = False
        running_after = None
        while running_after is None or not repaired:
            if not repaired and time.monotonic() - alerted >= repair_delay:
                slurm.restart_slurmd("gpu-001")
                repaired = True
            job = slurm.job(job_id)
            if running_after is None and job is not None and job.state == "RUNNING" and job.restarts >= 1:
                running_after = time.monotonic() - alerted
            if time.monotonic() - alerted > repair_delay + 120:
                raise SystemExit(f"{case}: the job did not run again")
            time.sleep(0.1)
        final = server.wait_incident(incident_id, "resolved", "failed", timeout=120)
        event = next(e for e in final["events"] if e["kind"] == "job_running")
        return {
            "running": running_after,
            "pitcrew": float(event["data"]["seconds"]),
            "whole": len(reserved(slurm)) == size,
            "resolved": final["state"] == "resolved",
        }
    finally:
        server.stop()
        slurm.run("scontrol", "delete", "ReservationName=spares", check=False)


def one_k8s_run(
    slurm: SlurmCluster, workdir: Path, case: str, repair_delay: float
) -> dict[str, float | bool]:
    """The gang job with Kubernetes: ``gpu-003`` in the case's pool, the replacement after ``repair_delay``."""
    slurm.reset()
    labels, pool = K8S_CASES[case]
    world = KubeWorld().start()
    server = None
    try:

        def arrange(e: Any) -> None:
            pool_fleet(e, list(slurm.nodes), NODESET, labels, replace_after=repair_delay)
            if pool is not None and pool["kind"] == "lender":
                replicas = inference_replicas(e, "gpu-003", "gpu-002")
                pod_ready(e, "inference", replicas[1])  # the budget allows one replica away

        world.call(arrange)
        run = workdir / f"{case.replace(' ', '-')}-{time.monotonic_ns()}"
        config: dict[str, Any] = {
            "mode": "auto",
            "guards": {"breaker": {"max_nodes": 10, "max_fraction": 1.0}},
            "slurm": slurm.pitcrew_settings("scontrol", command_timeout=5)["slurm"],
            **settings_for(world, run / "kube", replace={"strategy": "cluster-api"}),
            "integrations": {"scheduler": "slurm", "cluster": "kubernetes"},
        }
        if pool is not None:
            config["capacity"] = {"pools": [pool]}
        with NodeSetStandin(world, slurm, NODESET):
            server = Pitcrew(run, config=config).start()
            job_id = slurm.submit_training(extra=("-N2",))
            _until(lambda: (j := slurm.job(job_id)) is not None and j.running, 30)
            status, answer = server.post_alerts(delivery("xid79-firing.json", node="gpu-001"))
            assert status == 200, answer
            alerted = time.monotonic()
            [incident_id] = answer["opened"]
            running_after = None
            while running_after is None:
                job = slurm.job(job_id)
                if job is not None and job.state == "RUNNING" and job.restarts >= 1:
                    running_after = time.monotonic() - alerted
                if time.monotonic() - alerted > repair_delay + 180:
                    raise SystemExit(f"{case}: the job did not run again")
                time.sleep(0.1)
            final = server.wait_incident(incident_id, "resolved", "failed", timeout=repair_delay + 180)

            def members(e: Any) -> int:
                return sum(
                    1
                    for (plural, _, _), o in e.objects.items()
                    if plural == "nodes" and labels.items() <= (o["metadata"].get("labels") or {}).items()
                )

            event = next(e for e in final["events"] if e["kind"] == "job_running")
            return {
                "running": running_after,
                "pitcrew": float(event["data"]["seconds"]),
                "whole": world.call(members) == 1,
                "resolved": final["state"] == "resolved",
            }
    finally:
        if server is not None:
            server.stop()
        world.stop()
        for name in slurm.nodes:
            slurm.run("scontrol", "update", f"NodeName={name}", "State=RESUME", check=False)


def _until(predicate: Any, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise SystemExit("timed out")
        time.sleep(0.1)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--repair-delay", type=float, default=60.0)
    parser.add_argument("--kubernetes", action="store_true", help="also the Kubernetes pools' cases")
    args = parser.parse_args()
    results = measure(args.runs, args.repair_delay, kubernetes=args.kubernetes)
    print(report(results, args.runs, args.repair_delay))
    return 0


def measure(
    count: int, repair_delay: float, *, kubernetes: bool = False
) -> dict[str, list[dict[str, float | bool]]]:
    """Each case ``count`` times, interleaved, on one four-node cluster started for them."""
    run_dir = Path(tempfile.mkdtemp(prefix="pitcrew-bench-spares-"))
    work = Path(tempfile.mkdtemp(prefix="pitcrew-bench-spares-pitcrew-"))
    slurm = SlurmCluster(run_dir, nodes=NODES, rest=False).start()
    cases = [*CASES, *(K8S_CASES if kubernetes else ())]
    results: dict[str, list[dict[str, float | bool]]] = {case: [] for case in cases}
    try:
        for _ in range(count):
            for case in CASES:
                results[case].append(one_run(slurm, work, case, repair_delay))
            for case in K8S_CASES if kubernetes else ():
                results[case].append(one_k8s_run(slurm, work, case, repair_delay))
    finally:
        slurm.stop()
        shutil.rmtree(run_dir, ignore_errors=True)
        shutil.rmtree(work, ignore_errors=True)
    return results


def report(results: dict[str, list[dict[str, float | bool]]], count: int, repair_delay: float) -> str:
    """The cases side by side, with the baseline measured in the same run (``no pool``)."""
    lines = [
        f"gang job (-N2) after XID 79, repair after {repair_delay:g}s, {count} run(s); min/median/max",
        f"  {'case':<12} {'alert -> job RUNNING (s)':>28} {'pitcrew job_running (s)':>28}  pool whole  resolved",
    ]
    for case, runs in results.items():
        running = [float(r["running"]) for r in runs]
        own = [float(r["pitcrew"]) for r in runs]
        lines.append(
            f"  {case:<12} {_spread(running):>28} {_spread(own):>28}  "
            f"{all(r['whole'] for r in runs)!s:>10}  {all(r['resolved'] for r in runs)!s:>8}"
        )
    spare = statistics.median(float(r["running"]) for r in results["spare"])
    base = statistics.median(float(r["running"]) for r in results["no pool"])
    lines.append(
        f"  baseline (this run): no pool, {base:.1f}s — never under the repair delay ({repair_delay:g}s); "
        f"with a spare {spare:.1f}s: {base - spare:.1f}s sooner"
    )
    if "k8s no pool" in results:
        k8s = {c: statistics.median(float(r["running"]) for r in results[c]) for c in K8S_CASES}
        lines.append(
            f"  baseline (this run), Kubernetes: no pool {k8s['k8s no pool']:.1f}s; spare {k8s['k8s spare']:.1f}s, "
            f"lender {k8s['k8s lender']:.1f}s"
        )
    return "\n".join(lines)


def _spread(values: list[float]) -> str:
    return f"{min(values):.1f}/{statistics.median(values):.1f}/{max(values):.1f}"


if __name__ == "__main__":
    raise SystemExit(main())
