"""Kubernetes adapter: cordon + rollback latency, and what the shared rate limit costs, on the emulator.

Runs the Kubernetes API emulator (proving_ground/kubernetes) on loopback and pitcrew's adapter against it
through a kubeconfig, as the service does. Three phases, same run, same emulator:

  1. baseline: the bare ``kubernetes.aio`` client sends the same one guarded merge patch per node
     (read + patch), no adapter, no limiter;
  2. the adapter's cordon then uncordon of ``--nodes`` nodes, one after another, limiter wide open
     (qps/burst far above the load): the adapter's own cost;
  3. ``--incidents`` pollers reading their node at once through the adapter with the configured
     ``--qps``/``--burst``: requests/s and the busiest 1 s window as measured at the emulator.

    python bench/k8s_cordon.py [--nodes 200] [--incidents 200] [--qps 20] [--burst 40]
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script from anywhere

import kmock
from kubernetes.aio import client

from bot.config import KubernetesSettings
from bot.integrations.kubernetes import KubernetesCluster
from proving_ground.kubernetes.emulator import EMULATED_TOKEN, KubeEmulator, load_fixture
from proving_ground.kubernetes.world import write_kubeconfig


def _ms(values: list[float]) -> str:
    q = statistics.quantiles(values, n=100)
    return f"p50 {q[49] * 1000:6.2f} ms  p99 {q[98] * 1000:6.2f} ms  max {max(values) * 1000:6.2f} ms"


def _busiest(stamps: list[float], window: float) -> int:
    stamps, most, start = sorted(stamps), 0, 0
    for end, at in enumerate(stamps):
        while at - stamps[start] > window:
            start += 1
        most = max(most, end - start + 1)
    return most


async def main(args: argparse.Namespace) -> None:
    async with KubeEmulator() as emulator, kmock.Server(emulator):
        template = load_fixture("node-gpu.json")
        names = [f"gpu-{i:04d}" for i in range(args.nodes)]
        for name in names:
            node = copy.deepcopy(template)
            node["metadata"]["name"] = name
            emulator.add("nodes", node)
        with tempfile.TemporaryDirectory() as tmp:
            kubeconfig = write_kubeconfig(Path(tmp) / "kubeconfig", emulator.host)

            configuration = client.Configuration(
                host=emulator.host, api_key={"BearerToken": f"Bearer {EMULATED_TOKEN}"}
            )
            async with client.ApiClient(configuration) as api:
                core = client.CoreV1Api(api)
                base = []
                for name in names:
                    started = time.perf_counter()
                    node = await core.read_node(name)
                    body = {
                        "metadata": {"resourceVersion": node.metadata.resource_version},
                        "spec": {"unschedulable": True},
                    }
                    await core.patch_node(name, body, _content_type="application/merge-patch+json")
                    base.append(time.perf_counter() - started)
                for name in names:
                    await core.patch_node(
                        name, {"spec": {"unschedulable": None}}, _content_type="application/merge-patch+json"
                    )

            wide = KubernetesCluster(KubernetesSettings(kubeconfig=kubeconfig, qps=1e6, burst=1_000_000))
            cordon, uncordon = [], []
            for name in names:
                started = time.perf_counter()
                await wide.cordon(name, incident_id="pc-bench", reason="bench")
                cordon.append(time.perf_counter() - started)
                started = time.perf_counter()
                await wide.uncordon(name, incident_id="pc-bench")
                uncordon.append(time.perf_counter() - started)
            await wide.aclose()

            limited = KubernetesCluster(
                KubernetesSettings(kubeconfig=kubeconfig, qps=args.qps, burst=args.burst, request_timeout=600)
            )
            emulator.log.clear()
            started = time.perf_counter()
            await asyncio.gather(*(limited.node(names[i % len(names)]) for i in range(args.incidents)))
            took = time.perf_counter() - started
            await limited.aclose()
            stamps = [e.at for e in emulator.log]

    print(f"nodes {args.nodes}, incidents {args.incidents}, qps {args.qps:g}, burst {args.burst}")
    print(f"baseline  bare client read+patch : {_ms(base)}")
    print(f"adapter   cordon (read+patch)    : {_ms(cordon)}")
    print(f"adapter   uncordon (read+patch)  : {_ms(uncordon)}")
    print(f"adapter   cordon p50 / baseline p50: {statistics.median(cordon) / statistics.median(base):.2f}x")
    bound = args.burst + args.qps
    print(
        f"limited   {len(stamps)} reads in {took:.2f}s = {len(stamps) / took:.1f}/s; busiest 1 s window "
        f"{_busiest(stamps, 1.0)} requests (bound burst+qps = {bound:g})"
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--nodes", type=int, default=200)
    parser.add_argument("--incidents", type=int, default=200)
    parser.add_argument("--qps", type=float, default=20.0)
    parser.add_argument("--burst", type=int, default=40)
    asyncio.run(main(parser.parse_args()))
