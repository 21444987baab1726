"""Counting the whole fleet for the breaker: API reads per incident and decision time, 10 vs 10,000 nodes.

The breaker counts every node out of service (``bot.domain.outages``), read through the ports
as one list of Slurm nodes (slurmrestd, pitcrew's REST backend) and one of Kubernetes nodes
(the Kubernetes API emulator over real HTTP, pitcrew's adapter). Both far sides are built at
``--sizes`` nodes (2 % of them drained by an administrator, 1 % by a health check, 1 % cordoned,
1 % NotReady), then a storm of ``--alerts`` alerts on distinct nodes is decided, one after another
as admission does: the snapshot, the node's facts (its labels: one read of that node), the guards.

Two ways, same run, same far sides:

  1. baseline: the snapshot read for every alert (the cache off: ``max_age`` 0), i.e. one list of
     every node per alert, as a per-alert count would cost;
  2. pitcrew: the snapshot cached for the poll interval (``FleetView``, 60 s): the storm, which
     arrives within one interval, costs one list of each far side.

Printed per size and way: reads per incident at each far side (as the servers counted them),
decision time per incident p50/p99/max, and the one read of the fleet itself. Then pitcrew's own
share of one read: the two list bodies, fetched once, parsed and classified (the Kubernetes
emulator runs in this process and deep-copies every node it lists, so a read's wall time is
mostly the emulator's, not pitcrew's).

The baseline decides at most ``--baseline-alerts`` alerts (every one reads the whole fleet: at
10,000 nodes that is seconds per alert); its reads per incident are 1 by construction.

    python bench/fleet_count.py [--sizes 10,10000] [--alerts 200] [--baseline-alerts 10]
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import json
import sys
import tempfile
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script from anywhere

import aiohttp
import kmock
from aiohttp import web

from bot.config import KubernetesSettings, load_catalog, load_playbooks
from bot.domain.faults import classify
from bot.domain.guards import World, evaluate
from bot.domain.labels import Subject
from bot.domain.outages import kubernetes_outage, slurm_outage
from bot.domain.planner import plan
from bot.domain.policy import Mode, Policy
from bot.engine.admission import node_facts
from bot.engine.context import Ports
from bot.engine.fleet import FleetView
from bot.engine.steps import REGISTRY
from bot.integrations.journal import LogNotifier
from bot.integrations.kubernetes import KubernetesCluster
from bot.integrations.kubernetes.nodes import raw_facts
from bot.integrations.slurm import SlurmSettings, build_scheduler
from bot.integrations.slurm.json import nodes_from_payload
from proving_ground.kubernetes.emulator import KubeEmulator, load_fixture
from proving_ground.kubernetes.world import write_kubeconfig

REPO = Path(__file__).resolve().parents[1]
REST = REPO / "tests" / "fixtures" / "slurm" / "rest"
TOKEN = "bench.jwt.token"
NOW = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)


def _mark(i: int, size: int) -> str:
    """Which nodes are out, and how: 2 % admin drains, 1 % health check, 1 % cordon, 1 % NotReady
    (on 10 nodes: one drained by an administrator)."""
    return {0: "admin", 1: "admin", 2: "nhc", 3: "cordon", 4: "notready"}.get(i * 100 // size, "")


class Slurmrestd:
    """slurmrestd as pitcrew's REST backend reads it: the captured v0.0.38 OpenAPI document and
    ``/nodes`` with ``size`` nodes built from the captured node; every request counted."""

    def __init__(self, size: int) -> None:
        self.requests = 0
        template = json.loads((REST / "nodes-all-healthy.json").read_text())
        nodes = []
        for i in range(size):
            node = copy.deepcopy(template["nodes"][0])
            node.update(name=f"gpu-{i:05d}", hostname=f"gpu-{i:05d}", state="idle", reason="")
            if _mark(i, size) in {"admin", "nhc"}:
                node["state"] = "idle"
                node["state_flags"] = ["DRAIN"]
                node["reason"] = (
                    "admin: bios update" if _mark(i, size) == "admin" else "NHC: check_gpu failed"
                )
                node["reason_set_by_user"] = "root"
            nodes.append(node)
        self.body = json.dumps({**template, "nodes": nodes}).encode()
        self.document = json.loads((REST / "openapi-v3.json").read_text())

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/openapi/v3", self.openapi)
        app.router.add_get("/slurm/{version}/nodes", self.nodes)
        return app

    async def openapi(self, request: web.Request) -> web.Response:
        return web.json_response(self.document)

    async def nodes(self, request: web.Request) -> web.Response:
        self.requests += 1
        return web.Response(body=self.body, content_type="application/json")


def _ms(values: list[float]) -> str:
    ranked = sorted(values)

    def rank(q: float) -> float:  # nearest rank: a value that was measured
        return ranked[min(len(ranked) - 1, max(0, round(q * len(ranked)) - 1))]

    return f"p50 {rank(0.5) * 1000:7.2f} ms  p99 {rank(0.99) * 1000:7.2f} ms  max {ranked[-1] * 1000:7.2f} ms"


async def decide_storm(
    ports: Ports, view: FleetView, names: list[str], alerts: int, clock: Callable[[], datetime]
) -> list[float]:
    """Admission's path per alert, one after another: snapshot, the node's facts, the guards."""
    catalog, playbooks, policy = load_catalog(), load_playbooks(), Policy(mode=Mode.AUTO)
    times = []
    for i in range(alerts):
        node = names[(i * 7919 + 5) % len(names)]
        started = time.perf_counter()
        snapshot = await view.snapshot()
        facts = await node_facts(ports, node, fleet=snapshot)
        fault = classify(Subject(node, "3", None, None, 79, "79", None, ""), catalog)
        planned = plan(node, [fault], [], policy, playbooks, clock(), REGISTRY)
        world = World(fleet=facts.fleet(None), node_labels=facts.labels, out_of_service=facts.out_of_service)
        evaluate(planned, world, policy, clock())
        times.append(time.perf_counter() - started)
    return times


async def own_share(size: int, kubernetes: str, slurmrestd: int) -> str:
    """pitcrew's own cost of one fleet read: parse and classify both list bodies (fetched once)."""
    async with aiohttp.ClientSession() as session:
        async with session.get(f"{kubernetes}/api/v1/nodes") as response:
            k8s_body = await response.read()
        async with session.get(f"http://127.0.0.1:{slurmrestd}/slurm/v0.0.38/nodes") as response:
            slurm_body = await response.read()
    began = time.perf_counter()
    nodes = [raw_facts(item, "nvidia.com/gpu") for item in json.loads(k8s_body)["items"]]
    out = [
        o
        for n in nodes
        if (
            o := kubernetes_outage(
                n.name,
                unschedulable=n.unschedulable,
                ready=n.ready,
                taint_keys=[t.key for t in n.taints],
                annotations=n.annotations,
            )
        )
    ]
    states = nodes_from_payload(json.loads(slurm_body))
    out += [o for s in states if (o := slurm_outage(s.name, s.states, s.reason, s.reason_user))]
    took = time.perf_counter() - began
    return (
        f"{size:>6} nodes  pitcrew's own share of one fleet read (parse + classify {len(k8s_body) + len(slurm_body):,} "
        f"bytes): {took * 1000:.1f} ms, {len(out)} outages"
    )


async def one_size(size: int, alerts: int, baseline_alerts: int) -> list[str]:
    names = [f"gpu-{i:05d}" for i in range(size)]
    slurm = Slurmrestd(size)
    runner = web.AppRunner(slurm.app())
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    lines = []
    try:
        async with KubeEmulator() as emulator, kmock.Server(emulator):
            template = load_fixture("node-gpu.json")
            for i, name in enumerate(names):
                node = copy.deepcopy(template)
                node["metadata"]["name"] = name
                node["metadata"]["labels"] = {
                    **node["metadata"].get("labels", {}),
                    "kubernetes.io/hostname": name,
                }
                if _mark(i, size) == "cordon":
                    node["spec"]["unschedulable"] = True
                if _mark(i, size) == "notready":
                    node["status"]["conditions"] = [{"type": "Ready", "status": "False"}]
                emulator.add("nodes", node)
            with tempfile.TemporaryDirectory() as tmp:
                token = Path(tmp) / "jwt"
                token.write_text(f"SLURM_JWT={TOKEN}\n")
                kubeconfig = write_kubeconfig(Path(tmp) / "kubeconfig", emulator.host)
                cluster = KubernetesCluster(
                    KubernetesSettings(kubeconfig=kubeconfig, qps=1e6, burst=1_000_000, request_timeout=600)
                )
                scheduler = build_scheduler(
                    SlurmSettings.model_validate(
                        {"backend": "rest", "rest_url": f"http://127.0.0.1:{port}", "rest_token_file": token}
                    )
                )
                ports = Ports(scheduler=scheduler, cluster=cluster, notifier=LogNotifier())
                await cluster.node(names[0])  # build the client and discover the API outside the figures
                await scheduler.nodes()
                try:
                    for way, max_age, count in (
                        ("baseline (read per alert)", timedelta(0), min(alerts, baseline_alerts)),
                        ("pitcrew (cached)", timedelta(seconds=60), alerts),
                    ):
                        view = FleetView(ports, lambda: NOW, max_age)
                        emulator.log.clear()
                        slurm.requests = 0
                        times = await decide_storm(ports, view, names, count, lambda: NOW)
                        lists = len([e for e in emulator.log if e.verb == "list"])
                        gets = len([e for e in emulator.log if e.verb == "get"])
                        rest = slurm.requests
                        out = len((await view.snapshot()).out_of_service.outages)
                        lines.append(
                            f"{size:>6} nodes, {count:>3} alerts  {way:<26} reads/incident: Kubernetes list {lists / count:6.3f}, "
                            f"get {gets / count:5.3f}; slurmrestd {rest / count:6.3f}  |  "
                            f"decision {_ms(times)}  |  one fleet read {view.last_read_seconds * 1000:8.1f} ms, "
                            f"{out} nodes out"
                        )
                    lines.append(await own_share(size, emulator.host, port))
                finally:
                    await cluster.aclose()
                    await scheduler.aclose()  # type: ignore[attr-defined]
    finally:
        await runner.cleanup()
    return lines


async def main(args: argparse.Namespace) -> None:
    sizes = [int(s) for s in args.sizes.split(",")]
    print(f"storm of {args.alerts} alerts on distinct nodes, decided one after another (admission's path)")
    for size in sizes:
        for line in await one_size(size, min(args.alerts, size), args.baseline_alerts):
            print(line)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--sizes", default="10,10000")
    parser.add_argument("--alerts", type=int, default=200)
    parser.add_argument(
        "--baseline-alerts",
        type=int,
        default=10,
        help="alerts the baseline decides (each reads the whole fleet)",
    )
    asyncio.run(main(parser.parse_args()))
