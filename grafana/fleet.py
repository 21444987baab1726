"""The GPU fleet health dashboard: is the fleet healthy? XIDs, ECC, row remapping, missing GPUs
and exporters, from dcgm-exporter.

GPU series are folded to one ``node`` label the way pitcrew's rules do it (rules/promql.py), so a
panel and an alert never disagree about which node a GPU is on; XIDs are classed by the same
catalog buckets the rules page on.
"""

from __future__ import annotations

import json

from grafana_foundation_sdk.models import common
from grafana_foundation_sdk.models.dashboard import Dashboard
from grafana_foundation_sdk.models.prometheus import PromQueryFormat

from grafana.panels import (
    FLEET_UID,
    LEGEND_TABLE_RIGHT,
    Panel,
    Query,
    bargauge_panel,
    dashboard_model,
    stat_panel,
    table_panel,
    timeseries_panel,
)
from rules import promql as q


def _fold(expr: str, by: str = "node, gpu") -> str:
    return f"max by ({by}) ({q.node_fold(expr)})"


def _gpus_per_node() -> str:
    return f"count by (node) ({_fold('DCGM_FI_DEV_GPU_TEMP')})"


def _xid_class(expr: str) -> str:
    """``class`` from pitcrew's catalog (rules/promql.py): critical, application, or warning."""
    classes = q.xid_classes()
    critical = "|".join(map(str, classes.critical))
    quiet = "|".join(map(str, classes.no_page))
    human = f'label_replace({expr}, "class", "warning (human, notice or later repair)", "xid", ".+")'
    crit = f'label_replace({human}, "class", "critical: reset, reboot or replace", "xid", "{critical}")'
    return f'label_replace({crit}, "class", "application (node untouched)", "xid", "{quiet}")'


XIDS_NOW = _fold('DCGM_EXP_XID_ERRORS_COUNT{xid!=""}', "node, gpu, xid")
EXPORTER_UP = f"max by (node) ({q.node_fold(f'up{{job=~{json.dumps(q.EXPORTER_JOB)}}}')})"


def _headline() -> list[Panel]:
    return [
        stat_panel(
            "GPUs reporting",
            "GPUs dcgm-exporter reports now, over the fleet.",
            f"count({_fold('DCGM_FI_DEV_GPU_TEMP')})",
        ),
        stat_panel(
            "GPUs missing",
            "GPUs a node reported within the last day and no longer does (fallen off the bus): the GpuMissingFromNode alert's measure.",
            f"sum(max_over_time({_gpus_per_node()}[1d:]) - {_gpus_per_node()})",
        ),
        stat_panel(
            "Exporters up", "dcgm-exporter targets Prometheus scrapes successfully.", f"sum({EXPORTER_UP})"
        ),
        stat_panel(
            "Exporters down",
            "dcgm-exporter targets Prometheus cannot scrape: GPU faults there are invisible.",
            f"count({EXPORTER_UP} == 0) or vector(0)",
        ),
        stat_panel(
            "GPUs with a recent XID",
            "GPUs with an XID in dcgm-exporter's window (5 min by default).",
            f"count({XIDS_NOW} > 0) or vector(0)",
        ),
        stat_panel(
            "Uncorrectable ECC (DBE)",
            "Volatile double-bit ECC errors over the fleet now.",
            f"sum({_fold('DCGM_FI_DEV_ECC_DBE_VOL_TOTAL')})",
        ),
    ]


def _xids() -> list[Panel]:
    return [
        timeseries_panel(
            "XIDs by class",
            "XIDs in dcgm-exporter's window, classed by pitcrew's catalog: critical ones make pitcrew reset, reboot or replace.",
            Query(f"sum by (class) ({_xid_class(XIDS_NOW)})", "{{class}}"),
            legend=LEGEND_TABLE_RIGHT,
        ),
        timeseries_panel(
            "XIDs by node and code",
            "Which node and GPU raised which XID.",
            Query(f"sum by (node, gpu, xid) ({XIDS_NOW})", "{{node}} gpu{{gpu}} XID {{xid}}"),
            legend=LEGEND_TABLE_RIGHT,
        ),
        table_panel(
            "Last XID per GPU",
            "dcgm-exporter's latched last XID per GPU (err_code 0: none since the exporter started).",
            Query(
                _fold("DCGM_FI_DEV_XID_ERRORS", "node, gpu, err_code, err_msg"),
                instant=True,
                format=PromQueryFormat.TABLE,
            ),
            width=24,
        ),
    ]


def _memory_and_presence() -> list[Panel]:
    return [
        timeseries_panel(
            "ECC errors",
            "Volatile ECC errors per GPU: double-bit (uncorrectable) and the single-bit rate.",
            Query(_fold("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL"), "DBE {{node}} gpu{{gpu}}"),
            Query(
                _fold("rate(DCGM_FI_DEV_ECC_SBE_VOL_TOTAL[$__rate_interval])"), "SBE/s {{node}} gpu{{gpu}}"
            ),
        ),
        timeseries_panel(
            "Row remapping",
            "Rows remapped for uncorrectable errors and row-remap failures (a failure means replace the GPU).",
            Query(_fold("DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS"), "uncorrectable rows {{node}} gpu{{gpu}}"),
            Query(_fold("DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS"), "correctable rows {{node}} gpu{{gpu}}"),
            Query(_fold("DCGM_FI_DEV_ROW_REMAP_FAILURE"), "remap failure {{node}} gpu{{gpu}}"),
        ),
        timeseries_panel(
            "GPUs per node",
            "GPUs each node's exporter reports; a drop is a GPU fallen off the bus.",
            Query(_gpus_per_node(), "{{node}}"),
        ),
        timeseries_panel(
            "Exporter up by node",
            "1 while Prometheus scrapes the node's dcgm-exporter.",
            Query(EXPORTER_UP, "{{node}}"),
        ),
    ]


def _spares() -> list[Panel]:
    """Capacity pools (pitcrew's ``capacity`` step): what is lent, what is kept idle, and the cost side.
    Each query reads 0 where no pool is configured (``or vector(0)``): nothing lent, nothing idle."""
    away = "pitcrew_capacity_away_seconds"
    return [
        timeseries_panel(
            "Capacity pools",
            "Nodes lent to stalled gang jobs and not yet given back, and idle pool members as last read "
            "(every capacity.read_every, and by a take), by pool.",
            Query("max by (pool) (pitcrew_capacity_lent_nodes) or vector(0)", "lent {{pool}}"),
            Query("max by (pool) (pitcrew_capacity_idle_nodes) or vector(0)", "idle {{pool}}"),
        ),
        timeseries_panel(
            "Time a lent node spent away",
            "Mean time from a take to its pool being whole again, of the give-backs in the interval, by pool "
            "(0: none given back).",
            Query(
                f"(sum by (pool) (increase({away}_sum[$__rate_interval])) / "
                f"sum by (pool) (increase({away}_count[$__rate_interval])) > 0) or vector(0)",
                "away {{pool}}",
            ),
            unit="s",
        ),
        bargauge_panel(
            "Spare GPU-hours: held idle against saved",
            "Sizing the pools, over the time range: GPU-hours of idle pool members (their GPUs at each read "
            "of the pools, every capacity.read_every, times the time to the next) against the job GPU-hours "
            "taken nodes saved (the interrupted jobs' GPUs times the time from the take to the repair).",
            Query(
                "sum by (pool) (increase(pitcrew_capacity_idle_gpu_hours_total[$__range])) or vector(0)",
                "held idle {{pool}}",
                instant=True,
            ),
            Query(
                "sum by (pool) (increase(pitcrew_capacity_job_gpu_hours_saved_total[$__range])) or vector(0)",
                "saved {{pool}}",
                instant=True,
            ),
            unit="none",
            mode=common.BarGaugeDisplayMode.GRADIENT,
        ),
    ]


def _lemons() -> list[Panel]:
    """Repeat offenders: nodes pitcrew found lemons (``lemon.incidents`` remediations within
    ``lemon.window``). The series name nodes, so pitcrew serves them to a scrape with the read token
    only; 0 where none was found (``or vector(0)``)."""
    return [
        table_panel(
            "Lemon nodes",
            "Nodes pitcrew found lemons in the time range (their lemon.incidents-th remediation within "
            "lemon.window), by node and the fault that made them one: each was sent to replacement, "
            "labelled pitcrew.dev/lemon=true and an RMA asked for. Counted since pitcrew started; "
            "`pitcrew trust` lists every repeat offender with its incidents from the store.",
            Query(
                "sum by (node, fault_class) (max_over_time(pitcrew_lemon_nodes_total[$__range])) or vector(0)",
                instant=True,
                format=PromQueryFormat.TABLE,
            ),
            width=12,
        ),
    ]


def fleet() -> Dashboard:
    return dashboard_model(
        FLEET_UID,
        "GPU fleet health",
        "Is the GPU fleet healthy? XIDs, ECC, row remapping, missing GPUs and exporters, from dcgm-exporter. "
        "Red regions are pitcrew incidents.",
        [*_headline(), *_xids(), *_memory_and_presence(), *_spares(), *_lemons()],
    )
