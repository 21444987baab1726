"""The storm digest counts nodes, not incidents: a node with two incidents in one storm (its
exporter down beside its XID) is one node; the incidents are counted apart when they differ."""

from __future__ import annotations

import pytest

from bot.integrations.slack import messages
from bot.integrations.slack.messages import DigestEntry


def _title(entries: list[DigestEntry]) -> str:
    header: str = messages.digest(entries, "2m", "auto").blocks[0]["text"]["text"]
    return header


@pytest.mark.parametrize(
    ("faults", "title"),
    [
        ({"gpu-001": ["XID 79"], "gpu-002": ["XID 79"]}, "GPU fault storm: 2 nodes within 2m (mode auto)"),
        (
            {"gpu-001": ["XID 79", "exporter-down"], "gpu-002": ["XID 79", "exporter-down"]},
            "GPU fault storm: 2 nodes, 4 incidents within 2m (mode auto)",
        ),
        (
            {"gpu-001": ["XID 79", "exporter-down"]},
            "GPU fault storm: 1 node, 2 incidents within 2m (mode auto)",
        ),
    ],
)
def test_the_title_counts_nodes_and_incidents_apart(faults: dict[str, list[str]], title: str) -> None:
    entries = [
        DigestEntry(f"pc-{node}-{n}", node, fault, "guarded", False)
        for node, names in faults.items()
        for n, fault in enumerate(names)
    ]
    assert _title(entries) == title
