"""Where the proving ground finds pitcrew's shipped alerting files: the rules and the Alertmanager route.

The demo runs pitcrew's real rule set (``rules/``, rendered in its FAST profile so a fault fires
in seconds) and the shipped Alertmanager route (``alertmanager/alertmanager.yml``). Both live at
the top of the source checkout, beside ``bot/``: ``make demo`` installs pitcrew editable from that
checkout, so they are always there. ``missing()`` says what is not, for the demo's pre-flight.
"""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SHIPPED_ALERTMANAGER = REPO / "alertmanager" / "alertmanager.yml"
COLLECTORS_CSV = REPO / "rules" / "dcgm-counters.csv"
RULES_RENDERER = REPO / "rules" / "render.py"


def missing() -> list[str]:
    """The shipped files the proving ground needs and cannot find (empty when all are there)."""
    return [str(p) for p in (SHIPPED_ALERTMANAGER, COLLECTORS_CSV, RULES_RENDERER) if not p.is_file()]


def fast_rules() -> str:
    """pitcrew's rule file in the FAST profile (second-scale windows), as ``rules/render.py`` writes it."""
    if str(REPO) not in sys.path:
        sys.path.append(str(REPO))
    render = importlib.import_module("rules.render")
    text: str = render.render_rule_file(render.FAST)
    return text
