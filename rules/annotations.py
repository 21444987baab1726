"""What on-call reads first: the summary and description of every pitcrew alert.

Kept apart from the expressions (rules/render.py, rules/promql.py) so the words can be reviewed on
their own. ``{{ ... }}`` is Alertmanager/Prometheus templating, filled when the alert fires;
``{name}`` fields are filled by rules/render.py from the profile and the thresholds when it renders.
"""

from __future__ import annotations

ON_GPU = "on {{ $labels.node }} GPU {{ $labels.gpu }} ({{ $labels.UUID }})"
#: summary and description per alert; ``{...}`` fields come from the profile and the thresholds.
TEXT = {
    "GpuXidCritical": (
        "XID {{ $labels.xid }} " + ON_GPU,
        "NVIDIA's XID catalog says this GPU must be reset, rebooted or replaced.",
    ),
    "GpuXidWarning": (
        "XID {{ $labels.xid }} " + ON_GPU,
        "XID that needs no reset, reboot or replacement at once (NVIDIA's catalog: support, mechanical"
        " checks, a workflow; pitcrew's: a repair when convenient or a notice) or a code newer than"
        " pitcrew's list: pitcrew's catalog says what follows, mostly a human.",
    ),
    "GpuEccDoubleBitError": (
        "Double-bit ECC error " + ON_GPU,
        "Uncorrectable ECC errors increased in the last {counter_window}.",
    ),
    "GpuRowRemapFailure": (
        "Row remapping failed " + ON_GPU,
        "The GPU has no spare memory rows left: it needs replacing.",
    ),
    "GpuRowRemapPending": (
        "Row remap pending " + ON_GPU,
        "A memory row was marked for remapping; a GPU reset applies it.",
    ),
    "GpuUncorrectableRemappedRows": (
        "Rows remapped after uncorrectable errors " + ON_GPU,
        "Rows were remapped for uncorrectable errors in the last {counter_window}.",
    ),
    "GpuHealthFail": (
        "DCGM health {{ $labels.health_watch }} FAIL " + ON_GPU,
        "DCGM's health watch reports FAIL for this subsystem.",
    ),
    "GpuMissingFromNode": (
        "{{ $value }} GPU(s) missing on {{ $labels.node }}",
        "The exporter is up but reports fewer GPUs than it did in the last {gpus_seen_window}:"
        " a GPU fell off the bus.",
    ),
    "GpuNvlinkErrors": (
        "NVLink error burst " + ON_GPU,
        "More than {nvlink_burst} NVLink CRC/replay errors, or any recovery error, in {nvlink_window}.",
    ),
    "GpuThermal": (
        "GPU too hot " + ON_GPU,
        "GPU at or above {gpu_temp_max} C or memory at or above {memory_temp_max} C for {thermal_for}.",
    ),
    "NetworkLinkDown": (
        "Link down on {{ $labels.node }}: {{ $labels.device }}{{ with $labels.port }} port {{ . }}{{ end }}",
        "The port lost its link (InfiniBand state DOWN, or Ethernet carrier lost) for {link_down_for}"
        " after being up in the last {link_seen_window}; it is not administratively disabled."
        " Collectives over it stall or fail.",
    ),
    "NetworkLinkFlapping": (
        "Link flapping on {{ $labels.node }}: {{ $labels.device }}{{ with $labels.port }} port {{ . }}{{ end }}",
        'The link went down {{{{ $value | printf "%.0f" }}}} times in {flap_window} (at least {link_flaps}):'
        " each down breaks the job's connections over it.",
    ),
    "NetworkLinkErrors": (
        "Link errors rising on {{ $labels.node }}: {{ $labels.device }} port {{ $labels.port }}",
        '{{{{ $value | printf "%.0f" }}}} physical-layer errors (symbol, receive, link recovery, link integrity)'
        " in {link_error_window}, above {link_errors_max} for {link_errors_for}: the cable or transceiver"
        " is degrading.",
    ),
    "NetworkCounterFull": (
        "{{ $labels.counter }} counter full on {{ $labels.node }}: {{ $labels.device }} port {{ $labels.port }}",
        "The port's {{{{ $labels.counter }}}} counter is at its maximum, where InfiniBand error counters stop:"
        " new downs or errors on this port no longer show, so flapping and error-rate alerts cannot fire"
        " for it. Clear the port's counters (perfquery -R) once its history is understood.",
    ),
    "DcgmExporterDown": (
        "dcgm-exporter down on {{ $labels.node }}",
        "Prometheus cannot scrape the node's exporter: GPU faults on it are invisible.",
    ),
    "DcgmExporterAbsent": (
        "No dcgm-exporter target for {{ $labels.node }}",
        "The node has GPUs (kube-state-metrics) or had an exporter, but no exporter target now:"
        " a crash-looping exporter pod leaves the endpoints.",
    ),
    "DcgmExporterFieldsMissing": (
        "{{ $value }} dcgm-exporter(s) do not export {{ $labels.field }}",
        "Faults that need this field are invisible on those nodes: enable it in the collectors CSV"
        " (rules/dcgm-counters.csv; dcgm-exporter 4.9+'s default CSV renames it).",
    ),
    "DcgmExporterNoTargets": (
        "No dcgm-exporter target at all",
        "Prometheus scrapes no dcgm-exporter: no GPU fault is visible.",
    ),
    "DcgmExporterFrozen": (
        "Readings of {{ $labels.node }} GPU {{ $labels.gpu }} ({{ $labels.UUID }}) frozen",
        "The exporter answers, but the GPU's energy counter, which grows while it has power, has not"
        " moved for {frozen_window}: DCGM no longer takes this GPU's readings (a hung host engine, or a"
        " GPU it stopped reading) and serves the last ones, so faults on it are invisible. Restart the"
        " node's dcgm-exporter (and nv-hostengine if it runs apart); if the readings stay frozen, look"
        " at the GPU (nvidia-smi, the kernel log).",
    ),
    "PitcrewDown": ("pitcrew is down", "Alertmanager's GPU alerts reach no one who acts on them."),
    "PitcrewWebhookRejecting": (
        "pitcrew rejects webhooks with {{ $labels.code }}",
        "Alertmanager does not retry 4xx: these alerts are lost (check the bearer token).",
    ),
    "PitcrewWebhookErrors": (
        "pitcrew answers webhooks with {{ $labels.code }}",
        "Alertmanager retries 5xx, so alerts arrive late.",
    ),
    "PitcrewStepsFailing": (
        "pitcrew step {{ $labels.step }} is failing",
        "Remediation steps fail after their retries; incidents wait for a human.",
    ),
    "PitcrewBreakerOpen": (
        "pitcrew's circuit breaker is open",
        "Too many nodes in remediation at once: pitcrew stopped acting. Look for a fleet-wide cause.",
    ),
    "PitcrewNoLeader": (
        "No pitcrew replica leads the store",
        "pitcrew takes alerts in but none of its replicas holds the store's lease, so no playbook runs "
        "and no notice leaves: the store refuses or loses the lease's writes.",
    ),
    "PitcrewStoreReplicationAsynchronous": (
        "pitcrew's Postgres replicates its commits asynchronously",
        "Standbys stream from the store's primary but a commit returns before any has it: a "
        "failover may lose alerts pitcrew acknowledged (Alertmanager will not resend them) and steps "
        "it recorded (a destructive step may be done again). Make replication synchronous.",
    ),
    "PitcrewIncidentStuck": (
        "A pitcrew incident is open for more than 4 hours",
        "An incident is stuck (approval, drain or replacement never finished).",
    ),
    "PitcrewSlackSocketDisconnected": (
        "pitcrew has no Socket Mode connection to Slack",
        "Slack's buttons and /pitcrew do not reach pitcrew: its app-level token is refused (revoked, a "
        "bot token in its place, no connections:write) or the connection is down. /readyz shows why; "
        "notices still post. Remediation goes on; approvals from Slack do not.",
    ),
    "PitcrewNoticesStuck": (
        "pitcrew's notices to {{ $labels.destination }} are not getting through",
        "Notices wait in pitcrew's outbox and none was delivered for 10 minutes: the far side is down, "
        "refuses pitcrew's token or rate-limits it. Remediation goes on; people are not being told.",
    ),
}
