"""Proving-ground entry point (tests and ``scripts/demo``): pitcrew's service in front of the simulated far side.

    python -m tests.simulator.serve --config pitcrew.yaml --world world.yaml

``world.yaml`` says where the simulator keeps its journal (``journal``, required), which
nodes, pods and Slurm jobs it starts from (``inventory``, a YAML file, optional) and the
round trip it adds to every call (``latency``, a duration, default ``0s``). The pitcrew
configuration is loaded as ``pitcrew serve`` loads it; where it names a real system that
stays real (``integrations.scheduler: slurm`` keeps the real Slurm, ``integrations.cluster:
none`` keeps no cluster), everything else is simulated. The service then runs exactly as
``pitcrew serve`` runs it (``bot.runtime.serve``), with ``allow_simulated=True``.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import yaml

from bot.config import Config, ConfigError, load_config
from bot.domain.durations import parse_duration
from bot.engine.context import Ports
from bot.engine.ports import Cluster, Scheduler
from bot.integrations.slurm import build_scheduler
from bot.runtime import metrics_query, serve, slurm_names_for
from tests.simulator.cluster import SimulatedCluster, SimulatedNotifier
from tests.simulator.world import SimulatedWorld

_KEYS = frozenset({"journal", "inventory", "latency", "replace_seconds"})


@dataclass(frozen=True, slots=True)
class WorldFile:
    journal: Path
    inventory: Path | None = None
    latency: float = 0.0
    #: Seconds a replaced node stays NotReady: a node track that takes that long.
    replace_seconds: float = 0.0


def load_world(path: Path) -> WorldFile:
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except (OSError, yaml.YAMLError) as exc:
        raise ConfigError(f"world file {path}: {exc}") from None
    unknown = set(data) - _KEYS
    if unknown or "journal" not in data:
        raise ConfigError(
            f"world file {path}: needs journal, may have inventory, latency, replace_seconds; got {sorted(data)}"
        )
    try:
        latency = parse_duration(data.get("latency", 0)).total_seconds()
        replace_seconds = parse_duration(data.get("replace_seconds", 0)).total_seconds()
    except ValueError as exc:
        raise ConfigError(f"world file {path}: {exc}") from None
    inventory = data.get("inventory")
    return WorldFile(Path(data["journal"]), Path(inventory) if inventory else None, latency, replace_seconds)


def simulated_ports(config: Config, world_file: WorldFile) -> Ports:
    settings = config.settings
    world = SimulatedWorld.from_paths(
        world_file.journal,
        world_file.inventory,
        latency=world_file.latency,
        replace_seconds=world_file.replace_seconds,
    )
    scheduler: Scheduler = world
    if settings.integrations.scheduler == "slurm":
        scheduler = build_scheduler(settings.slurm)
    cluster: Cluster | None = None if settings.integrations.cluster == "none" else SimulatedCluster(world)
    return Ports(
        scheduler=scheduler,
        cluster=cluster,
        notifier=SimulatedNotifier(world),
        query=metrics_query(settings),
        slurm_names=slurm_names_for(settings, cluster),
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tests.simulator.serve",
        description="pitcrew in front of the simulated far side (tests and the demo only)",
    )
    parser.add_argument("--config", "-c", required=True, help="pitcrew YAML configuration")
    parser.add_argument("--world", "-w", required=True, help="the simulator's world file")
    args = parser.parse_args(argv)
    try:
        config = load_config(Path(args.config))
        ports = simulated_ports(config, load_world(Path(args.world)))
    except ConfigError as exc:
        print(f"simulated pitcrew: invalid configuration:\n{exc}", file=sys.stderr)
        return 1
    serve(config, ports=ports, allow_simulated=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
