"""Store writes: what one write costs a step and a webhook, on SQLite and on Postgres, one run.

Both stores in the same run on the same machine: the SQLite file (``synchronous: full``, the
default) and a throwaway PostgreSQL cluster started as the tests start it (loopback, ``fsync``
off: this measures pitcrew's round trips and locking, not the disk). Measured, one at a time:

  1. a fenced engine write (``step_progress`` through ``Store.fenced``: the intent a step persists
     before a destructive call, with the lease check in the same transaction);
  2. a new alert (``ingest`` of a delivery with one new alert: dedupe lookup, rows, events);
  3. a repeat delivery (``count_repeats``: SQLite answers from memory, Postgres in one transaction);
  4. ``concurrency`` fenced writes at once (the writes of several incidents' steps), per write.

Printed: p50/p99 in milliseconds per operation and store.

    python bench/store_writes.py [--writes 300] [--concurrency 8]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path

from bot.domain.faults import Fault
from bot.store.base import Delivery, Fence, IncomingAlert
from bot.store.postgres import PostgresStore
from bot.store.sqlite import SqliteStore
from proving_ground.postgres import running_postgres

Store = SqliteStore | PostgresStore
T0 = datetime(2026, 12, 1, tzinfo=UTC)


def _delivery(n: int) -> Delivery:
    node = f"gpu-{n:04d}"
    fault = Fault("xid", node, "3", 79, "RESTART_BM", "fatal", "replace-node", True, "fell off the bus", True)
    alert = IncomingAlert(f"fp{n}", T0, None, "firing", "GpuXid", node, {"node": node}, {}, fault)
    return Delivery("pitcrew", f"{{node={node}}}", "firing", 0, (alert,))


async def _timed(times: list[float], call: Callable[[], Awaitable[object]]) -> None:
    started = time.perf_counter()
    await call()
    times.append((time.perf_counter() - started) * 1000)


def _line(store: str, what: str, times: list[float]) -> str:
    p99 = statistics.quantiles(times, n=100)[98] if len(times) >= 2 else times[0]
    return f"  {store:9} {what:34} p50 {statistics.median(times):7.2f} ms   p99 {p99:7.2f} ms"


async def _measure(name: str, store: Store, writes: int, concurrency: int) -> list[str]:
    await store.open()
    try:
        fence = Fence("bench")
        lease = await store.acquire_lease("bench", timedelta(minutes=5))
        fence.grant(lease.epoch, time.monotonic() + 300)
        fenced = store.fenced(fence)
        (incident,) = (await store.ingest(_delivery(0), T0)).opened
        lines = []
        times: list[float] = []
        for n in range(writes):
            await _timed(times, lambda n=n: fenced.step_progress(incident, "cordon", {"intent": n}, T0))
        lines.append(_line(name, "fenced step write", times))
        times = []
        for n in range(1, writes + 1):
            await _timed(times, lambda n=n: store.ingest(_delivery(n), T0))
        lines.append(_line(name, "new alert (ingest)", times))
        times = []
        for _ in range(writes):
            await _timed(times, lambda: store.count_repeats([("fp1", T0, "firing")], T0))
        lines.append(_line(name, "repeat delivery (count_repeats)", times))
        times = []
        for _ in range(max(1, writes // concurrency)):
            await asyncio.gather(
                *(
                    _timed(times, lambda k=k: fenced.step_progress(incident, f"s{k}", {"k": k}, T0))
                    for k in range(concurrency)
                )
            )
        lines.append(_line(name, f"fenced write, {concurrency} at once", times))
        return lines
    finally:
        await store.close()


async def main(writes: int, concurrency: int) -> None:
    with tempfile.TemporaryDirectory() as tmp, running_postgres() as server:
        database = server.create_database()
        password = Path(tmp) / "password"
        password.write_text(server.password)
        sqlite = SqliteStore(Path(tmp) / "pitcrew.db", synchronous="full")
        postgres = PostgresStore(server.url(database), password_file=password)
        lines = await _measure("sqlite", sqlite, writes, concurrency)
        lines += await _measure("postgres", postgres, writes, concurrency)
    print(f"store writes ({writes} each, one at a time unless said):")
    print("\n".join(lines))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--writes", type=int, default=300)
    parser.add_argument("--concurrency", type=int, default=8)
    args = parser.parse_args()
    asyncio.run(main(args.writes, args.concurrency))
