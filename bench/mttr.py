"""Time to recovery on the proving ground: ``scripts/demo --scenario xid79``, run as a user runs it.

Each run is a fresh ``python -m proving_ground --scenario xid79 --json-summary`` (real Prometheus,
Alertmanager and Slurm, the dcgm-exporter stand-in, the Kubernetes API emulator behind pitcrew's
real Kubernetes adapter, the Slack stand-in, pitcrew in auto mode); the demo's summary
gives the milestones. Printed over all runs, min/median/max: fault -> job running again, fault ->
job past its checkpoint, fault -> incident closed, each stage (detection, pitcrew's decision,
Slurm, Kubernetes, replacement wait, job restart, close), and pitcrew's own share (from its own
timeline: opening the incident to its first step, plus every gap between one step ending and the
next starting), stated apart from the time spent waiting on the far sides.

The baseline is the floor the same run's settings impose on the far sides: detection <= scrape +
evaluation + group_wait, Slurm's requeue ~= cred_expire (5 s) + sched_interval (1 s), and the
replacement delay the run asks for. Target: pitcrew's own share under 1 s.

``--spares`` adds, in the same run, a gang job that needs every node of its partition (a
four-node real Slurm cluster, spares in a Slurm reservation; ``bench/spares.py``'s cases):
with a spare, with ``min_idle`` keeping the last spare, and with no pool (the baseline: the
job waits for the repair, ``--repair-delay`` seconds after the alert), side by side; with
``--kubernetes`` also the Kubernetes pools on the emulator (a spare by selector, a lender, none).

``--checkpoint`` adds, in the same run, a fault that degrades but does not kill (NVLink errors
rising) under a training job that checkpoints every 20 steps, hit 6 steps past its checkpoint:
with the ``checkpoint`` step (the job saves on Slurm's signal before the node goes out) and
without it (the baseline), side by side: training steps redone and seconds to the job running
again (``bench/checkpoint.py``'s cases).

``--slurm 22.05,24.11`` runs the same on each Slurm (24.11 from the root ``scripts/setup`` makes)
and prints, beside the tables, how far apart their medians are — above all Slurm's own stage,
DOWN -> the job running elsewhere, which is the version's requeue.

Usage: python bench/mttr.py [--runs 5] [--replace-delay 5] [--slurm 22.05,24.11]
                            [--spares [--repair-delay 60] [--kubernetes]] [--checkpoint] [--skip-demo]
       (as root)
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # run as a script from anywhere

from proving_ground.ground import TIMING  # noqa: E402
from proving_ground.slurm_root import DEFAULT_VERSION, VERSIONS  # noqa: E402
from proving_ground.story import STAGES  # noqa: E402

TARGET_OWN = 1.0


def one_run(workdir: Path, index: int, replace_delay: float, slurm: str) -> dict[str, Any]:
    summary = workdir / f"run-{slurm}-{index}.json"
    out = workdir / f"run-{slurm}-{index}.out"
    argv = [sys.executable, "-m", "proving_ground", "--scenario", "xid79", "--plain", "--slurm", slurm]
    argv += ["--json-summary", str(summary), "--replace-delay", str(replace_delay)]
    began = time.monotonic()
    with out.open("wb") as handle:
        status = subprocess.run(
            argv, stdout=handle, stderr=subprocess.STDOUT, cwd=REPO, env=dict(os.environ), check=False
        )
    if status.returncode != 0 or not summary.exists():
        raise SystemExit(f"run {index} failed ({status.returncode}); its output:\n{out.read_text()[-3000:]}")
    data: dict[str, Any] = json.loads(summary.read_text())
    data["wall"] = time.monotonic() - began
    return data


def row(name: str, values: list[float], note: str = "") -> str:
    if not values:
        return f"  {name:<34} {'-':>8}"
    lo, mid, hi = min(values), statistics.median(values), max(values)
    return f"  {name:<34} {lo:8.3f} {mid:8.3f} {hi:8.3f}  {note}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--replace-delay", type=float, default=5.0)
    parser.add_argument(
        "--slurm", default=DEFAULT_VERSION, help=f"versions, comma-separated: {', '.join(VERSIONS)}"
    )
    parser.add_argument(
        "--spares",
        action="store_true",
        help="also: a gang job with a spare, min_idle and no pool, side by side",
    )
    parser.add_argument(
        "--repair-delay", type=float, default=60.0, help="--spares: the repair after the alert"
    )
    parser.add_argument(
        "--skip-demo",
        action="store_true",
        help="with --spares or --checkpoint: leave out the xid79 demo runs",
    )
    parser.add_argument(
        "--checkpoint",
        action="store_true",
        help="also: a degrading fault under a running job, with the checkpoint step and without, side by side",
    )
    parser.add_argument(
        "--kubernetes", action="store_true", help="--spares: also Kubernetes pools (spare, lender, none)"
    )
    args = parser.parse_args()
    versions = [v.strip() for v in args.slurm.split(",") if v.strip()]
    if unknown := [v for v in versions if v not in VERSIONS]:
        parser.error(f"unknown Slurm {', '.join(unknown)}: choose from {', '.join(VERSIONS)}")
    workdir = Path(tempfile.mkdtemp(prefix="pitcrew-mttr-"))
    if not ((args.spares or args.checkpoint) and args.skip_demo):
        by_version = {v: report(workdir, v, args.runs, args.replace_delay) for v in versions}
        if len(by_version) > 1:
            compare(by_version)
    if args.spares:
        from bench import spares

        results = spares.measure(args.runs, args.repair_delay, kubernetes=args.kubernetes)
        print(spares.report(results, args.runs, args.repair_delay))
    if args.checkpoint:
        from bench import checkpoint

        for version in versions:
            saved = checkpoint.measure(args.runs, slurm_version=version)
            print(checkpoint.report(saved, args.runs, checkpoint.INTERVAL, checkpoint.FAULT_AT, version))
    print(f"summaries and outputs: {workdir}")
    return 0


def _median(runs: list[dict[str, Any]], pick: Callable[[dict[str, Any]], Any]) -> float | None:
    found = [float(v) for r in runs if (v := pick(r)) is not None]
    return statistics.median(found) if found else None


def compare(by_version: dict[str, list[dict[str, Any]]]) -> None:
    """Median differences against the first version, per milestone and per stage."""
    (first, base), *others = by_version.items()
    picks: list[tuple[str, Callable[[dict[str, Any]], Any]]] = [
        ("fault -> job RUNNING elsewhere", lambda r: r.get("fault_to_job_running")),
        ("fault -> job past its checkpoint", lambda r: r.get("fault_to_job_progress")),
        ("fault -> incident closed", lambda r: r.get("fault_to_closed")),
        *[(f"  {name}", lambda r, n=name: r["stages"].get(n)) for name, *_ in STAGES],
        ("pitcrew's own share", lambda r: r.get("pitcrew_own_seconds")),
    ]
    for version, runs in others:
        print(f"medians, Slurm {version} against {first} (seconds)     {first:>8} {version:>8}     diff")
        for name, pick in picks:
            a, b = _median(base, pick), _median(runs, pick)
            if a is not None and b is not None:
                print(f"  {name:<34} {a:8.3f} {b:8.3f} {b - a:+8.3f}")
        a, b = (_median(r, lambda x: x["stages"].get("slurm")) for r in (base, runs))
        if a is not None and b is not None:
            print(
                f"Slurm's own requeue (DOWN -> job running elsewhere): {b:.2f}s on {version}, "
                f"{a:.2f}s on {first}: {b - a:+.2f}s"
            )


def report(workdir: Path, slurm: str, count: int, replace_delay: float) -> list[dict[str, Any]]:
    """``count`` runs on Slurm ``slurm``, each printed, then the table; the runs' summaries."""
    runs = []
    print(f"Slurm {slurm}", flush=True)
    for i in range(1, count + 1):
        data = one_run(workdir, i, replace_delay, slurm)
        runs.append(data)
        print(
            f"run {i}: job running {data['fault_to_job_running']:.2f}s, past checkpoint "
            f"{data['fault_to_job_progress']:.2f}s, closed {data['fault_to_closed']:.2f}s, pitcrew's own "
            f"{data['pitcrew_own_seconds']:.3f}s (whole run {data['wall']:.0f}s)",
            flush=True,
        )

    def values(key: str) -> list[float]:
        return [float(r[key]) for r in runs if r.get(key) is not None]

    print(f"\nxid79 on the proving ground, Slurm {slurm}, {len(runs)} runs (s)  min   median      max")
    print(row("fault -> job RUNNING elsewhere", values("fault_to_job_running")))
    print(row("fault -> job past its checkpoint", values("fault_to_job_progress")))
    print(row("fault -> incident closed", values("fault_to_closed")))
    print("by stage")
    for name, start, end, whose in STAGES:
        print(
            row(
                f"  {name}",
                [float(r["stages"][name]) for r in runs if name in r["stages"]],
                f"{start} -> {end}: {whose}",
            )
        )
    own = values("pitcrew_own_seconds")
    print(
        row(
            "pitcrew's own share",
            own,
            "(the rest is waiting on Prometheus, Alertmanager, Slurm, the replacement)",
        )
    )
    floor = TIMING.scrape_interval + TIMING.evaluation_interval + TIMING.group_wait
    print(
        f"\nbaseline (this run's far-side floors): detection <= {floor:.1f}s (scrape {TIMING.scrape_interval:.0f}s + "
        f"eval {TIMING.evaluation_interval:.0f}s + group_wait {TIMING.group_wait}s); Slurm requeue ~6s "
        f"(cred_expire 5s + sched_interval 1s); replacement {replace_delay:.0f}s"
    )
    worst = max(own) if own else float("nan")
    print(
        f"pitcrew's own share: max {worst:.3f}s, target < {TARGET_OWN:.0f}s: {'met' if worst < TARGET_OWN else 'MISSED'}\n"
    )
    return runs


if __name__ == "__main__":
    raise SystemExit(main())
