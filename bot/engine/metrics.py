"""pitcrew's own Prometheus metrics, all prefixed ``pitcrew_``, all labels bounded.

Metrics are created on an injected ``CollectorRegistry`` (a fresh one per test), never on
the global default, so two apps in one process do not collide.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, Info

_LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)
_STEP_BUCKETS = (0.01, 0.05, 0.1, 0.5, 1, 5, 15, 30, 60, 120, 300, 600, 1800, 3600)
_RECOVERY_BUCKETS = (1, 5, 10, 30, 60, 120, 300, 600, 1200, 1800, 3600, 7200, 14400)


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
        self.time_to_job_running = Histogram(
            "pitcrew_time_to_job_running_seconds",
            "From first alert to every interrupted Slurm job running again (the job track), by playbook.",
            ["playbook"],
            buckets=_RECOVERY_BUCKETS,
            registry=r,
        )
        self.time_to_node_back = Histogram(
            "pitcrew_time_to_node_back_seconds",
            "From first alert to the node back in service (the node track), by playbook.",
            ["playbook"],
            buckets=_RECOVERY_BUCKETS,
            registry=r,
        )
        self.time_to_recovery = Histogram(
            "pitcrew_time_to_recovery_seconds",
            "From first alert to resolved, by playbook.",
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
        self.outbox_pending = Gauge(
            "pitcrew_outbox_pending",
            "Notices not yet delivered, by destination.",
            ["destination"],
            registry=r,
        )
