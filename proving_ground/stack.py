"""The detection stack the end-to-end tests and the bench share, and what sits at its far end.

Owns wiring stand-in dcgm-exporter nodes (with the shipped collectors CSV) to a Prometheus that
loads pitcrew's rules in their FAST profile and sends to one Alertmanager port, which each test
module (or the bench) fills with a fresh Alertmanager pointed at its receiver: a bare
``WebhookSink``, or pitcrew itself (``proving_ground.pitcrew.Pitcrew``).
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aiohttp import web

from proving_ground.assets import COLLECTORS_CSV, fast_rules
from proving_ground.dcgm import ServerThread, Standin, load_collectors
from proving_ground.proc import free_port, wait_until
from proving_ground.prometheus import (
    Alertmanager,
    Prometheus,
    Timing,
    alertmanager_config,
    prometheus_config,
)

TEST_TIMING = Timing()
TEST_TOKEN = "pitcrew-test-token"
#: Stand-in nodes of the session stack: each test takes its own, so tests never see each other's faults.
NODES = tuple(f"gpu-node-{i:02d}" for i in range(1, 13))


@dataclass
class Delivery:
    at: float  # time.monotonic() when the POST arrived
    headers: dict[str, str]
    body: dict[str, Any]


class WebhookSink:
    """A bare webhook receiver (loopback, background thread) that records every delivery and answers 200."""

    def __init__(self) -> None:
        self.deliveries: list[Delivery] = []
        self.url = ""
        app = web.Application()
        app.router.add_post("/api/v1/alerts", self._receive)
        self._server = ServerThread([app])

    async def _receive(self, request: web.Request) -> web.Response:
        self.deliveries.append(Delivery(time.monotonic(), dict(request.headers), await request.json()))
        return web.Response(text="ok")

    def start(self) -> WebhookSink:
        self._server.start()
        self.url = f"http://{self._server.addresses[0]}/api/v1/alerts"
        return self

    def stop(self) -> None:
        self._server.stop()

    def alerts(self, **labels: str) -> Iterator[tuple[Delivery, dict[str, Any]]]:
        for delivery in list(self.deliveries):
            for alert in delivery.body["alerts"]:
                if all(alert["labels"].get(k) == v for k, v in labels.items()):
                    yield delivery, alert

    def wait_for(self, *, status: str = "firing", timeout: float = 30.0, **labels: str) -> dict[str, Any]:
        """The first delivered alert with these labels and status."""
        found: list[dict[str, Any]] = []

        def arrived() -> bool:
            found[:] = [a for _, a in self.alerts(**labels) if a["status"] == status]
            return bool(found)

        wait_until(arrived, timeout=timeout, interval=0.02, what=f"{status} alert {labels} at the webhook")
        return found[0]


@dataclass
class DetectionStack:
    """stand-in nodes -> Prometheus (pitcrew's rules) -> an Alertmanager port that modules fill in turn."""

    standin: Standin
    prometheus: Prometheus
    alertmanager_port: int
    timing: Timing
    token_file: Path

    def start_alertmanager(self, binary: str, workdir: Path, webhook_url: str) -> Alertmanager:
        """A fresh Alertmanager (empty notification log) on the port Prometheus sends to."""
        config = alertmanager_config(webhook_url, self.token_file, self.timing)
        alertmanager = Alertmanager(binary, workdir, config, port=self.alertmanager_port)
        alertmanager.start()
        return alertmanager


def start_stack(
    prometheus_binary: str,
    workdir: Path,
    *,
    nodes: Sequence[str] = NODES,
    timing: Timing = TEST_TIMING,
    token: str = TEST_TOKEN,
) -> DetectionStack:
    """Stand-in, rules and Prometheus, waited on until every target is up. The caller stops them."""
    collectors, fields = load_collectors(COLLECTORS_CSV)
    standin = Standin(nodes, collectors=collectors, fields=fields).start()
    try:
        rule_file = workdir / "gpu-faults.rules.yml"
        rule_file.write_text(fast_rules())
        token_file = workdir / "pitcrew-token"
        token_file.write_text(token)
        port = free_port()
        targets = {node: standin.address(node) for node in nodes}
        prometheus = Prometheus(
            prometheus_binary, workdir, prometheus_config(targets, f"127.0.0.1:{port}", rule_file, timing)
        )
        prometheus.start()
    except BaseException:
        standin.stop()
        raise
    stack = DetectionStack(standin, prometheus, port, timing, token_file)
    try:
        prometheus.wait_targets_up(nodes)
    except BaseException:
        stop_stack(stack)
        raise
    return stack


def stop_stack(stack: DetectionStack) -> None:
    try:
        stack.prometheus.stop()
    finally:
        stack.standin.stop()
