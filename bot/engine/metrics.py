"""pitcrew's own Prometheus metrics, all prefixed ``pitcrew_``, all labels bounded.

Metrics are created on an injected ``CollectorRegistry`` (a fresh one per test), never on
the global default, so two apps in one process do not collide. Label values that are known
up front (playbooks, fault classes, outcomes) are pre-initialised, so a panel sees 0, not
"no data"; the ``reason`` of ``pitcrew_integration_errors_total`` is ``bot.engine.errors.Reason``,
a closed set, made in full for every system. The only per-incident series
(``pitcrew_incident_info``) lives in ``IncidentSeries``: one series per *active* incident,
removed when it closes; the only per-node one, ``pitcrew_lemon_nodes_total``, gets a series per
node found a lemon (bounded by the fleet). Both name nodes: ``/metrics`` serves them only to a
scrape with the read token.

No ``_created`` series: in Prometheus's text format each counter, histogram and summary would
export a second, timestamp-valued gauge per label set, which Prometheus stores as a series of
its own; pitcrew's pre-initialised labels would double what every scrape stores for nothing.
The switch is process-wide, so the service throws it at start-up (``start_up``), not this import.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import get_args

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, Info, disable_created_metrics

from bot.domain.catalog import HANDS_OFF, SEVERITY, FaultClass
from bot.domain.incident import TERMINAL
from bot.engine.errors import Reason
from bot.store.base import IncidentRecord, ReplicationMode
from bot.store.retention import TABLES as PRUNED_TABLES

_LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)
_STEP_BUCKETS = (0.01, 0.05, 0.1, 0.5, 1, 5, 15, 30, 60, 120, 300, 600, 1800, 3600)
_RECOVERY_BUCKETS = (1, 5, 10, 30, 60, 120, 300, 600, 1200, 1800, 3600, 7200, 14400)
_APPROVAL_BUCKETS = (5, 15, 30, 60, 120, 300, 600, 1200, 1800, 3600, 7200)

#: Label values known before anything happens (custom playbooks join as they are used).
PLAYBOOKS: tuple[str, ...] = SEVERITY
#: Playbooks that take a node out of service: the only ones GPU-hours and trust are counted for.
ACTING: tuple[str, ...] = tuple(p for p in SEVERITY if p not in HANDS_OFF)
FAULT_CLASSES: tuple[str, ...] = (*get_args(FaultClass), "unknown")
#: The far sides an integration error can come from (a step's port, or a delivery).
SYSTEMS: tuple[str, ...] = ("scheduler", "cluster", "notifier", "grafana", "other")
#: What humans did about a remediation that pitcrew's trust ledger counts against it.
OVERRIDES: tuple[str, ...] = ("rolled_back", "rejected")
#: How a remediated node fared afterwards.
RETESTS: tuple[str, ...] = ("passed", "repeat", "climbed")


class Metrics:
    def __init__(self, registry: CollectorRegistry | None = None, version: str = "") -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.build = Info("pitcrew_build", "pitcrew version.", registry=r)
        self.build.info({"version": version})
        self.webhook_requests = Counter(
            "pitcrew_webhook_requests", "Webhook deliveries by HTTP status code.", ["code"], registry=r
        )
        self.webhook_duration = Histogram(
            "pitcrew_webhook_duration_seconds",
            "Time from request to response on /api/v1/alerts.",
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.alerts_received = Counter(
            "pitcrew_alerts_received",
            "Alerts received, by what pitcrew made of them.",
            ["outcome"],
            registry=r,
        )
        self.incidents_opened = Counter("pitcrew_incidents_opened", "Incidents opened.", registry=r)
        self.incidents_active = Gauge(
            "pitcrew_incidents_active", "Incidents not yet terminal, by state.", ["state"], registry=r
        )
        self.oldest_active = Gauge(
            "pitcrew_incident_oldest_active_seconds", "Age of the oldest non-terminal incident.", registry=r
        )
        self.incidents_closed = Counter(
            "pitcrew_incidents_closed",
            "Incidents that reached a terminal state.",
            ["state", "playbook"],
            registry=r,
        )
        self.steps = Counter(
            "pitcrew_steps",
            "Step outcomes (ok, failed, retried, skipped, escalated).",
            ["step", "outcome"],
            registry=r,
        )
        self.step_duration = Histogram(
            "pitcrew_step_duration_seconds",
            "Wall time of a step, all attempts.",
            ["step"],
            buckets=_STEP_BUCKETS,
            registry=r,
        )
        self.actions = Counter(
            "pitcrew_actions",
            "Changes pitcrew made to a far side (DOWN, cordon, evict, replace, ...).",
            ["action"],
            registry=r,
        )
        self.guard_blocks = Counter(
            "pitcrew_guard_blocks", "Plans stopped by a guard.", ["guard"], registry=r
        )
        self.approvals = Counter("pitcrew_approvals", "Approval decisions.", ["outcome"], registry=r)
        self.breaker_open = Gauge("pitcrew_breaker_open", "1 while the circuit breaker is open.", registry=r)
        self.paused = Gauge("pitcrew_paused", "1 while pitcrew is paused.", registry=r)
        self.leader = Gauge(
            "pitcrew_leader",
            "1 while this process holds the store's lease and acts; 0 on a standby.",
            registry=r,
        )
        self.store_replication = Gauge(
            "pitcrew_store_replication",
            "1 for how the Postgres store's commits reach its standbys, as the last readiness probe "
            "saw it (none: no standby streams; synchronous; asynchronous: a failover may lose what "
            "was acknowledged); 0 for the other modes, and for all of them on SQLite.",
            ["mode"],
            registry=r,
        )
        self.leader_epoch = Gauge(
            "pitcrew_leader_epoch", "The lease epoch (fencing token) this process last led with.", registry=r
        )
        self.capacity_lent = Gauge(
            "pitcrew_capacity_lent_nodes",
            "Nodes incidents took from a capacity pool for a stalled job and have not given back "
            "(an ended incident's too), by pool.",
            ["pool"],
            registry=r,
        )
        self.capacity_away = Histogram(
            "pitcrew_capacity_away_seconds",
            "How long a node taken from a capacity pool was away before the pool was whole again, by pool.",
            ["pool"],
            buckets=_RECOVERY_BUCKETS,
            registry=r,
        )
        self.capacity_idle = Gauge(
            "pitcrew_capacity_idle_nodes",
            "Idle members of a capacity pool (spares kept, lendable nodes), as last read (every "
            "capacity.read_every, and by a take), by pool.",
            ["pool"],
            registry=r,
        )
        self.capacity_idle_gpus = Gauge(
            "pitcrew_capacity_idle_gpus",
            "GPUs on the idle members of a capacity pool, as last read (every capacity.read_every, and by "
            "a take), by pool.",
            ["pool"],
            registry=r,
        )
        self.capacity_idle_gpu_hours = Counter(
            "pitcrew_capacity_idle_gpu_hours",
            "Spare GPU-hours held idle: the GPUs of a capacity pool's idle members at each read of the "
            "pools (capacity.read_every) times the time to the next read, by pool; against "
            "pitcrew_capacity_job_gpu_hours_saved, the cost side of keeping the pool.",
            ["pool"],
            registry=r,
        )
        self.capacity_saved = Counter(
            "pitcrew_capacity_job_gpu_hours_saved",
            "Job GPU-hours a taken node saved: the interrupted jobs' GPUs times the time from the node "
            "joining their partition to the repaired node being Ready, by pool.",
            ["pool"],
            registry=r,
        )
        self.time_to_job_running = Histogram(
            "pitcrew_time_to_job_running_seconds",
            "From the first delivery of the alert to every interrupted Slurm job running again (the job track), by playbook.",
            ["playbook"],
            buckets=_RECOVERY_BUCKETS,
            registry=r,
        )
        self.time_to_node_back = Histogram(
            "pitcrew_time_to_node_back_seconds",
            "From the first delivery of the alert to the node back in service (the node track), by playbook.",
            ["playbook"],
            buckets=_RECOVERY_BUCKETS,
            registry=r,
        )
        self.time_to_recovery = Histogram(
            "pitcrew_time_to_recovery_seconds",
            "From the first delivery of the alert to resolved, by playbook.",
            ["playbook"],
            buckets=_RECOVERY_BUCKETS,
            registry=r,
        )
        self.notices = Counter(
            "pitcrew_notices",
            "Notices handed to a destination (Slack, ...) by the outbox: delivered, retried, failed.",
            ["destination", "outcome"],
            registry=r,
        )
        self.store_pruned = Counter(
            "pitcrew_store_pruned_rows",
            "Rows retention removed from the store (store.retention), by table.",
            ["table"],
            registry=r,
        )
        for table in PRUNED_TABLES:
            self.store_pruned.labels(table)
        self.outbox_pending = Gauge(
            "pitcrew_outbox_pending",
            "Notices not yet delivered, by destination.",
            ["destination"],
            registry=r,
        )
        self.time_to_out_of_service = Histogram(
            "pitcrew_time_to_out_of_service_seconds",
            "From the first delivery of the alert to the node out of service (Slurm DOWN/DRAIN), by playbook.",
            ["playbook"],
            buckets=_RECOVERY_BUCKETS,
            registry=r,
        )
        self.approval_wait = Histogram(
            "pitcrew_approval_wait_seconds",
            "From approval requested to decided (approved, rejected or expired), by playbook.",
            ["playbook"],
            buckets=_APPROVAL_BUCKETS,
            registry=r,
        )
        self.approvals_waiting = Gauge(
            "pitcrew_approvals_waiting", "Incidents waiting for a human's approval now.", registry=r
        )
        self.nodes_under_remediation = Gauge(
            "pitcrew_nodes_under_remediation",
            "Nodes whose incident is running or verifying a playbook now.",
            registry=r,
        )
        self.integration_errors = Counter(
            "pitcrew_integration_errors",
            "Errors a far side answered with, by system (a step's port) and bounded reason.",
            ["system", "reason"],
            registry=r,
        )
        self.gpu_hours_lost = Counter(
            "pitcrew_gpu_hours_lost",
            "GPU-hours out of service (the node's GPUs x fault to back in service), at close.",
            ["playbook", "fault_class"],
            registry=r,
        )
        self.job_gpu_hours_lost = Counter(
            "pitcrew_job_gpu_hours_lost",
            "Training GPU-hours lost by interrupted Slurm jobs (job GPUs x (fault to running again "
            "+ progress redone)), at close.",
            ["playbook", "fault_class"],
            registry=r,
        )
        self.trust_overrides = Counter(
            "pitcrew_trust_overrides",
            "Remediations humans rolled back, or plans they rejected, by playbook and fault class.",
            ["playbook", "fault_class", "action"],
            registry=r,
        )
        self.trust_retests = Counter(
            "pitcrew_trust_retests",
            "Remediated nodes that passed their retest (back in service), came back with the same "
            "fault class within the escalation window, or whose repair failed so the incident climbed "
            "to the playbook's next rung, by the remediation's playbook and fault class.",
            ["playbook", "fault_class", "outcome"],
            registry=r,
        )
        self.lemon_nodes = Counter(
            "pitcrew_lemon_nodes",
            "Nodes found lemons (their lemon.incidents-th remediation within lemon.window): labelled for "
            "an RMA and sent to lemon.playbook, by node and the decisive fault class. Names nodes: "
            "scraped with the read token only.",
            ["node", "fault_class"],
            registry=r,
        )
        self.incident_info = Gauge(
            "pitcrew_incident_info",
            "One series per active incident (value: the fault's time, Unix seconds; thread: its Slack "
            "thread's permalink once posted); gone at close.",
            ["incident", "node", "playbook", "step", "mode", "thread"],
            registry=r,
        )
        self.incidents = IncidentSeries(self.incident_info)
        self._preinit()

    def _preinit(self) -> None:
        for playbook in PLAYBOOKS:
            for state in TERMINAL:
                self.incidents_closed.labels(state.value, playbook)
        for playbook in ACTING:  # the stages are observed only for plans that act on a node
            for histogram in (
                self.time_to_recovery,
                self.time_to_job_running,
                self.time_to_node_back,
                self.time_to_out_of_service,
                self.approval_wait,
            ):
                histogram.labels(playbook)
            for fault_class in FAULT_CLASSES:
                self.gpu_hours_lost.labels(playbook, fault_class)
                self.job_gpu_hours_lost.labels(playbook, fault_class)
                for action in OVERRIDES:
                    self.trust_overrides.labels(playbook, fault_class, action)
                for outcome in RETESTS:
                    self.trust_retests.labels(playbook, fault_class, outcome)
        for system in SYSTEMS:
            for reason in Reason:
                self.integration_errors.labels(system, reason.value)

    def declare_pools(self, pools: Iterable[str]) -> None:
        """Each configured capacity pool's series from the start (0 lent, none given back yet)."""
        for pool in pools:
            for family in (self.capacity_lent, self.capacity_idle, self.capacity_idle_gpus):
                family.labels(pool)
            self.capacity_away.labels(pool)
            self.capacity_saved.labels(pool)
            self.capacity_idle_gpu_hours.labels(pool)

    def watch_store(self, describe: Callable[[], Mapping[str, object]]) -> None:
        """``pitcrew_store_replication`` read from the store's ``describe()`` at every scrape."""

        def shown(mode: str) -> Callable[[], float]:
            return lambda: float(describe().get("replication") == mode)

        for mode in get_args(ReplicationMode):
            self.store_replication.labels(mode).set_function(shown(mode))

    def integration_error(self, system: str, reason: Reason) -> None:
        """Count one error a far side answered with, under its closed ``Reason``."""
        self.integration_errors.labels(system, Reason(reason).value).inc()


def start_up() -> None:
    """What the service's metrics need from the process, once, when it starts serving: no
    ``_created`` series (see above). Process-wide, so it is never done by an import."""
    disable_created_metrics()  # type: ignore[no-untyped-call]  # prometheus_client leaves it unannotated


@dataclass(frozen=True, slots=True)
class IncidentLabels:
    """What the active-incidents table shows for one incident."""

    node: str
    playbook: str
    step: str
    mode: str

    @classmethod
    def of(cls, incident: IncidentRecord, step: str | None = None) -> IncidentLabels:
        """The incident at ``step``, else at its node track's step (or its state before one)."""
        plan = incident.plan
        if step is None and plan is not None and incident.step_index < len(plan.steps):
            step = plan.steps[incident.step_index]
        return cls(
            incident.node, incident.playbook or "none", step or incident.state.value, incident.mode or "none"
        )


class IncidentSeries:
    """``pitcrew_incident_info``: exactly one series per active incident.

    A step change replaces the incident's series (its labels changed); closing removes it;
    ``keep_only`` (the engine's scan) drops any series whose incident is no longer active, so
    the count never exceeds the active incidents even after a crash between close and drop.
    """

    def __init__(self, gauge: Gauge) -> None:
        self._gauge = gauge
        self._shown: dict[str, tuple[IncidentLabels, datetime]] = {}
        #: Where people discuss each incident (its Slack thread), from the notifier's delivery.
        self._threads: dict[str, str] = {}

    def __contains__(self, incident_id: str) -> bool:
        return incident_id in self._shown

    def __len__(self) -> int:
        return len(self._shown)

    def show_incident(self, incident: IncidentRecord, step: str | None = None) -> None:
        self.show(
            incident.id, IncidentLabels.of(incident, step), incident.first_alert_at or incident.opened_at
        )

    def show(self, incident_id: str, labels: IncidentLabels, since: datetime) -> None:
        old = self._shown.get(incident_id)
        if old is not None and old[0] != labels:  # the same labels: the series is set in place
            self._remove(incident_id, old[0])
        self._shown[incident_id] = (labels, since)
        self._gauge.labels(*self._values(incident_id, labels)).set(since.timestamp())

    def link(self, incident_id: str, thread: str) -> None:
        """The incident's Slack thread is at ``thread``: its series carries it from now on."""
        if self._threads.get(incident_id) == thread:
            return
        shown = self._shown.get(incident_id)
        if shown is not None:
            self._remove(incident_id, shown[0])
        self._threads[incident_id] = thread
        if shown is not None:
            self.show(incident_id, *shown)

    def drop(self, incident_id: str) -> None:
        old = self._shown.pop(incident_id, None)
        if old is not None:
            self._remove(incident_id, old[0])
        self._threads.pop(incident_id, None)

    def keep_only(self, active: Iterable[str]) -> None:
        live = set(active)
        for incident_id in [i for i in {*self._shown, *self._threads} if i not in live]:
            self.drop(incident_id)

    def _values(self, incident_id: str, labels: IncidentLabels) -> tuple[str, ...]:
        thread = self._threads.get(incident_id, "")
        return (incident_id, labels.node, labels.playbook, labels.step, labels.mode, thread)

    def _remove(self, incident_id: str, labels: IncidentLabels) -> None:
        with contextlib.suppress(KeyError):
            self._gauge.remove(*self._values(incident_id, labels))
