"""Lemon nodes, table-tested in the planner: a node whose Nth remediation (any fault) falls inside the
lemon window goes straight to replacement, and the plan names its earlier incidents.

Cases: the third remediation within 7 days, of different faults, replaces; two do not; a remediation
outside the window, or an incident that changed nothing (observe mode, a notice), does not count; a
fault that would change nothing stays hands-off on a lemon; a fault already at replace-node keeps it
and is still marked; incidents, window and playbook are configurable; the mark survives the store.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from bot.config import load_catalog, load_playbooks
from bot.domain.faults import Fault, classify
from bot.domain.labels import Subject
from bot.domain.planner import PastIncident, plan
from bot.domain.policy import LemonPolicy, Mode, Policy
from bot.engine.steps import REGISTRY
from bot.store import codec

NOW = datetime(2026, 12, 2, 1, 0, tzinfo=UTC)
CATALOG = load_catalog()
PLAYBOOKS = load_playbooks()


def fault(xid: int | None = None, kind: str | None = None) -> Fault:
    made = classify(
        Subject("gpu-node-04", "1", None, None, xid, str(xid) if xid else None, kind, ""), CATALOG
    )
    assert made is not None
    return made


def past(incident: str, playbook: str, days: float, acted: bool = True) -> PastIncident:
    return PastIncident(incident, playbook, NOW - timedelta(days=days), acted)


TWO_EARLIER = [past("pc-00001", "reset-gpu", 5), past("pc-00002", "isolate-node", 2)]


@pytest.mark.parametrize(
    ("history", "lemon"),
    [
        ([], ()),
        ([past("pc-00001", "reset-gpu", 5)], ()),  # the second remediation is no lemon yet
        (TWO_EARLIER, ("pc-00001", "pc-00002")),  # the third, of different faults, is
        (
            [past("pc-00001", "reset-gpu", 8), past("pc-00002", "isolate-node", 2)],
            (),
        ),  # one is out of the window
        (
            [past("pc-00001", "reset-gpu", 5, acted=False), past("pc-00002", "isolate-node", 2)],
            (),
        ),  # observed only
        ([past("pc-00001", "notify-only", 5, acted=False), past("pc-00002", "reset-gpu", 2)], ()),  # a notice
        (
            [
                past("pc-00002", "cordon-and-ask", 1),
                past("pc-00001", "reset-gpu", 6),
                past("pc-00003", "reset-gpu", 3),
            ],
            ("pc-00001", "pc-00003", "pc-00002"),  # oldest first, whatever order the store gives
        ),
    ],
)
def test_the_third_remediation_in_the_window_replaces(
    history: list[PastIncident], lemon: tuple[str, ...]
) -> None:
    # A link fault after a GPU reset and an isolation: a lemon is about the node, not one fault class.
    p = plan(
        "gpu-node-04", [fault(kind="link-down")], history, Policy(mode=Mode.AUTO), PLAYBOOKS, NOW, REGISTRY
    )
    assert p.lemon == lemon
    if lemon:
        assert p.playbook == "replace-node"
        words = next(r for r in p.reasons if r.startswith("lemon:"))
        assert f"remediation {len(lemon) + 1}" in words
        assert all(i in words for i in lemon)
        assert "pitcrew.dev/lemon" in words and "RMA" in words
    else:
        assert p.playbook == "isolate-node"
        assert not any(r.startswith("lemon:") for r in p.reasons)


@pytest.mark.parametrize("hands_off", [fault(kind="thermal"), fault(13), fault(4242)])
def test_a_fault_that_changes_nothing_stays_hands_off_on_a_lemon(hands_off: Fault) -> None:
    p = plan("gpu-node-04", [hands_off], TWO_EARLIER, Policy(mode=Mode.AUTO), PLAYBOOKS, NOW, REGISTRY)
    assert p.playbook == hands_off.playbook
    assert p.lemon == ()


def test_a_lemon_already_bound_for_replacement_is_still_marked() -> None:
    p = plan("gpu-node-04", [fault(79)], TWO_EARLIER, Policy(mode=Mode.AUTO), PLAYBOOKS, NOW, REGISTRY)
    assert (p.playbook, p.lemon) == ("replace-node", ("pc-00001", "pc-00002"))


def test_count_window_and_playbook_are_configurable() -> None:
    custom = Policy(
        mode=Mode.AUTO, lemon=LemonPolicy(incidents=2, window=timedelta(days=30), playbook="reboot-node")
    )
    history = [past("pc-00001", "reset-gpu", 20)]
    p = plan("gpu-node-04", [fault(kind="link-down")], history, custom, PLAYBOOKS, NOW, REGISTRY)
    assert (p.playbook, p.lemon) == ("reboot-node", ("pc-00001",))
    # A lemon playbook milder than the fault's own never lowers it.
    p = plan("gpu-node-04", [fault(79)], history, custom, PLAYBOOKS, NOW, REGISTRY)
    assert (p.playbook, p.lemon) == ("replace-node", ("pc-00001",))


def test_the_mark_is_kept_with_the_plan() -> None:
    p = plan("gpu-node-04", [fault(48)], TWO_EARLIER, Policy(mode=Mode.AUTO), PLAYBOOKS, NOW, REGISTRY)
    assert codec.decode_plan(codec.encode_plan(p)).lemon == ("pc-00001", "pc-00002")
