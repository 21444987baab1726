"""pitcrew's dashboard vocabulary, built with Grafana's own builders (grafana-foundation-sdk).

The SDK is generated from Grafana's schemas (the ``dashboard`` kind and each panel plugin's
options), so a field Grafana does not know, or a value of the wrong type, is a type error here
(mypy) instead of a key Grafana silently ignores. This module owns what every pitcrew panel has
in common: the ``${datasource}`` variable on the panel and on each query (no datasource id is
hard-coded), refIds A, B, ... in query order, ids by position, the cross-links between the two
dashboards and the ``pitcrew`` region annotations from Grafana's built-in source. What each panel
asks lives in grafana/fleet.py and grafana/incidents.py; writing the files, in grafana/render.py.

Layout is the SDK's: panels go left to right and a row ends when its widths reach 24 columns,
so each row's widths must add up to exactly 24 (tests/unit/test_dashboards.py fails on a panel
leaving the grid or overlapping another).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, Self, TypeVar

from grafana_foundation_sdk.builders import bargauge, heatmap, prometheus, stat, table, timeseries
from grafana_foundation_sdk.builders import common as common_builders
from grafana_foundation_sdk.builders import dashboard as dashboard_builders
from grafana_foundation_sdk.cog.builder import Builder
from grafana_foundation_sdk.cog.variants import Dataquery
from grafana_foundation_sdk.models import common, dashboard
from grafana_foundation_sdk.models.prometheus import PromQueryFormat

FLEET_UID = "pitcrew-gpu-fleet-health"
INCIDENTS_UID = "pitcrew-incidents"
DATASOURCE_VARIABLE = "datasource"
LEGEND_TABLE_RIGHT = (common.LegendDisplayMode.TABLE, common.LegendPlacement.RIGHT)

Panel = stat.Panel | table.Panel | timeseries.Panel | heatmap.Panel | bargauge.Panel


def prometheus_source() -> dashboard.DataSourceRef:
    """Whichever Prometheus the dashboard's ``${datasource}`` variable picks."""
    return dashboard.DataSourceRef(type_val="prometheus", uid=f"${{{DATASOURCE_VARIABLE}}}")


def grafana_source() -> dashboard.DataSourceRef:
    """Grafana's built-in source: the annotations pitcrew writes through Grafana's HTTP API."""
    return dashboard.DataSourceRef(type_val="grafana", uid="-- Grafana --")


@dataclass(frozen=True)
class Query:
    """One PromQL query of a panel; ``instant`` asks for the latest value only, not a range."""

    expr: str
    legend: str = ""
    instant: bool = False
    format: PromQueryFormat | None = None


def _targets(queries: Sequence[Query]) -> list[Builder[Dataquery]]:
    targets: list[Builder[Dataquery]] = []
    for number, query in enumerate(queries):
        target = prometheus.Dataquery().expr(query.expr).ref_id(chr(ord("A") + number))
        target = target.datasource(prometheus_source())
        if query.legend:
            target = target.legend_format(query.legend)
        if query.instant:
            target = target.instant()
        if query.format is not None:
            target = target.format(query.format)
        targets.append(target)
    return targets


class _PanelBuilder(Protocol):
    """What every panel plugin's builder has: the fields of Grafana's ``Panel`` and ``FieldConfig``."""

    def title(self, title: str) -> Self: ...
    def description(self, description: str) -> Self: ...
    def datasource(self, datasource: dashboard.DataSourceRef) -> Self: ...
    def span(self, w: int) -> Self: ...
    def height(self, h: int) -> Self: ...
    def unit(self, unit: str) -> Self: ...
    def targets(self, targets: list[Builder[Dataquery]]) -> Self: ...


P = TypeVar("P", bound=_PanelBuilder)


def panel(
    builder: P,
    title: str,
    description: str,
    queries: Sequence[Query],
    *,
    width: int = 12,
    height: int = 8,
    unit: str | None = "short",
) -> P:
    """``builder`` with what every pitcrew panel has; ``unit=None`` leaves Grafana's default."""
    built = (
        builder.title(title)
        .description(description)
        .datasource(prometheus_source())
        .span(width)
        .height(height)
        .targets(_targets(queries))
    )
    return built if unit is None else built.unit(unit)


def stat_panel(title: str, description: str, expr: str, unit: str | None = "short") -> stat.Panel:
    """A headline number: the query's latest value, four columns wide."""
    return panel(
        stat.Panel(), title, description, [Query(expr, instant=True)], width=4, height=4, unit=unit
    ).reduce_options(common_builders.ReduceDataOptions().calcs(["lastNotNull"]))


def state_panel(
    title: str, description: str, expr: str, *, off: tuple[str, str], on: tuple[str, str]
) -> stat.Panel:
    """A stat of a 0/1 state gauge, shown as words in colour: ``off`` for 0, ``on`` for 1 (text, colour)."""
    words = {
        value: dashboard.ValueMappingResult(text=text, color=colour)
        for value, (text, colour) in (("0", off), ("1", on))
    }
    return stat_panel(title, description, expr, unit=None).mappings([dashboard.ValueMap(options=words)])


def timeseries_panel(
    title: str,
    description: str,
    *queries: Query,
    unit: str | None = "short",
    legend: tuple[common.LegendDisplayMode, common.LegendPlacement] | None = None,
) -> timeseries.Panel:
    built = panel(timeseries.Panel(), title, description, queries, unit=unit)
    if legend is not None:
        # Setting one option writes them all, and the schema's zero values are not the panel's
        # defaults: say the legend shows and the tooltip is unsorted, as Grafana's editor starts.
        mode, placement = legend
        built = built.legend(
            common_builders.VizLegendOptions().display_mode(mode).placement(placement).show_legend(True)
        ).tooltip(
            common_builders.VizTooltipOptions()
            .mode(common.TooltipDisplayMode.SINGLE)
            .sort(common.SortOrder.NONE)
        )
    return built


def bargauge_panel(
    title: str, description: str, *queries: Query, unit: str, mode: common.BarGaugeDisplayMode
) -> bargauge.Panel:
    """Horizontal bars, one per series of instant queries, each its latest value."""
    return (
        panel(bargauge.Panel(), title, description, queries, unit=unit)
        .orientation(common.VizOrientation.HORIZONTAL)
        .display_mode(mode)
        .reduce_options(common_builders.ReduceDataOptions().calcs(["lastNotNull"]))
    )


def table_panel(
    title: str, description: str, *queries: Query, width: int = 12, unit: str = "short"
) -> table.Panel:
    return panel(table.Panel(), title, description, queries, width=width, unit=unit)


def data_link(title: str, url: str) -> dict[str, object]:
    """A field's data link, opened in a new tab. Grafana's schema types an override's value as any
    value (``DynamicConfigValue.value``), so this is the frontend's ``DataLink`` shape by hand."""
    return {"title": title, "url": url, "targetBlank": True}


def _dashboard_link(title: str, uid: str) -> dashboard_builders.DashboardLink:
    return (
        dashboard_builders.DashboardLink(title)
        .type(dashboard.DashboardLinkType.LINK)
        .url(f"/d/{uid}")
        .keep_time(True)
    )


def dashboard_model(
    uid: str,
    title: str,
    description: str,
    panels: Sequence[Panel],
    variables: Sequence[Builder[dashboard.VariableModel]] = (),
) -> dashboard.Dashboard:
    """A pitcrew dashboard: the last 24 h in UTC, shared crosshair, refreshed every 30 s."""
    builder = (
        dashboard_builders.Dashboard(title)
        .uid(uid)
        .description(description)
        .tags(["pitcrew", "gpu"])
        .timezone(common.TimeZoneUtc)
        .editable()
        .tooltip(dashboard.DashboardCursorSync.CROSSHAIR)
        .refresh("30s")
        .time("now-24h", "now")
        .links(
            [
                _dashboard_link("GPU fleet health", FLEET_UID),
                _dashboard_link("pitcrew incidents", INCIDENTS_UID),
            ]
        )
        .annotation(
            dashboard_builders.AnnotationQuery()
            .name("pitcrew incidents")
            .datasource(grafana_source())
            .enable(True)
            .icon_color("red")
            .target(
                dashboard_builders.AnnotationTarget()
                .type("tags")
                .tags(["pitcrew"])
                .match_any(True)
                .limit(500)
            )
        )
        .with_variable(
            dashboard_builders.DatasourceVariable(DATASOURCE_VARIABLE)
            .label("Prometheus")
            .type("prometheus")
            .hide(dashboard.VariableHide.DONT_HIDE)
        )
    )
    for variable in variables:
        builder = builder.with_variable(variable)
    for number, each in enumerate(panels, start=1):  # ids are positions: stable while the order is
        builder = builder.with_panel(each.id(number))
    return builder.build()
