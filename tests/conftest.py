"""Test configuration shared by every suite.

Fixture plugins live in ``tests/harness``; each module there owns one far side.
"""

from __future__ import annotations

from pathlib import Path

#: Real captured data (Alertmanager, dcgm-exporter, Slurm), copied from the shared captures;
#: each folder has a README saying how it was captured.
FIXTURES = Path(__file__).resolve().parent / "fixtures"

pytest_plugins: list[str] = [
    "tests.harness.slurm",
    "tests.harness.prometheus",
    "tests.harness.pitcrew",
    "tests.harness.kubernetes",
    "tests.harness.standins",
]
