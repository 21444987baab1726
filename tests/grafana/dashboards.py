"""Reading pitcrew's dashboards the way Grafana would: panels, their queries, the metrics named.

Shared by the dashboard lint (tests/integration/test_dashboards.py) and the end-to-end check that every
query returns data from a real Prometheus (tests/e2e/test_grafana_dashboards.py).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from bot.domain.durations import parse_duration

REPO = Path(__file__).resolve().parents[2]
DASHBOARD_DIR = REPO / "grafana" / "dashboards"

# PromQL words that are not metric names (aggregations, keywords, functions are followed by "(").
_KEYWORDS = {
    "by", "without", "on", "ignoring", "group_left", "group_right", "bool", "offset", "and", "or",
    "unless", "sum", "min", "max", "avg", "count", "stddev", "stdvar", "topk", "bottomk", "quantile",
    "count_values", "group", "inf", "nan",
}  # fmt: skip
_STRING = re.compile(r'"(?:[^"\\]|\\.)*"')
_GROUPING = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)")
_IDENT = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")


def dashboards() -> dict[str, dict[str, Any]]:
    return {path.name: json.loads(path.read_text()) for path in sorted(DASHBOARD_DIR.glob("*.json"))}


def panels(dashboard: dict[str, Any]) -> Iterator[dict[str, Any]]:
    for panel in dashboard["panels"]:
        yield panel
        yield from panel.get("panels", ())  # inside a collapsed row


def queries(dashboard: dict[str, Any]) -> Iterator[tuple[str, dict[str, Any]]]:
    """(panel title, target) for every query of every panel."""
    for panel in panels(dashboard):
        for target in panel.get("targets", ()):
            yield panel["title"], target


def concrete(expr: str, *, rate_interval: str = "1m", range_: str = "1h") -> str:
    """The query as Grafana sends it, its interval variables replaced by durations."""
    seconds = int(parse_duration(range_).total_seconds())
    return (
        expr.replace("$__rate_interval", rate_interval)
        .replace("$__range_s", str(seconds))
        .replace("$__range", range_)
        .replace("$__interval", "15s")
    )


def metric_names(expr: str) -> set[str]:
    """Metric names a query reads (strings, label matchers, grouping clauses, functions removed)."""
    text = _STRING.sub('""', concrete(expr))
    text = re.sub(r"\{[^}]*\}", " ", text)
    text = re.sub(r"\[[^\]]*\]", " ", text)
    text = _GROUPING.sub(" ", text)
    names = set()
    for match in _IDENT.finditer(text):
        word, rest = match.group(), text[match.end() :].lstrip()
        if word.lower() in _KEYWORDS or rest.startswith("("):
            continue
        if re.fullmatch(r"\d+[smhdwy]", word) or text[max(match.start() - 1, 0)] == "$":
            continue
        names.add(word)
    return names
