"""Detection latency: XID 79 injected in the dcgm-exporter stand-in -> incident opened in pitcrew.

Starts the end-to-end tests' stack (stand-in nodes, real Prometheus with pitcrew's rules, real
Alertmanager with the shipped route) and pitcrew (``python -m bot.cli serve`` via tests.harness.pitcrew,
observe mode). If
pitcrew does not start, it measures up to a bare webhook receiver instead and says so. Each run
injects XID 79 on a fresh node (a new fingerprint and a new incident) at a random phase of the scrape
and evaluation ticks, and the result is printed next to the floor the same run's settings impose:
``scrape_interval + evaluation_interval + group_wait``.

Usage: python bench/detection.py [--runs 10] [--receiver auto|pitcrew|webhook] [--scrape 1] [--eval 1]
       [--group-wait 1]   (production-like: --scrape 15 --eval 15 --group-wait 5, about 5 minutes)
"""

from __future__ import annotations

import argparse
import contextlib
import random
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script from anywhere

from proving_ground.proc import tail
from proving_ground.prometheus import Timing
from proving_ground.stack import DetectionStack, WebhookSink, start_stack, stop_stack
from tests.harness.pitcrew import Pitcrew

#: given a node and the injection time, when the fault was seen there (monotonic), or None if not yet
Seen = Callable[[str, float], float | None]


class Stoppable(Protocol):
    def stop(self) -> None: ...


def binary(name: str) -> str:
    path = shutil.which(name)
    if not path:
        sys.exit(f"{name} not found: apt-get install prometheus prometheus-alertmanager")
    return path


def measure(stack: DetectionStack, runs: int, seen: Seen) -> list[float]:
    """Seconds from injection to ``seen(node, t0)`` returning the time the fault was seen, per run."""
    latencies = []
    for i, node in enumerate(stack.standin.nodes):
        if i == runs:
            break
        time.sleep(random.uniform(0, stack.timing.scrape_interval))  # a random phase against the ticks
        t0 = time.monotonic()
        stack.standin.node(node).inject("xid", gpu=i % 8, xid=79)
        deadline = t0 + 60
        while (at := seen(node, t0)) is None:
            if time.monotonic() > deadline:
                sys.exit(f"run {i + 1}: nothing seen for {node} within 60 s")
            time.sleep(0.005)
        latencies.append(at - t0)
        print(f"  run {i + 1:2d}  {node}  gpu {i % 8}  {latencies[-1]:.2f} s", flush=True)
    return latencies


def pitcrew_seen(pitcrew: Pitcrew) -> Seen:
    def seen(node: str, _: float) -> float | None:
        now = time.monotonic()
        opened = any(
            f["kind"] == "xid" and f["xid"] == 79 for i in pitcrew.incidents(node) for f in i["faults"]
        )
        return now if opened else None

    return seen


def webhook_seen(sink: WebhookSink) -> Seen:
    def seen(node: str, t0: float) -> float | None:
        arrivals = [
            d.at for d, a in sink.alerts(node=node, xid="79") if a["status"] == "firing" and d.at >= t0
        ]
        return min(arrivals, default=None)

    return seen


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--receiver", choices=["auto", "pitcrew", "webhook"], default="auto")
    parser.add_argument("--scrape", type=float, default=1.0, help="scrape_interval, seconds")
    parser.add_argument("--eval", type=float, default=1.0, help="evaluation_interval, seconds")
    parser.add_argument("--group-wait", type=float, default=1.0, help="pitcrew route's group_wait, seconds")
    args = parser.parse_args()
    timing = Timing(scrape_interval=args.scrape, evaluation_interval=args.eval, group_wait=args.group_wait)
    nodes = [f"bench-node-{i:02d}" for i in range(1, args.runs + 1)]
    with tempfile.TemporaryDirectory(prefix="pitcrew-bench-") as tmp, contextlib.ExitStack() as cleanup:
        workdir = Path(tmp)
        stack = start_stack(binary("prometheus"), workdir, nodes=nodes, timing=timing)
        cleanup.callback(stop_stack, stack)
        receiver, url, seen, target = start_receiver(args.receiver, stack, workdir)
        cleanup.callback(receiver.stop)
        alertmanager = stack.start_alertmanager(binary("prometheus-alertmanager"), workdir / "am", url)
        cleanup.callback(alertmanager.stop)
        print(f"XID 79 injected -> {target}, {args.runs} runs")
        report(measure(stack, args.runs, seen), timing)


def start_receiver(choice: str, stack: DetectionStack, workdir: Path) -> tuple[Stoppable, str, Seen, str]:
    """pitcrew if asked for or if it starts, else a bare webhook receiver: (it, its URL, how to see, what)."""
    if choice != "webhook":
        pitcrew = Pitcrew(
            workdir / "pitcrew",
            token=stack.token_file.read_text(),
            config={"mode": "observe"},
            simulated=False,
        )
        try:
            pitcrew.start()
        except BaseException as exc:  # pytest.fail raises a BaseException
            pitcrew.stop()
            if choice == "pitcrew":
                raise
            why = tail(pitcrew.log).splitlines()[-1:] or [str(exc)]
            print(f"pitcrew did not start ({why[0]}): measuring up to a bare webhook receiver instead")
        else:
            target = "incident opened in pitcrew (GET /api/v1/incidents)"
            return pitcrew, f"{pitcrew.url}/api/v1/alerts", pitcrew_seen(pitcrew), target
    sink = WebhookSink().start()
    return sink, sink.url, webhook_seen(sink), "webhook received by a bare receiver"


def report(latencies: list[float], timing: Timing) -> None:
    low, high = timing.group_wait, timing.floor
    mean = timing.scrape_interval / 2 + timing.evaluation_interval / 2 + timing.group_wait
    print(
        f"\nsettings: scrape_interval {timing.scrape_interval:g} s, evaluation_interval "
        f"{timing.evaluation_interval:g} s, group_wait {timing.group_wait:g} s"
    )
    print(
        f"measured: min {min(latencies):.2f} s  median {statistics.median(latencies):.2f} s  "
        f"max {max(latencies):.2f} s  (n={len(latencies)})"
    )
    print(
        f"floor:    waiting for the ticks costs {low:g}-{high:g} s (scrape + evaluation + group_wait), "
        f"{mean:g} s on average"
    )


if __name__ == "__main__":
    main()
