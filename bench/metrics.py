"""/metrics under load: exposition size and time with N active incidents, against none.

pitcrew's registry is pre-initialised (every playbook, fault class and outcome exists at 0),
and ``pitcrew_incident_info`` holds one series per active incident. This measures, in one run:

  1. baseline: a fresh registry, no incident;
  2. ``--incidents`` active incidents shown (each with a step change), exposition again;
  3. all of them closed: the exposition is back to the baseline's size (no series left behind);

and the cost of the bookkeeping itself (show + step change + drop per incident).

    python bench/metrics.py [--incidents 1000] [--rounds 50]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script from anywhere

from prometheus_client import generate_latest

from bot.engine.metrics import IncidentLabels, Metrics

T0 = datetime(2026, 12, 1, tzinfo=UTC)


def expose(metrics: Metrics, rounds: int) -> tuple[int, float, float]:
    """(bytes, p50 ms, max ms) of ``rounds`` expositions."""
    took, size = [], 0
    for _ in range(rounds):
        began = time.perf_counter()
        size = len(generate_latest(metrics.registry))
        took.append((time.perf_counter() - began) * 1000)
    return size, statistics.median(took), max(took)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--incidents", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=50)
    args = parser.parse_args()
    metrics = Metrics(version="bench")
    base = expose(metrics, args.rounds)

    began = time.perf_counter()
    for n in range(args.incidents):
        labels = IncidentLabels(f"gpu-{n:05d}", "replace-node", "slurm_down", "auto")
        metrics.incidents.show(f"pc-{n:05d}", labels, T0)
    for n in range(args.incidents):
        labels = IncidentLabels(f"gpu-{n:05d}", "replace-node", "wait_ready", "auto")
        metrics.incidents.show(f"pc-{n:05d}", labels, T0)
    shown = time.perf_counter() - began
    loaded = expose(metrics, args.rounds)

    began = time.perf_counter()
    for n in range(args.incidents):
        metrics.incidents.drop(f"pc-{n:05d}")
    dropped = time.perf_counter() - began
    after = expose(metrics, args.rounds)

    print(f"{'phase':<28} {'bytes':>9} {'p50 ms':>8} {'max ms':>8}")
    for name, (size, p50, worst) in (
        ("baseline (no incident)", base),
        (f"{args.incidents} active incidents", loaded),
        ("all closed", after),
    ):
        print(f"{name:<28} {size:>9} {p50:>8.2f} {worst:>8.2f}")
    per = 1e6 / args.incidents
    print(f"bookkeeping: show + step change {shown * per:.1f} µs per incident, drop {dropped * per:.1f} µs")
    print(
        f"against the baseline: +{loaded[0] - base[0]} bytes and x{loaded[1] / base[1]:.2f} time with "
        f"{args.incidents} active; after close {after[0] - base[0]:+d} bytes"
    )


if __name__ == "__main__":
    main()
