"""Composition root: builds the store, the integrations, the engine and the web app from a Config.

The only module that knows which implementation sits behind each port.
"""

from __future__ import annotations

import json
import logging
import sys
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from aiohttp import web

from bot import __version__
from bot.config import Config, read_secret
from bot.domain.nodemap import slurm_nodes_for
from bot.engine.commands import Commands
from bot.engine.context import Ports, StepSettings
from bot.engine.deps import EngineDeps
from bot.engine.engine import Engine
from bot.engine.intake import Intake
from bot.engine.metrics import Metrics
from bot.engine.ports import MetricsQuery, Scheduler
from bot.engine.steps import REGISTRY
from bot.integrations.prometheus import PrometheusQuery
from bot.integrations.recording import RecordingWorld
from bot.integrations.recording_cluster import RecordingCluster, RecordingNotifier
from bot.integrations.slurm import build_scheduler
from bot.store.base import Store
from bot.store.sqlite import SqliteStore
from bot.web.app import Deps, create_app
from bot.web.auth import Credentials


def utcnow() -> datetime:
    return datetime.now(UTC)


def build_ports(config: Config) -> Ports:
    settings = config.settings
    journal = settings.integrations.recording_path or (settings.store.path.parent / "recorded-actions.jsonl")
    world = RecordingWorld.from_paths(
        journal,
        settings.integrations.recording_inventory,
        latency=settings.integrations.recording_latency.total_seconds(),
    )
    scheduler: Scheduler = world
    if settings.integrations.scheduler == "slurm":
        scheduler = build_scheduler(settings.slurm)
    cluster = RecordingCluster(world)
    query: MetricsQuery | None = None
    if settings.resumption.prometheus_url:
        query = PrometheusQuery(settings.resumption.prometheus_url)
    mapping = settings.slurm.mapping()

    async def slurm_names(node: str) -> Sequence[str]:
        if mapping.mode == "identity":
            return (node,)
        facts = await cluster.node(node)
        if facts is None:
            return ()
        pods = []
        if mapping.mode == "slinky":
            pods = await cluster.slurmd_pods(settings.slurm.slinky_namespace, mapping.slinky_selector)
        return slurm_nodes_for(facts, mapping, pods)

    return Ports(
        scheduler=scheduler,
        cluster=cluster,
        notifier=RecordingNotifier(world),
        query=query,
        slurm_names=slurm_names,
    )


def engine_deps(config: Config, store: Store, ports: Ports, metrics: Metrics) -> EngineDeps:
    """The slices of the configuration the engine and its steps read."""
    settings = config.settings
    return EngineDeps(
        store=store,
        ports=ports,
        metrics=metrics,
        clock=utcnow,
        policy=config.policy,
        playbooks=config.playbooks,
        settings=settings.engine,
        steps=StepSettings(
            poll_interval=settings.engine.poll_interval.total_seconds(),
            resumption=settings.resumption,
            slinky=settings.slurm.node_mapping == "slinky",
        ),
        registry=REGISTRY,
    )


def credentials(config: Config) -> tuple[Credentials, Credentials]:
    auth = config.settings.server.auth
    webhook = Credentials()
    if auth.bearer_token_file is not None:
        webhook = Credentials(bearer=read_secret(auth.bearer_token_file, "server.auth.bearer_token_file"))
    elif auth.basic_auth is not None:
        webhook = Credentials(
            basic_user=auth.basic_auth.username,
            basic_password=read_secret(auth.basic_auth.password_file, "server.auth.basic_auth.password_file"),
        )
    admin = Credentials()
    if auth.admin_token_file is not None:
        admin = Credentials(bearer=read_secret(auth.admin_token_file, "server.auth.admin_token_file"))
    return webhook, admin


def build_app(
    config: Config, *, ports: Ports | None = None, metrics: Metrics | None = None
) -> web.Application:
    metrics = metrics or Metrics(version=__version__)
    store = SqliteStore(config.settings.store.path, synchronous=config.settings.store.synchronous)
    ports = ports or build_ports(config)
    engine = Engine(engine_deps(config, store, ports, metrics))
    intake = Intake(store, config.catalog, config.labels, metrics, wake=engine.wake, signal=engine.signal)
    webhook, admin = credentials(config)
    deps = Deps(
        config=config,
        store=store,
        intake=intake,
        metrics=metrics,
        clock=utcnow,
        webhook_credentials=webhook,
        admin_credentials=admin,
        background=[engine],
        commands=Commands(engine, store, metrics, utcnow, config.settings.mode),
        ready_checks=[lambda: engine.running],
    )
    return create_app(deps)


class JsonFormatter(logging.Formatter):
    """One JSON object per line with the context fields passed in ``extra``; never payloads or tokens."""

    _standard = set(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {"message", "asctime"}

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        entry.update({k: v for k, v in vars(record).items() if k not in self._standard})
        if record.exc_info:
            entry["exc"] = self.formatException(record.exc_info)
        return json.dumps(entry, default=str)


def configure_logging(level: str, fmt: str) -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(
        JsonFormatter()
        if fmt == "json"
        else logging.Formatter("%(asctime)s %(levelname)s %(name)s %(message)s")
    )
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
    logging.getLogger("aiohttp.access").setLevel(logging.WARNING)
