"""Composition root: builds the store, the integrations, the engine and the web app from a Config.

The only module that knows which implementation sits behind each port. It never builds a
port that ``bot.safety`` would refuse, and it refuses injected simulators (``tests/simulator``)
unless the caller says it is a test (``allow_simulated``).
"""

from __future__ import annotations

import gc
import json
import logging
import sys
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from aiohttp import web

from bot import __version__, logger
from bot.config import Config, ConfigError, Settings, read_secret
from bot.domain.nodemap import slurm_nodes_for
from bot.engine import metrics as engine_metrics
from bot.engine.backoff import Backoff
from bot.engine.commands import Commands
from bot.engine.context import Ports, SlurmNames, StepSettings
from bot.engine.deps import EngineDeps
from bot.engine.engine import Engine
from bot.engine.intake import Intake
from bot.engine.leadership import Leadership
from bot.engine.metrics import Metrics
from bot.engine.outbox import OutboxNotifier, OutboxSender
from bot.engine.ports import Cluster, Destination, MetricsQuery, Scheduler
from bot.engine.retention import Retention
from bot.engine.steps import REGISTRY
from bot.integrations.grafana import EVENTS as GRAFANA_EVENTS
from bot.integrations.grafana import NAME as GRAFANA_NAME
from bot.integrations.grafana import GrafanaAnnotations, GrafanaDestination
from bot.integrations.journal import DryRunJournal, LogNotifier
from bot.integrations.prometheus import PrometheusQuery
from bot.integrations.slack import EVENTS as SLACK_EVENTS
from bot.integrations.slack import Slack, build_slack, slack_probe
from bot.integrations.slurm import RestScheduler, ScontrolScheduler, build_scheduler
from bot.safety import port_problems
from bot.store.base import Store
from bot.store.factory import AnyStore, build_store
from bot.store.lease import Fence, holder_id
from bot.web.app import DEPS, GATE, Background, Deps, create_app
from bot.web.auth import Credentials
from bot.web.limits import quiet
from bot.web.serve import run

if TYPE_CHECKING:
    from bot.integrations.kubernetes import KubernetesCluster

log = logger(__name__)

#: How long in-flight requests get to finish once the service stops (aiohttp's graceful shutdown);
#: the Deployment's terminationGracePeriodSeconds leaves room for it after server.shutdown_delay.
SHUTDOWN_TIMEOUT = 10.0


def utcnow() -> datetime:
    return datetime.now(UTC)


def journal_path(settings: Settings) -> Path:
    """Where the dry-run journal is: ``integrations.journal_path``, else next to the store."""
    return settings.integrations.journal_path or settings.store.path.parent / "dry-run-journal.jsonl"


def build_ports(config: Config, fence: Fence | None = None) -> Ports:
    """The configured far sides: Slurm or the journal; Kubernetes, no cluster or the journal; notices
    to the log. With ``fence`` (``build_app``'s), the Slurm REST and Kubernetes clients ask it last
    before each request that changes their far side (``bot.integrations.fenced``)."""
    settings = config.settings
    journal = DryRunJournal(journal_path(settings))
    scheduler: Scheduler = journal
    if settings.integrations.scheduler == "slurm":
        scheduler = build_scheduler(settings.slurm, fence)
    # Slurm-only sites have no cluster: the engine skips the Kubernetes steps and hands repairs to humans.
    cluster: Cluster | None = None if settings.integrations.cluster == "none" else journal
    if settings.integrations.cluster == "kubernetes":
        # Imported here, not at the top: the Kubernetes client costs every start ~0.2 s of CPU, and
        # Slurm-only sites (``cluster: none``) never use it (tests/unit/test_lazy_kubernetes.py).
        from bot.integrations.kubernetes import KubernetesCluster

        cluster = KubernetesCluster(settings.kubernetes, fence=fence)
    return Ports(
        scheduler=scheduler,
        cluster=cluster,
        notifier=LogNotifier(journal),
        query=metrics_query(settings),
        slurm_names=slurm_names_for(settings, cluster),
    )


def metrics_query(settings: Settings) -> MetricsQuery | None:
    url = settings.resumption.prometheus_url
    return PrometheusQuery(url) if url else None


def annotator(settings: Settings, fence: Fence | None = None) -> GrafanaAnnotations | None:
    """Grafana's region annotations, where a token is set, at ``grafana.api_url`` or ``grafana.url``
    (the outbox delivers them; its adapter is fenced)."""
    grafana = settings.grafana
    if grafana.api is None or grafana.token_file is None:
        return None
    return GrafanaAnnotations(
        grafana.api,
        grafana.token_file,
        timeout=grafana.timeout.total_seconds(),
        dashboard_uid=grafana.incidents_dashboard_uid,
        fence=fence,
    )


def outbox_far_sides(config: Config) -> list[tuple[str, object]]:
    """The far sides behind the outbox rather than an engine port (Slack's notices, Grafana's
    annotations), by role, as ``pitcrew serve`` would build them: what ``check-config --live``
    probes besides the ports."""
    settings = config.settings
    sides: list[tuple[str, object]] = []
    if settings.integrations.notifier == "slack":
        sides.append(("notices", slack_probe(settings.slack)))
    grafana = annotator(settings)
    if grafana is not None:
        sides.append(("annotations", grafana))
    return sides


def slurm_names_for(settings: Settings, cluster: Cluster | None) -> SlurmNames:
    """How a node of an incident names its Slurm node(s), by ``slurm.node_mapping``."""
    mapping = settings.slurm.mapping()

    async def slurm_names(node: str) -> Sequence[str]:
        if mapping.mode == "identity" or cluster is None:  # bot.safety refuses other mappings without one
            return (node,)
        facts = await cluster.node(node)
        if facts is None:
            return ()
        pods = []
        if mapping.mode == "slinky":
            pods = await cluster.slurmd_pods(settings.slurm.slinky_namespace, mapping.slinky_selector)
        return slurm_nodes_for(facts, mapping, pods)

    return slurm_names


def _roles(ports: Ports) -> tuple[tuple[str, object], ...]:
    return (("scheduler", ports.scheduler), ("cluster", ports.cluster), ("notifier", ports.notifier))


def engine_deps(
    config: Config, store: Store, ports: Ports, metrics: Metrics, fence: Fence | None = None
) -> EngineDeps:
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
            node_mapping=settings.slurm.node_mapping,
            goodput=settings.goodput,
            capacity=settings.capacity,
            lemon=settings.lemon,
        ),
        registry=REGISTRY,
        fence=fence,
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


def read_credentials(config: Config) -> Credentials:
    """The read API's own token (the admin token reads too: ``bot.web.reads``)."""
    token_file = config.settings.server.auth.read_token_file
    if token_file is None:
        return Credentials()
    return Credentials(bearer=read_secret(token_file, "server.auth.read_token_file"))


def _kubernetes(cluster: Cluster | None) -> KubernetesCluster | None:
    """The cluster port if it is the Kubernetes adapter. Only the adapter's own module makes one, so
    without that module loaded (a Slurm-only site) there is none, and nothing is imported to ask."""
    adapter = sys.modules.get("bot.integrations.kubernetes")
    if adapter is not None and isinstance(cluster, adapter.KubernetesCluster):
        return cast("KubernetesCluster", cluster)
    return None


class _ClosePorts:
    """Builds the Kubernetes client at start (so no incident waits for it) and closes the far
    sides' connections (Kubernetes, slurmrestd) once the engine has stopped using them."""

    def __init__(self, ports: Ports) -> None:
        self._cluster = _kubernetes(ports.cluster)
        self._scheduler = ports.scheduler

    async def start(self) -> None:
        if self._cluster is not None:
            await self._cluster.warm()

    async def stop(self) -> None:
        try:
            if isinstance(self._scheduler, (RestScheduler, ScontrolScheduler)):
                await self._scheduler.aclose()
        finally:
            if self._cluster is not None:
                await self._cluster.aclose()


def build_app(
    config: Config,
    *,
    ports: Ports | None = None,
    allow_simulated: bool = False,
    metrics: Metrics | None = None,
) -> web.Application:
    """The service. Without ``ports``, the configured ones, after ``bot.safety`` has had its say.

    Raises ``ConfigError`` for a configuration ``port_problems`` refuses, or for injected ports
    that are simulators when ``allow_simulated`` is not set: a simulator models a far side that
    is not there, and must never stand in for one outside a test.
    """
    # Who this process leads as, once it holds the store's lease (``Leadership`` grants it).
    fence = Fence(holder_id())
    if ports is None:
        problems = port_problems(config)
        if problems:
            raise ConfigError("\n".join(problems))
        ports = build_ports(config, fence)
    elif not allow_simulated:
        simulated = [role for role, port in _roles(ports) if getattr(port, "far_side", None) == "simulator"]
        if simulated:
            raise ConfigError(
                f"ports: simulated {', '.join(simulated)} (tests/simulator) given to build_app; a "
                "simulator is never a real far side, and only tests may pass allow_simulated=True"
            )
    metrics = metrics or Metrics(version=__version__)
    metrics.declare_pools(pool.name for pool in config.settings.capacity.pools)
    store = build_store(config.settings.store)
    metrics.watch_store(store.describe)
    # One actor per store: every process takes webhooks and commands into ``store``; only the one
    # holding the lease runs the engine and the outbox senders, whose every write goes through
    # ``fenced`` and fails once another process has taken the lease over.
    fenced = store.fenced(fence)
    slack = _slack(config, store, metrics, fence)
    destinations: list[Destination] = [slack.destination] if slack else []
    sender = OutboxSender(
        fenced,
        destinations,
        metrics,
        utcnow,
        backoff=Backoff(
            config.settings.engine.retry_backoff.total_seconds(),
            config.settings.slack.retry_backoff_max.total_seconds(),
        ),
        system="notifier",
    )
    if slack is not None:  # step outcomes and decisions reach the thread as soon as they commit
        store.route_events(SLACK_EVENTS, slack.destination.name, wake=sender.wake)
    # Every notice goes to the log (the port given) and the timeline, and through the outbox to
    # each destination: posting never waits for Slack.
    ports = replace(
        ports,
        notifier=OutboxNotifier(
            fenced, utcnow, ports.notifier, [d.name for d in destinations], wake=sender.wake
        ),
    )
    # Grafana's annotations have their own sender: a Grafana that times out delays neither
    # remediation nor Slack.
    annotations = _grafana(config, store, fenced, fence, metrics)
    engine = Engine(
        engine_deps(config, fenced, ports, metrics, fence),
        leading=lambda: fence.leading,
        catalog=config.catalog,
    )
    intake = Intake(
        store, config.catalog, config.labels, metrics, opened=engine.opened, look_again=engine.look_again
    )
    lease = config.settings.store.lease
    leader_only: list[Background] = [engine, sender]
    if annotations is not None:
        leader_only.append(annotations.sender)
    if config.settings.store.retention is not None:
        leader_only.append(
            Retention(
                fenced,
                metrics,
                utcnow,
                keep=config.settings.store.retention,
                every=config.settings.store.prune_every,
            )
        )
    leadership = Leadership(
        store, fence, leader_only, metrics, ttl=lease.ttl, renew_every=lease.renew_interval
    )
    webhook, admin = credentials(config)
    commands = Commands(
        engine,
        store,
        metrics,
        utcnow,
        config.settings.mode,
        vouch=slack.approvers.vouch if slack else None,
        leadership=leadership.describe,
    )
    # Stopped in reverse: Slack's socket, then the leader's work (the engine and the senders; the
    # lease released), then the Grafana client, the outbox's Slack session, and the Slurm and
    # Kubernetes clients.
    background: list[Background] = [_ClosePorts(ports)]
    if slack is not None:
        background.append(_Closing(slack.aclose))
    if annotations is not None:
        background.append(_Closing(annotations.adapter.aclose))
    background.append(leadership)
    inbound = slack.inbound(commands, store, utcnow) if slack else None
    # Shown, not gating: how an acknowledged write is kept (``/readyz`` of each replica).
    detail: dict[str, Callable[[], dict[str, Any]]] = {"store": store.describe}
    if slack is not None and inbound is not None:
        socket = slack.socket_mode(inbound, metrics.registry)
        if socket is not None:
            background.append(socket)
            detail["slack_socket"] = socket.describe  # shown, not gating: remediation needs no Slack
    deps = Deps(
        config=config,
        store=store,
        intake=intake,
        metrics=metrics,
        clock=utcnow,
        webhook_credentials=webhook,
        admin_credentials=admin,
        read_credentials=read_credentials(config),
        background=background,
        commands=commands,
        ready_checks=[lambda: leadership.running],
        leadership=leadership.describe,
        ready_detail=detail,
    )
    app = create_app(deps)
    if inbound is not None and config.settings.slack.transport == "http":
        app.router.add_post("/slack/events", inbound.handle_http)
    return app


class _Closing:
    """A background worker that only closes something at shutdown (after the workers started
    after it have stopped): the outbox's Slack session, Grafana's."""

    def __init__(self, close: Callable[[], Awaitable[None]]) -> None:
        self._close = close

    async def start(self) -> None:
        pass

    async def stop(self) -> None:
        await self._close()


@dataclass(frozen=True, slots=True)
class Annotations:
    """Grafana's annotations: the sender (leader-only: ``Leadership`` runs it) and the adapter,
    whose HTTP session is closed at shutdown, after the sender stopped (``_Closing``)."""

    sender: OutboxSender
    adapter: GrafanaAnnotations


def _grafana(
    config: Config, store: AnyStore, fenced: Store, fence: Fence, metrics: Metrics
) -> Annotations | None:
    """Incident annotations when Grafana has a token (``annotator``): the incidents' state events
    routed to Grafana's outbox, delivered by a sender of their own."""
    adapter = annotator(config.settings, fence)
    if adapter is None:
        return None
    sender = OutboxSender(
        fenced,
        [GrafanaDestination(adapter, fenced, utcnow)],
        metrics,
        utcnow,
        backoff=Backoff(
            config.settings.engine.retry_backoff.total_seconds(),
            config.settings.grafana.retry_backoff_max.total_seconds(),
        ),
        system="grafana",
    )
    store.route_events(GRAFANA_EVENTS, GRAFANA_NAME, wake=sender.wake)
    return Annotations(sender, adapter)


def _slack(config: Config, store: AnyStore, metrics: Metrics, fence: Fence) -> Slack | None:
    """Slack's pieces when ``integrations.notifier: slack`` (``build_app`` routes its events); each
    incident's thread permalink goes to its ``pitcrew_incident_info`` series (the Grafana table);
    the outbox's posts are fenced (``FencedWebClient``)."""
    if config.settings.integrations.notifier != "slack":
        return None
    settings = config.settings
    return build_slack(
        settings.slack,
        config.policy,
        store,
        utcnow,
        settings.grafana,
        on_thread=metrics.incidents.link,
        fence=fence,
    )


def serve(config: Config, *, ports: Ports | None = None, allow_simulated: bool = False) -> None:
    """Run the service until SIGINT/SIGTERM: logging, metrics, GIL switch interval, graceful shutdown."""
    configure_logging(config.settings.log.level, config.settings.log.format)
    engine_metrics.start_up()
    # The store's threads (SQLite's writer for the engine's writes, its readers, Postgres's writes)
    # take the GIL back after every database call; with the default 5 ms switch interval a busy
    # event loop makes them wait that long each time, and whatever waits for their commit with
    # them. At 0.2 ms, against 0.5, SQLite's saturated p99 went from 24-30 to 18-27 ms with the
    # same throughput (bench/ingest.py, alternating runs).
    sys.setswitchinterval(0.0002)
    server = config.settings.server
    app = build_app(config, ports=ports, allow_simulated=allow_simulated)
    gate = app[GATE]
    if gate.cap < server.max_connections:
        log.warning(
            "server.max_connections lowered to what the open-files limit leaves",
            extra={"max_connections": server.max_connections, "cap": gate.cap},
        )
    quiet()  # a connection flood's accept errors: one line per ten seconds, not thousands
    # Everything loaded so far (modules, configuration, the app) lives as long as the process: out
    # of the collector's sight, a full collection walks only what serving made. It stopped the
    # event loop 80-100 ms each time before, 20 ms after (bench/ingest.py, gc.callbacks).
    gc.collect()
    gc.freeze()
    run(
        app,
        server.host,
        server.port,
        gate,
        shutdown_timeout=SHUTDOWN_TIMEOUT,
        delay=server.shutdown_delay.total_seconds(),
        stopping=app[DEPS].stop_soon,
    )
    failure = app[DEPS].failure
    if failure is not None:
        raise failure


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
