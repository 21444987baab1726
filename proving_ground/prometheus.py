"""Debian's ``prometheus`` and ``prometheus-alertmanager`` as test servers, and their configurations.

Owns starting them on loopback with temporary storage (Alertmanager without gossip), waiting until
they really serve (``/-/ready``, then ``up == 1`` on every target), stopping them (SIGTERM, then
SIGKILL) and the configurations: Prometheus with one target per node carrying
``__meta_kubernetes_pod_node_name`` as Kubernetes SD would; Alertmanager as the shipped
``alertmanager/alertmanager.yml`` with only the webhook URL, the token path and the pitcrew route's
timings replaced (human receivers keep their names and lose their integrations).
"""

from __future__ import annotations

import json
import subprocess
import urllib.parse
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from proving_ground.assets import SHIPPED_ALERTMANAGER
from proving_ground.proc import DemoError, free_port, stop_process, tail, wait_until


@dataclass(frozen=True)
class Timing:
    """The intervals that bound detection latency; ``floor`` is what waiting for ticks costs at most."""

    scrape_interval: float = 1.0
    evaluation_interval: float = 1.0
    group_wait: float = 1.0
    group_interval: float = 1.0
    repeat_interval: str = "1h"

    @property
    def floor(self) -> float:
        return self.scrape_interval + self.evaluation_interval + self.group_wait


def duration(seconds: float) -> str:
    """Prometheus and Alertmanager durations take no decimals: 1.5 s is "1500ms"."""
    return f"{round(seconds * 1000)}ms"


def http_json(
    url: str, body: Any = None, *, headers: Mapping[str, str] | None = None, timeout: float = 5.0
) -> Any:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(
        url, data=data, headers={"Content-Type": "application/json", **(headers or {})}
    )
    with urllib.request.urlopen(request, timeout=timeout) as response:
        payload = response.read()
    return json.loads(payload) if payload else None


def prometheus_config(
    targets: Mapping[str, str],
    alertmanager: str,
    rule_file: Path,
    timing: Timing,
    extra_scrape_configs: Sequence[Mapping[str, Any]] = (),
) -> dict[str, Any]:
    """One target per node, carrying ``__meta_kubernetes_pod_node_name`` like Kubernetes SD would."""
    return {
        "global": {
            "scrape_interval": duration(timing.scrape_interval),
            "evaluation_interval": duration(timing.evaluation_interval),
        },
        "rule_files": [str(rule_file)],
        "alerting": {
            "alertmanagers": [{"api_version": "v2", "static_configs": [{"targets": [alertmanager]}]}]
        },
        "scrape_configs": [
            {
                "job_name": "dcgm-exporter",
                "static_configs": [
                    {"targets": [address], "labels": {"__meta_kubernetes_pod_node_name": node}}
                    for node, address in targets.items()
                ],
                "relabel_configs": [
                    {"source_labels": ["__meta_kubernetes_pod_node_name"], "target_label": "node"}
                ],
            },
            *extra_scrape_configs,
        ],
    }


def alertmanager_config(webhook_url: str, credentials_file: Path, timing: Timing) -> dict[str, Any]:
    """The shipped configuration, pointed at ``webhook_url``, with test timings on pitcrew's route."""
    config: dict[str, Any] = yaml.safe_load(SHIPPED_ALERTMANAGER.read_text())
    for receiver in config["receivers"]:
        for integration in [key for key in receiver if key != "name" and receiver["name"] != "pitcrew"]:
            del receiver[integration]  # no notification leaves the machine
    receivers = {r["name"]: r for r in config["receivers"]}
    (webhook,) = receivers["pitcrew"]["webhook_configs"]
    webhook["url"] = webhook_url
    webhook["http_config"]["authorization"]["credentials_file"] = str(credentials_file)
    (route,) = [r for r in config["route"]["routes"] if r["receiver"] == "pitcrew"]
    route.update(
        group_wait=duration(timing.group_wait),
        group_interval=duration(timing.group_interval),
        repeat_interval=timing.repeat_interval,
    )
    return config


class Process:
    """A server subprocess with its log in a file, started and stopped exactly once."""

    def __init__(self, argv: Sequence[str], log: Path, ready_url: str) -> None:
        self.argv, self.log, self.ready_url = list(argv), log, ready_url
        self._proc: subprocess.Popen[bytes] | None = None

    def start(self, timeout: float = 30.0) -> None:
        with self.log.open("ab") as out:
            # Own session: a terminal's Ctrl-C reaches whoever started it, who stops it in order.
            self._proc = subprocess.Popen(
                self.argv, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
            )
        try:
            self.wait(self._ready, timeout=timeout, what=f"{self.argv[0]} to answer {self.ready_url}")
        except BaseException:
            self.stop()
            raise

    def wait(self, predicate: Callable[[], bool], *, timeout: float, what: str) -> None:
        """``wait_until``, with the end of this process's log in the failure message."""
        try:
            wait_until(predicate, timeout=timeout, interval=0.05, what=what)
        except DemoError as exc:
            raise DemoError(f"{exc}\n--- {self.log.name}:\n{self.tail()}") from None

    def _ready(self) -> bool:
        if self._proc is not None and self._proc.poll() is not None:
            raise DemoError(f"{self.argv[0]} exited with {self._proc.returncode}")
        try:
            with urllib.request.urlopen(self.ready_url, timeout=1) as response:
                return bool(response.status == 200)
        except OSError:
            return False

    def stop(self) -> None:
        if self._proc is not None:
            stop_process(self._proc)

    def tail(self) -> str:
        return tail(self.log)


class Prometheus(Process):
    def __init__(self, binary: str, workdir: Path, config: Mapping[str, Any], *, port: int = 0) -> None:
        self.port, self.workdir = port or free_port(), workdir
        self.url = f"http://127.0.0.1:{self.port}"
        self.config_file = workdir / "prometheus.yml"
        self.write_config(config)
        super().__init__(
            [
                binary,
                f"--config.file={self.config_file}",
                f"--storage.tsdb.path={workdir / 'tsdb'}",
                f"--web.listen-address=127.0.0.1:{self.port}",
                f"--web.external-url={self.url}",
                "--web.enable-lifecycle",
            ],
            workdir / "prometheus.log",
            f"{self.url}/-/ready",
        )

    def write_config(self, config: Mapping[str, Any]) -> None:
        self.config_file.write_text(yaml.safe_dump(dict(config), sort_keys=False))

    def reload(self, config: Mapping[str, Any] | None = None) -> None:
        if config is not None:
            self.write_config(config)
        request = urllib.request.Request(f"{self.url}/-/reload", method="POST")
        with urllib.request.urlopen(request, timeout=10) as response:
            response.read()

    def query(self, expr: str) -> list[dict[str, Any]]:
        reply = http_json(f"{self.url}/api/v1/query?{urllib.parse.urlencode({'query': expr})}")
        return list(reply["data"]["result"])

    def wait_targets_up(
        self, nodes: Sequence[str], *, job: str = "dcgm-exporter", timeout: float = 60.0
    ) -> None:
        """``/-/ready`` comes ~6 s before the first scrape (5 s service discovery tick): wait for up == 1."""

        def all_up() -> bool:
            up = {s["metric"].get("node"): s["value"][1] for s in self.query(f'up{{job="{job}"}}')}
            return all(up.get(node) == "1" for node in nodes)

        self.wait(all_up, timeout=timeout, what=f"up == 1 for {list(nodes)}")


class Alertmanager(Process):
    def __init__(self, binary: str, workdir: Path, config: Mapping[str, Any], *, port: int = 0) -> None:
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        workdir.mkdir(parents=True, exist_ok=True)
        config_file = workdir / "alertmanager.yml"
        config_file.write_text(yaml.safe_dump(dict(config), sort_keys=False))
        super().__init__(
            [
                binary,
                f"--config.file={config_file}",
                f"--storage.path={workdir / 'data'}",
                f"--web.listen-address=127.0.0.1:{self.port}",
                f"--web.external-url={self.url}",
                "--cluster.listen-address=",
            ],
            workdir / "alertmanager.log",
            f"{self.url}/-/ready",
        )

    def alerts(self, **filters: str) -> list[dict[str, Any]]:
        query = urllib.parse.urlencode([("filter", f'{k}="{v}"') for k, v in filters.items()])
        return list(http_json(f"{self.url}/api/v2/alerts?{query}"))
