"""The pitcrew incidents dashboard: what pitcrew is doing right now, how fast the fleet recovers,
what each failure cost, and how often humans overrule it, from pitcrew's own ``/metrics``.

The active-incident table links each incident to its Slack thread (the ``thread`` label of
``pitcrew_incident_info``: hidden, not excluded, since a data link reads only its own row) and to
its record in pitcrew's read API, and each playbook to its runbook; both addresses are dashboard
variables an operator sets once.
"""

from __future__ import annotations

from grafana_foundation_sdk.builders import common as common_builders
from grafana_foundation_sdk.builders import dashboard as dashboard_builders
from grafana_foundation_sdk.builders import heatmap, table
from grafana_foundation_sdk.models import common
from grafana_foundation_sdk.models.dashboard import (
    Dashboard,
    DataTransformerConfig,
    DynamicConfigValue,
    VariableHide,
)
from grafana_foundation_sdk.models.prometheus import PromQueryFormat

from grafana.panels import (
    INCIDENTS_UID,
    LEGEND_TABLE_RIGHT,
    Panel,
    Query,
    bargauge_panel,
    dashboard_model,
    data_link,
    panel,
    stat_panel,
    state_panel,
    table_panel,
    timeseries_panel,
)

#: Where the playbooks' runbook (docs/catalog.md) is published at a site: none by default, since
#: pitcrew serves no documents; set the ``runbook_url`` variable once per Grafana.
RUNBOOK = ""
STAGES = (
    ("fault → out of service", "pitcrew_time_to_out_of_service_seconds"),
    ("fault → job running again", "pitcrew_time_to_job_running_seconds"),
    ("fault → node back", "pitcrew_time_to_node_back_seconds"),
    ("fault → incident closed", "pitcrew_time_to_recovery_seconds"),
)
TABLE = PromQueryFormat.TABLE


def _quantile(metric: str, q_: float, window: str, by: str = "") -> str:
    group = f"le, {by}" if by else "le"
    return f"histogram_quantile({q_}, sum by ({group}) (increase({metric}_bucket[{window}])))"


def _variables() -> list[dashboard_builders.TextBoxVariable]:
    """Where pitcrew's read API and the runbooks are: set once per Grafana, hidden on the dashboard."""
    return [
        dashboard_builders.TextBoxVariable("pitcrew_url")
        .label("pitcrew URL")
        .default_value("http://pitcrew.pitcrew.svc:9095")
        .hide(VariableHide.HIDE_VARIABLE),
        dashboard_builders.TextBoxVariable("runbook_url")
        .label("Runbook")
        .default_value(RUNBOOK)
        .hide(VariableHide.HIDE_VARIABLE),
    ]


def _active_incidents() -> table.Panel:
    incident_links = [
        # pitcrew_incident_info's ``thread`` label: the permalink, once the thread is posted.
        data_link("Slack thread of ${__data.fields.incident}", "${__data.fields.thread}"),
        data_link(
            "Incident ${__data.fields.incident} (pitcrew read API: timeline, links; needs the read token)",
            "${pitcrew_url}/api/v1/incidents/${__data.fields.incident}",
        ),
    ]
    columns = ("incident", "node", "playbook", "step", "mode", "Value", "thread")
    organize = {
        "excludeByName": {"Time": True},
        "indexByName": {name: position for position, name in enumerate(columns)},
        "renameByName": {"Value": "age"},
    }
    return (
        table_panel(
            "Active incidents by node",
            "Every incident not yet ended: node, playbook, the step its node track is at, mode, and age. "
            "Click an incident for its Slack thread or its timeline, a playbook for its runbook.",
            Query("time() - pitcrew_incident_info", instant=True, format=TABLE),
            width=24,
            unit="s",
        )
        .show_header(True)
        .sort_by([common_builders.TableSortByFieldState().display_name("age").desc(True)])
        .with_transformation(DataTransformerConfig(id_val="organize", options=organize))
        .override_by_name("incident", [DynamicConfigValue(id_val="links", value=incident_links)])
        .override_by_name(
            "playbook",
            [
                DynamicConfigValue(
                    id_val="links", value=[data_link("Runbook: ${__data.fields.playbook}", "${runbook_url}")]
                )
            ],
        )
        # hidden, not excluded: the incident's Slack link reads it from the row
        .override_by_name("thread", [DynamicConfigValue(id_val="custom.hidden", value=True)])
    )


def _now() -> list[Panel]:
    return [
        stat_panel(
            "Active incidents", "Incidents not yet ended.", "sum(max by (state) (pitcrew_incidents_active))"
        ),
        stat_panel(
            "Nodes under remediation",
            "Nodes whose playbook is running or verifying now.",
            "max(pitcrew_nodes_under_remediation)",
        ),
        stat_panel(
            "Approvals waiting", "Incidents waiting for an approver now.", "max(pitcrew_approvals_waiting)"
        ),
        state_panel(
            "Circuit breaker",
            "OPEN: pitcrew touches no more nodes until a human resets it (pitcrew breaker reset).",
            "max(pitcrew_breaker_open)",
            off=("closed", "green"),
            on=("OPEN", "red"),
        ),
        state_panel(
            "Paused",
            "PAUSED: no destructive step starts (pitcrew pause / resume).",
            "max(pitcrew_paused)",
            off=("running", "green"),
            on=("PAUSED", "orange"),
        ),
        stat_panel(
            "GPU-hours lost",
            "GPU-hours out of service over the time range (each node's GPUs x fault → back in service).",
            "sum(increase(pitcrew_gpu_hours_lost_total[$__range]))",
            "none",
        ),
        _active_incidents(),
    ]


def _recovery() -> list[Panel]:
    return [
        timeseries_panel(
            "Incidents closed by playbook and outcome",
            "How many incidents ended, how (resolved, failed, rolled back, suppressed), per playbook.",
            Query(
                "sum by (playbook, state) (increase(pitcrew_incidents_closed_total[$__rate_interval]))",
                "{{playbook}} {{state}}",
            ),
            unit=None,
            legend=LEGEND_TABLE_RIGHT,
        )
        .draw_style(common.GraphDrawStyle.BARS)
        .stacking(common_builders.StackingConfig().mode(common.StackingMode.NORMAL)),
        panel(
            heatmap.Panel(),
            "Time to recovery distribution",
            "Fault → incident closed, all playbooks: where most incidents end.",
            [
                Query(
                    "sum by (le) (increase(pitcrew_time_to_recovery_seconds_bucket[$__rate_interval]))",
                    "{{le}}",
                    format=PromQueryFormat.HEATMAP,
                )
            ],
            unit="s",
        )
        .calculate(False)
        .y_axis(heatmap.YAxisConfig().unit("s")),
        bargauge_panel(
            "Recovery stages (median over the range)",
            "Median time from the fault to each stage: out of service, training running again, node back, closed.",
            *(Query(_quantile(metric, 0.5, "$__range"), label, instant=True) for label, metric in STAGES),
            unit="s",
            mode=common.BarGaugeDisplayMode.BASIC,
        ),
        timeseries_panel(
            "Recovery stages p90 by playbook",
            "90th percentile time from the fault to each stage, per playbook.",
            *(
                Query(_quantile(metric, 0.9, "$__rate_interval", "playbook"), f"{label} {{{{playbook}}}}")
                for label, metric in STAGES
            ),
            unit="s",
        ),
    ]


def _cost() -> list[Panel]:
    return [
        timeseries_panel(
            "GPU-hours lost over time",
            "GPU-hours out of service per fault class, and training GPU-hours lost by interrupted jobs.",
            Query(
                "sum by (fault_class) (increase(pitcrew_gpu_hours_lost_total[$__rate_interval]))",
                "node {{fault_class}}",
            ),
            Query(
                "sum by (fault_class) (increase(pitcrew_job_gpu_hours_lost_total[$__rate_interval]))",
                "jobs {{fault_class}}",
            ),
            unit="none",
        ),
        bargauge_panel(
            "GPU-hours lost by fault class",
            "Over the time range: what each class of fault cost.",
            Query(
                "sort_desc(sum by (fault_class) (increase(pitcrew_gpu_hours_lost_total[$__range])))",
                "{{fault_class}}",
                instant=True,
            ),
            unit="none",
            mode=common.BarGaugeDisplayMode.GRADIENT,
        ),
    ]


def _trust_ledger() -> table.Panel:
    # The series are pre-initialised at 0: show what happened.
    nothing = {"id": "lowerOrEqual", "options": {"value": 0}}
    happened = {
        "type": "exclude",
        "match": "any",
        "filters": [{"fieldName": f"Value #{ref}", "config": nothing} for ref in "AB"],
    }
    return (
        table_panel(
            "Trust ledger",
            "Per playbook and fault class over the range: remediations humans rolled back or rejected, "
            "remediated nodes that passed their retest, and nodes back with the same fault within the escalation window.",
            Query(
                "sum by (playbook, fault_class, action) (increase(pitcrew_trust_overrides_total[$__range]))",
                instant=True,
                format=TABLE,
            ),
            Query(
                "sum by (playbook, fault_class, outcome) (increase(pitcrew_trust_retests_total[$__range]))",
                instant=True,
                format=TABLE,
            ),
        )
        .show_header(True)
        .with_transformation(DataTransformerConfig(id_val="merge", options={}))
        .with_transformation(DataTransformerConfig(id_val="filterByValue", options=happened))
    )


def _trust_and_failures() -> list[Panel]:
    return [
        _trust_ledger(),
        bargauge_panel(
            "False-positive and repeat rates",
            "Overridden remediations per incident closed, and repeats per passed retest, per playbook.",
            Query(
                "sum by (playbook) (increase(pitcrew_trust_overrides_total[$__range])) / "
                "sum by (playbook) (increase(pitcrew_incidents_closed_total[$__range]))",
                "overridden {{playbook}}",
                instant=True,
            ),
            Query(
                'sum by (playbook) (increase(pitcrew_trust_retests_total{outcome="repeat"}[$__range])) / '
                'sum by (playbook) (increase(pitcrew_trust_retests_total{outcome="passed"}[$__range]))',
                "repeat {{playbook}}",
                instant=True,
            ),
            unit="percentunit",
            mode=common.BarGaugeDisplayMode.BASIC,
        ),
        timeseries_panel(
            "Step failures and retries",
            "Steps that failed (escalated to a human) or were retried after a far-side error.",
            Query(
                'sum by (step, outcome) (increase(pitcrew_steps_total{outcome=~"failed|escalated|retried"}[$__rate_interval]))',
                "{{step}} {{outcome}}",
            ),
        ),
        timeseries_panel(
            "Integration errors",
            "Errors far sides answered with, by system and reason (timeouts, refusals, unreachable).",
            Query(
                "sum by (system, reason) (increase(pitcrew_integration_errors_total[$__rate_interval]))",
                "{{system}} {{reason}}",
            ),
        ),
        timeseries_panel(
            "Breaker, pause and approvals",
            "Circuit breaker open, pitcrew paused, approvals waiting, nodes under remediation.",
            Query("max(pitcrew_breaker_open)", "breaker open"),
            Query("max(pitcrew_paused)", "paused"),
            Query("max(pitcrew_approvals_waiting)", "approvals waiting"),
            Query("max(pitcrew_nodes_under_remediation)", "nodes under remediation"),
        ),
        timeseries_panel(
            "Approval wait p90",
            "How long incidents waited for a human's decision, per playbook.",
            Query(
                _quantile("pitcrew_approval_wait_seconds", 0.9, "$__rate_interval", "playbook"),
                "{{playbook}}",
            ),
            unit="s",
        ),
    ]


def incidents() -> Dashboard:
    return dashboard_model(
        INCIDENTS_UID,
        "pitcrew incidents",
        "What is pitcrew doing right now, how fast does the fleet recover, what did each failure cost, "
        "and how often do humans overrule it. Red regions are pitcrew incidents.",
        [*_now(), *_recovery(), *_cost(), *_trust_and_failures()],
        _variables(),
    )
