"""The trust ledger from incident facts (``bot.domain.trust.ledger``), table-driven.

Cases: a remediation that passed; one rolled back; one rejected; the same fault class again on
the node inside the window (a repeat, against the latest earlier remediation) and outside it
(none); a different fault class (none); a hands-off incident is no remediation but can be a
repeat; an incident that climbed the repair ladder counts each failed rung as a remediation of
that playbook that climbed, and its last rung as usual; rates are None where nothing was counted.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta

import pytest

from bot.domain.trust import IncidentFacts, TrustRow, ledger, offenders

T0 = datetime(2026, 12, 1, tzinfo=UTC)
DAY = timedelta(hours=24)


def fact(
    n: int,
    hours: float,
    node: str = "gpu-1",
    playbook: str = "replace-node",
    cls: str = "gpu-lost",
    climbed_from: tuple[str, ...] = (),
    **kw: bool,
) -> IncidentFacts:
    return IncidentFacts(
        incident_id=f"pc-{n:05d}",
        node=node,
        opened_at=T0 + timedelta(hours=hours),
        playbook=playbook,
        fault_class=cls,
        fault_classes=frozenset({cls}),
        remediates=kw.pop("remediates", playbook not in {"notify-only", "ask-human", "ignore"}),
        climbed_from=climbed_from,
        **kw,
    )


@dataclass(frozen=True)
class Case:
    incidents: list[IncidentFacts]
    rows: list[TrustRow] = field(default_factory=list)


CASES = {
    "passed": Case([fact(1, 0, back_in_service=True)], [TrustRow("replace-node", "gpu-lost", 1, passed=1)]),
    "rolled-back": Case(
        [fact(1, 0, rolled_back=True)], [TrustRow("replace-node", "gpu-lost", 1, rolled_back=1)]
    ),
    "rejected": Case([fact(1, 0, rejected=True)], [TrustRow("replace-node", "gpu-lost", 1, rejected=1)]),
    "repeat-within-window-counts-against-the-latest": Case(
        [
            fact(1, 0, "gpu-1", "reset-gpu", back_in_service=True),
            fact(2, 2, "gpu-1", "reboot-node", back_in_service=True),
            fact(3, 5, "gpu-1", "replace-node", back_in_service=True),
        ],
        [
            TrustRow("reboot-node", "gpu-lost", 1, passed=1, repeat=1),
            TrustRow("replace-node", "gpu-lost", 1, passed=1),
            TrustRow("reset-gpu", "gpu-lost", 1, passed=1, repeat=1),
        ],
    ),
    "outside-the-window-or-another-node-or-class": Case(
        [
            fact(1, 0, back_in_service=True),
            fact(2, 30, back_in_service=True),
            fact(3, 31, node="gpu-2", back_in_service=True),
            fact(4, 32, cls="memory", playbook="reset-gpu", back_in_service=True),
        ],
        [
            TrustRow("replace-node", "gpu-lost", 3, passed=3),
            TrustRow("reset-gpu", "memory", 1, passed=1),
        ],
    ),
    "climbed-rungs-count-against-the-rung-that-failed": Case(
        [
            fact(
                1, 0, playbook="replace-node", climbed_from=("reset-gpu", "reboot-node"), back_in_service=True
            )
        ],
        [
            TrustRow("reboot-node", "gpu-lost", 1, climbed=1),
            TrustRow("replace-node", "gpu-lost", 1, passed=1),
            TrustRow("reset-gpu", "gpu-lost", 1, climbed=1),
        ],
    ),
    "a-hands-off-incident-is-no-remediation-but-a-repeat": Case(
        [fact(1, 0, back_in_service=True), fact(2, 1, playbook="notify-only")],
        [TrustRow("replace-node", "gpu-lost", 1, passed=1, repeat=1)],
    ),
}


@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
def test_ledger(case: Case) -> None:
    assert ledger(case.incidents, DAY) == case.rows


def test_rates() -> None:
    row = TrustRow("replace-node", "gpu-lost", 4, rolled_back=1, rejected=1, passed=2, repeat=1)
    assert (row.overridden_rate, row.repeat_rate) == (0.5, 0.5)
    assert (TrustRow("x", "y").overridden_rate, TrustRow("x", "y").repeat_rate) == (None, None)


WEEK = timedelta(days=7)


def acted(n: int, days: float, node: str = "gpu-1", lemon: bool = False) -> IncidentFacts:
    return replace(fact(n, days * 24, node=node, playbook="reset-gpu"), acts=True, lemon=lemon)


@pytest.mark.parametrize(
    ("incidents", "expected"),
    [
        ([], []),
        ([acted(1, 0)], []),  # once is no offender
        ([acted(1, 0), acted(2, 3)], [("gpu-1", ("pc-00001", "pc-00002"), False)]),
        ([acted(1, 0), acted(2, 8)], []),  # a week apart: the window ends at the latest
        ([acted(1, 0), replace(acted(2, 1), acts=False)], []),  # a notice changed nothing
        (
            [
                acted(1, 0, "gpu-2"),
                acted(2, 1, "gpu-1"),
                acted(3, 2, "gpu-2"),
                acted(4, 3, "gpu-2", lemon=True),
            ],
            [("gpu-2", ("pc-00001", "pc-00003", "pc-00004"), True)],  # the most remediations first
        ),
        (
            [acted(1, 0, "gpu-1"), acted(2, 1, "gpu-1"), acted(3, 2, "gpu-2"), acted(4, 3, "gpu-2")],
            [("gpu-2", ("pc-00003", "pc-00004"), False), ("gpu-1", ("pc-00001", "pc-00002"), False)],
        ),
    ],
)
def test_repeat_offenders(
    incidents: list[IncidentFacts], expected: list[tuple[str, tuple[str, ...], bool]]
) -> None:
    found = offenders(incidents, WEEK)
    assert [(o.node, o.incidents, o.lemon) for o in found] == expected
