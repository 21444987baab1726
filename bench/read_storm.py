"""Read storm: webhook latency while 50 clients read a 10,000-alert incident, next to none reading.

Starts the real ``pitcrew serve`` (tests.harness.pitcrew, observe mode, SQLite with
``synchronous: full``) on loopback, gives one node an incident of ``--alerts`` alerts (in
deliveries of 100) and ``--nodes`` other nodes an open incident each, then offers the same
kind of webhook stream three times at a fixed rate (open loop, as Alertmanager sends: 90 %
redeliveries of known groups, 10 % new occurrences that attach and commit):

  1. baseline: nobody reads;
  2. ``--readers`` clients read the big incident over and over (``GET /api/v1/incidents/{id}``,
     the default page: 100 alerts, 100 events) for as long as the stream runs;
  3. the same with the largest page the API serves (``PAGE_MAX`` rows of alerts and of events).

Printed per phase: webhook p50/p99/max, and the reads served with their p50/p99; then the
webhook p99 under each storm against the baseline's and the 50 ms target.

    python bench/read_storm.py [--alerts 10000] [--readers 50] [--requests 2000] [--rate 200]
                               [--nodes 200] [--max-page PAGE_MAX]
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import json
import multiprocessing
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script from anywhere

from bot.store.base import PAGE_MAX
from tests.harness.pitcrew import Pitcrew

REPO = Path(__file__).resolve().parents[1]
TEMPLATE = json.loads((REPO / "tests" / "fixtures" / "alertmanager" / "xid79-firing.json").read_text())
FIRST = "2026-11-29T08:00:00.045Z"
BIG = "gpu-node-big"


def delivery(node: str, starts: str, fingerprints: list[str] | None = None) -> bytes:
    """The XID 79 group of ``node`` starting at ``starts``; with ``fingerprints``, one alert each."""
    body = copy.deepcopy(TEMPLATE)
    alerts = body["alerts"]
    if fingerprints is not None:
        alerts = [copy.deepcopy(alerts[0]) for _ in fingerprints]
    for index, alert in enumerate(alerts):
        alert["labels"] = {**alert["labels"], "node": node, "Hostname": node}
        alert["fingerprint"] = fingerprints[index] if fingerprints else f"{node}/{alert['fingerprint']}"
        alert["startsAt"] = starts
    body["alerts"] = alerts
    body["groupKey"] = f'{{}}:{{node="{node}"}}'
    return json.dumps(body, separators=(",", ":")).encode()


def stream(phase: int, count: int, nodes: int) -> list[bytes]:
    """Redeliveries of the warm-up groups, and every tenth a new occurrence (new startsAt)."""
    out = []
    for i in range(count):
        node = f"gpu-node-{(i * 7919) % nodes:05d}"
        if i % 10 == 0:
            out.append(delivery(node, f"2026-11-29T{10 + phase:02d}:{i // 60 % 60:02d}:{i % 60:02d}.045Z"))
        else:
            out.append(delivery(node, FIRST))
    return out


async def post_all(url: str, token: str, bodies: list[bytes], concurrency: int = 8) -> None:
    queue = list(reversed(bodies))
    headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
    async with aiohttp.ClientSession(headers=headers) as session:

        async def worker() -> None:
            while queue:
                async with session.post(f"{url}/api/v1/alerts", data=queue.pop()) as response:
                    assert response.status == 200, await response.text()

        await asyncio.gather(*(worker() for _ in range(concurrency)))


def read_storm(url: str, token: str, readers: int, go: Any, stop: Any, out: Any) -> None:
    """In a process of its own (so that parsing the answers does not delay the webhook client):
    ``readers`` clients read ``url`` over and over from ``go`` until ``stop``; their latencies to ``out``."""

    async def storm() -> list[float]:
        reads: list[float] = []
        headers = {"Authorization": f"Bearer {token}"}
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:

            async def reader() -> None:
                while not stop.is_set():
                    started = time.perf_counter()
                    async with session.get(url, headers=headers) as response:
                        assert response.status == 200, await response.text()
                        await response.read()
                    reads.append(time.perf_counter() - started)

            go.wait()
            await asyncio.gather(*(reader() for _ in range(readers)))
        return reads

    out.send(asyncio.run(storm()))


async def offer(server: Pitcrew, bodies: list[bytes], rate: float) -> tuple[list[float], float]:
    """Open loop: ``bodies`` at ``rate`` whatever the answers; each webhook's latency (in the order
    sent), and the time taken."""
    webhook: list[float] = [0.0] * len(bodies)
    headers = {"Authorization": f"Bearer {server.token}", "Content-Type": "application/json"}
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:

        async def one(index: int, body: bytes) -> None:
            started = time.perf_counter()
            async with session.post(f"{server.url}/api/v1/alerts", data=body, headers=headers) as r:
                assert r.status == 200, await r.text()
                await r.read()
            webhook[index] = time.perf_counter() - started

        began, sent = time.perf_counter(), []
        for index, body in enumerate(bodies):
            delay = began + index / rate - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            sent.append(asyncio.create_task(one(index, body)))
        await asyncio.gather(*sent)
    return webhook, time.perf_counter() - began


def phase(server: Pitcrew, bodies: list[bytes], rate: float, readers: int, read_path: str) -> dict[str, Any]:
    """Offer ``bodies`` at ``rate`` while ``readers`` clients read ``read_path`` until the stream ends."""
    reads: list[float] = []
    if readers:
        context = multiprocessing.get_context("spawn")
        go, stop = context.Event(), context.Event()
        receive, send = context.Pipe(duplex=False)
        process = context.Process(
            target=read_storm, args=(server.url + read_path, server.read_token, readers, go, stop, send)
        )
        process.start()
        go.set()
        time.sleep(1.0)  # the storm is under way before the first measured webhook
    try:
        webhook, elapsed = asyncio.run(offer(server, bodies, rate))
    finally:
        if readers:
            stop.set()
            reads = receive.recv()
            process.join()
    cuts = statistics.quantiles(webhook, n=100)
    result = {"p50": cuts[49] * 1000, "p99": cuts[98] * 1000, "max": max(webhook) * 1000, "reads": len(reads)}
    # Every tenth webhook is a new occurrence (a commit), the others redeliveries.
    result["new_p99"] = statistics.quantiles(webhook[::10], n=100)[98] * 1000
    result["repeat_p99"] = (
        statistics.quantiles([w for i, w in enumerate(webhook) if i % 10], n=100)[98] * 1000
    )
    result["reads_per_s"] = len(reads) / elapsed
    if len(reads) >= 2:
        read_cuts = statistics.quantiles(reads, n=100)
        result["read_p50"], result["read_p99"] = read_cuts[49] * 1000, read_cuts[98] * 1000
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--alerts", type=int, default=10_000, help="alerts of the incident the readers read")
    parser.add_argument("--readers", type=int, default=50, help="concurrent readers in a storm")
    parser.add_argument("--requests", type=int, default=2000, help="webhooks offered per phase")
    parser.add_argument("--rate", type=float, default=200.0, help="webhooks per second (open loop)")
    parser.add_argument("--nodes", type=int, default=200, help="other nodes with an open incident")
    parser.add_argument("--max-page", type=int, default=PAGE_MAX, help="page size of the third phase")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        server = Pitcrew(Path(tmp) / "pitcrew", simulated=False, config={"log": {"level": "WARNING"}})
        server.start()
        try:
            results = run(server, args)
        finally:
            server.stop()
    print(
        f"read storm: {args.requests} webhooks per phase offered at {args.rate:.0f}/s (open loop; 10% new "
        f"occurrences, the rest redeliveries; {args.nodes} nodes with an open incident); readers read an "
        f"incident of {args.alerts} alerts; {os.cpu_count()} CPUs; pitcrew serve, observe mode, engine running"
    )
    print(
        f"{'phase':<44} {'p50 ms':>8} {'p99 ms':>8} {'max ms':>8} {'new p99':>8} {'rep p99':>8} | "
        f"{'reads':>6} {'reads/s':>8} "
        f"{'read p50':>9} {'read p99':>9}"
    )
    for name, r in results.items():
        read = f"{r['reads']:>6} {r['reads_per_s']:>8.1f} " + (
            f"{r['read_p50']:>9.1f} {r['read_p99']:>9.1f}" if "read_p50" in r else f"{'-':>9} {'-':>9}"
        )
        print(
            f"{name:<44} {r['p50']:>8.2f} {r['p99']:>8.2f} {r['max']:>8.2f} {r['new_p99']:>8.2f} "
            f"{r['repeat_p99']:>8.2f} | {read}"
        )
    base = results[BASELINE]["p99"]
    for name, r in results.items():
        if name != BASELINE:
            print(
                f"webhook p99 with {name.split(':')[0]}: {r['p99']:.2f} ms = {r['p99'] / base:.1f} x baseline "
                f"({base:.2f} ms); target < 50 ms: {'met' if r['p99'] < 50 else 'MISSED'}"
            )


BASELINE = "baseline: no reads"


def run(server: Pitcrew, args: argparse.Namespace) -> dict[str, dict[str, Any]]:
    batches = [
        delivery(BIG, FIRST, [f"{n:016x}" for n in range(first, min(first + 100, args.alerts))])
        for first in range(0, args.alerts, 100)
    ]
    asyncio.run(post_all(server.url, server.token, batches[:1], concurrency=1))  # opens the big incident
    asyncio.run(post_all(server.url, server.token, batches[1:]))
    warm = [delivery(f"gpu-node-{n:05d}", FIRST) for n in range(args.nodes)]
    asyncio.run(post_all(server.url, server.token, warm))
    [big] = server.incidents(BIG)
    path = f"/api/v1/incidents/{big['id']}"
    results = {}
    phases = [
        (BASELINE, 0, ""),
        (f"storm: {args.readers} readers, default page", args.readers, ""),
        (
            f"storm max: {args.readers} readers, {args.max_page}-row pages",
            args.readers,
            f"?alerts_limit={args.max_page}&events_limit={args.max_page}",
        ),
    ]
    for number, (name, readers, query) in enumerate(phases):
        time.sleep(2.0)  # let the engine work off what the last phase opened
        results[name] = phase(
            server, stream(number, args.requests, args.nodes), args.rate, readers, path + query
        )
    return results


if __name__ == "__main__":
    main()
