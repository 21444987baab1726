"""200 incidents polling at once never exceed the configured client rate, measured at the emulator.

One adapter (as in the service: one client per process) serves 200 concurrent pollers. The emulator
stamps every request it receives; in every window of the run, the count stays within the token
bucket's bound ``burst + qps * window``. The same load without a meaningful limit (a control run)
breaks that bound, so the measurement can tell a flood from a limited stream.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from bot.integrations.kubernetes import KubernetesCluster
from proving_ground.kubernetes.emulator import KubeEmulator

NODE = "gpu-node-02"
INCIDENTS, POLLS = 200, 1
QPS, BURST = 50.0, 10
#: Stamps are taken when the emulator reads a request, in the same event loop as the client: allow
#: two requests of scheduling jitter at the window edges.
JITTER = 2
#: On a loaded machine the loop can stall; requests the client sent at the allowed rate during the
#: stall are then read (and stamped) together. Allow that much time on top of each window.
STALL = 0.2


def _busiest(stamps: list[float], window: float) -> int:
    stamps = sorted(stamps)
    most, start = 0, 0
    for end, at in enumerate(stamps):
        while at - stamps[start] > window:
            start += 1
        most = max(most, end - start + 1)
    return most


async def _storm(cluster: KubernetesCluster) -> None:
    async def incident() -> None:
        for _ in range(POLLS):
            assert await cluster.node(NODE) is not None

    await asyncio.gather(*(incident() for _ in range(INCIDENTS)))


async def test_two_hundred_pollers_stay_within_qps_and_burst(
    make_cluster: Callable[..., KubernetesCluster], k8s: KubeEmulator
) -> None:
    await _storm(make_cluster(qps=QPS, burst=BURST, request_timeout=30))
    stamps = [e.at for e in k8s.log]
    assert len(stamps) == INCIDENTS * POLLS
    for window in (0.5, 1.0, 2.0):
        assert _busiest(stamps, window) <= BURST + QPS * (window + STALL) + JITTER, window
    took = max(stamps) - min(stamps)
    assert took >= (INCIDENTS * POLLS - BURST) / QPS * 0.9
    print(
        f"\n[rate] {len(stamps)} requests in {took:.2f}s = {len(stamps) / took:.0f}/s (qps {QPS:g}, burst {BURST})"
    )

    k8s.log.clear()
    await _storm(make_cluster(qps=1e6, burst=1_000_000, request_timeout=30))
    flood = _busiest([e.at for e in k8s.log], 0.5)
    assert flood > 2 * (BURST + QPS * 0.5 + JITTER), flood  # control: unlimited, the same load floods
