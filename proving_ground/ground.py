"""The proving ground of one demo run: every far side started on free loopback ports, and stopped.

Owns the order of starting (Slurm, the dcgm-exporter stand-in and the training job's metrics,
Prometheus with pitcrew's rules, the cluster/notifier far side, pitcrew in front of it,
Alertmanager pointed at pitcrew), the replacement controller (a replaced node's successor
joins after ``replace_delay``: its slurmd registers again, its GPUs are healthy, the cluster
reports it Ready), and stopping everything in reverse with a check that no process of the run
survives. ``preflight`` names what is missing before anything starts.
"""

from __future__ import annotations

import json
import os
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import ExitStack, suppress
from pathlib import Path
from typing import Any

from proving_ground.assets import COLLECTORS_CSV, fast_rules
from proving_ground.assets import missing as missing_assets
from proving_ground.dcgm import Standin, load_collectors
from proving_ground.farside import FarSide
from proving_ground.pitcrew import Pitcrew
from proving_ground.postgres import PostgresServer, installed, running_postgres
from proving_ground.postgres import missing as no_postgres
from proving_ground.proc import DemoError, find_binary, hold_port, port_free
from proving_ground.prometheus import Alertmanager, Prometheus, Timing, alertmanager_config, prometheus_config
from proving_ground.scenarios import Scenario
from proving_ground.slurm import BINARIES, SlurmCluster
from proving_ground.slurm_root import chosen_version, root_missing
from proving_ground.train_job import METRIC, ProgressServer

#: Debian packages of every program the proving ground runs (binary → package).
PROGRAMS = {"prometheus": "prometheus", "prometheus-alertmanager": "prometheus-alertmanager", **BINARIES}
APT = "apt-get install -y --no-install-recommends"
TIMING = Timing(scrape_interval=1.0, evaluation_interval=1.0, group_wait=0.5, group_interval=1.0)


def preflight(
    ports: dict[str, int] | None = None,
    programs: dict[str, str] = PROGRAMS,
    *,
    slurm: str | None = None,
    store: str = "sqlite",
) -> list[str]:
    """Problems that would stop the demo, each with its fix; empty when it can start."""
    problems = []
    if store == "postgres" and installed() is None:
        problems.append(no_postgres())
    try:
        if (no_root := root_missing(chosen_version(slurm))) is not None:
            problems.append(no_root)
    except DemoError as exc:
        problems.append(str(exc))
    missing = {b: p for b, p in programs.items() if find_binary(b) is None}
    if missing:
        packages = " ".join(sorted(set(missing.values())))
        problems.append(f"missing programs: {', '.join(sorted(missing))}\n    install them: {APT} {packages}")
    if os.geteuid() != 0:
        problems.append("the demo runs slurmd, which needs root: run it as root (sudo scripts/demo)")
    for path in missing_assets():
        problems.append(f"missing {path}: run the demo from a pitcrew source checkout (make demo)")
    for what, port in (ports or {}).items():
        if port and not port_free(port):
            problems.append(f"port {port} ({what}) is taken by another program: choose another or stop it")
    return problems


def node_names(count: int) -> tuple[str, ...]:
    return tuple(f"gpu-{i:03d}" for i in range(1, count + 1))


class ProvingGround:
    """Everything one scenario runs against; ``start`` then ``stop`` (idempotent)."""

    def __init__(
        self,
        scenario: Scenario,
        workdir: Path,
        far_side: FarSide,
        *,
        replace_delay: float = 5.0,
        ports: dict[str, int] | None = None,
        slurm: str | None = None,
        store: str = "sqlite",
    ) -> None:
        self.scenario, self.workdir, self.far_side = scenario, workdir, far_side
        self.store = store  # "sqlite" (a file in the run directory) or "postgres" (a throwaway cluster)
        self.postgres: PostgresServer | None = None
        self._postgres = ExitStack()
        self.replace_delay = replace_delay
        self.ports = dict(ports or {})  # fixed by the user (0: a free one); preflight checked them
        self.nodes = node_names(scenario.nodes)
        self.slurm = SlurmCluster(workdir / "slurm", nodes=self.nodes, rest=False, version=slurm)
        self.standin: Standin | None = None
        self.progress: ProgressServer | None = None
        self.prometheus: Prometheus | None = None
        self.alertmanager: Alertmanager | None = None
        self.pitcrew: Pitcrew | None = None
        self.replaced: dict[str, float] = {}  # node -> Unix time its successor turned Ready
        self.successors: dict[str, str] = {}  # node -> the cluster node that replaced it
        self.reset: set[str] = set()  # nodes whose GPUs were reset or rebooted
        self.replace_errors: list[str] = []
        self._stop = threading.Event()
        self._replacer = threading.Thread(target=self._replace_loop, name="replacements", daemon=True)
        self._stopped = False
        self._am_port: socket.socket | None = None  # Alertmanager's port, held until it starts

    def _release_am_port(self) -> None:
        if self._am_port is not None:
            self._am_port.close()
            self._am_port = None

    # ------------------------------------------------------------------ lifecycle
    def steps(self) -> Iterator[str]:
        """Start the far sides one at a time, yielding what is about to start (for the timeline)."""
        yield (
            f"Slurm {self.slurm.version}: munge, slurmctld and {len(self.nodes)} slurmd "
            f"({self.nodes[0]}…{self.nodes[-1]})"
        )
        self.slurm.start()
        yield "dcgm-exporter stand-in, one listener per node"
        collectors, fields = load_collectors(COLLECTORS_CSV)
        self.standin = Standin(self.nodes, collectors=collectors, fields=fields).start()
        self.progress = ProgressServer(self.slurm.job_dir).start()
        yield "Prometheus with pitcrew's rules"
        prom_dir = self.workdir / "prometheus"
        prom_dir.mkdir(parents=True, exist_ok=True)
        rule_files = [prom_dir / "gpu-faults.rules.yml"]
        rule_files[0].write_text(fast_rules())
        if self.scenario.extra_rules:
            rule_files.append(prom_dir / "extra.rules.yml")
            rule_files[1].write_text(self.scenario.extra_rules)
        am_port = self.ports.get("alertmanager")
        if not am_port:  # named in Prometheus's configuration now, started last: held till then
            self._am_port = hold_port()
            am_port = int(self._am_port.getsockname()[1])
        targets = {node: self.standin.address(node) for node in self.nodes}
        train = {
            "job_name": "train",
            "static_configs": [{"targets": [self.progress.url.split("/")[2]]}],
        }
        config = prometheus_config(targets, f"127.0.0.1:{am_port}", rule_files[0], TIMING, [train])
        config["rule_files"] = [str(p) for p in rule_files]
        self.prometheus = Prometheus(
            _binary("prometheus"), prom_dir, config, port=self.ports.get("prometheus", 0)
        )
        self.prometheus.start()
        if self.store == "postgres":
            yield "PostgreSQL for pitcrew's store: a throwaway cluster on a loopback port"
            self.postgres = self._postgres.enter_context(running_postgres())
        yield f"pitcrew (mode {self.scenario.mode}) in front of the {self.far_side.description}"
        self.far_side.start(self.workdir, self.nodes)
        self.pitcrew = self.far_side.pitcrew(
            self.workdir / "pitcrew", self._pitcrew_config(), os.environ, self.ports.get("pitcrew", 0)
        )
        self.pitcrew.start(timeout=30)
        # Before Alertmanager: until Prometheus has scraped every node, the exporter rules see nodes
        # without an exporter (on a busy machine for 20 s and more, past their 10 s ``for``), and
        # routed, those startup alerts opened exporter-down incidents in the channel before any
        # fault. Started after, Alertmanager hears of them only resolved, and notifies nothing.
        yield "Prometheus scraping every node (its first scrape comes a few seconds after start)"
        self.prometheus.wait_targets_up(self.nodes, timeout=60)
        prometheus = self.prometheus
        prometheus.wait(
            lambda: not prometheus.query('ALERTS{alertstate="firing", fault="exporter-down"}'),
            timeout=30,
            what="the exporter rules to see every node's exporter",
        )
        yield "Alertmanager with pitcrew's route"
        am_config = alertmanager_config(
            f"{self.pitcrew.url}/api/v1/alerts", self.pitcrew.workdir / "webhook.token", TIMING
        )
        self.alertmanager = Alertmanager(
            _binary("prometheus-alertmanager"), self.workdir / "alertmanager", am_config, port=am_port
        )
        self._release_am_port()
        self.alertmanager.start()
        self._replacer.start()

    def _pitcrew_config(self) -> dict[str, Any]:
        assert self.prometheus is not None
        config: dict[str, Any] = {
            "mode": self.scenario.mode,
            **self.slurm.pitcrew_settings("scontrol", command_timeout=10),
            "resumption": {
                "prometheus_url": self.prometheus.url,
                "progress_query": f'max({METRIC}{{job_id="{{job_id}}"}})',
            },
            "log": {"level": "INFO", "format": "json"},
        }
        if self.postgres is not None:
            password = self.postgres.password_file(self.workdir / "postgres-password")
            config["store"] = {
                "url": self.postgres.url(self.postgres.create_database()),
                "password_file": str(password),
            }
        _merge(config, self.scenario.config)
        return config

    def stop(self) -> str:
        """Stop everything that started, newest first; what survived (and was killed), or ""."""
        if self._stopped:
            return ""
        self._stopped = True
        self._release_am_port()
        self._stop.set()
        if self._replacer.is_alive():
            self._replacer.join(timeout=30)
        for server in (
            self.alertmanager,
            self.pitcrew,
            self.far_side,
            self.prometheus,
            self.progress,
            self.standin,
        ):
            if server is not None:
                with suppress(Exception):  # one that will not stop must not keep the others running
                    server.stop()
        with suppress(Exception):  # after pitcrew: its store goes last
            self._postgres.close()
        try:
            self.slurm.stop()
        except DemoError as exc:
            return str(exc)
        return ""

    # ------------------------------------------------------------------ replacement controller
    def _replace_loop(self) -> None:
        """A replaced node's successor joins ``replace_delay`` after pitcrew asked for it (the
        Slurm node it carries registers again, then the cluster reports it Ready); a GPU reset or
        reboot brings the node's GPUs back healthy at once, and a reboot starts the node's slurmd
        again (a new ``SlurmdStartTime``, which ``wait_ready`` waits for)."""
        asked: dict[str, float] = {}
        rebooted = 0  # reboots whose slurmd restart is done
        while not self._stop.wait(0.2):
            try:
                for node in self.far_side.reboots()[rebooted:]:
                    self.slurm.restart_slurmd(node)  # the boot starts the machine's slurmd again
                    rebooted += 1
                for node in self.far_side.resets():
                    if node not in self.reset and self.standin is not None:
                        self.standin.node(node).clear()  # a reset GPU: its XID and counters start afresh
                        self.reset.add(node)
                for node in self.far_side.replacements():
                    asked.setdefault(node, time.monotonic())
                for node, when in list(asked.items()):
                    if node in self.replaced or time.monotonic() - when < self.replace_delay:
                        continue
                    self.slurm.restart_slurmd(node)  # the new machine's slurmd registers under the name
                    if self.standin is not None:
                        self.standin.node(node).clear()  # fresh GPUs, exporter counters from zero
                    self.successors[node] = self.far_side.node_ready(node)
                    self.replaced[node] = time.time()
            except Exception as exc:  # shown in the summary; the run's own waits then time out
                self.replace_errors.append(f"{type(exc).__name__}: {exc}")
                return

    # ------------------------------------------------------------------ what a user looks at
    def urls(self) -> dict[str, str]:
        found = {}
        if self.prometheus is not None:
            found["prometheus"] = self.prometheus.url
        if self.alertmanager is not None:
            found["alertmanager"] = self.alertmanager.url
        if self.pitcrew is not None:
            found["pitcrew"] = self.pitcrew.url
        return found

    def write_state(self, path: Path, **extra: Any) -> None:
        """Where the run's pieces are, for ``scripts/demo --stop`` and for scripts (JSON)."""
        state = {
            "pid": os.getpid(),
            "workdir": str(self.workdir),
            "urls": self.urls(),
            "slurm_conf": str(self.slurm.conf),
            "pitcrew_config": str(self.pitcrew.config_path) if self.pitcrew else None,
            "read_token_file": str(self.pitcrew.workdir / "read.token") if self.pitcrew else None,
            **extra,
        }
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(state, indent=2) + "\n")
        tmp.replace(path)


def _binary(name: str) -> str:
    path = find_binary(name)
    if path is None:
        raise DemoError(f"{name} not found: {APT} {PROGRAMS[name]}")
    return path


def _merge(into: dict[str, Any], extra: dict[str, Any]) -> None:
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(into.get(key), dict):
            _merge(into[key], value)
        else:
            into[key] = value
