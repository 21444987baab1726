"""``pitcrew check-config --live`` against real far sides: the Slurm cluster harness (slurmctld,
slurmd, munge, slurmrestd) and a real Prometheus.

- scontrol backend + Prometheus: every line ``ok``, the journal's line says there is nothing to
  reach, exit 0;
- REST backend: slurmrestd answers with our token;
- Prometheus down: exit 1, its line ``FAIL`` and the missing Prometheus named on stderr, while
  Slurm's line is still ``ok`` (one failure never hides the others);
- a token slurmrestd refuses: exit 1 naming the token it needs;
- ``--live`` changes nothing: the Slurm nodes' states are the same before and after.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.harness.proc import free_port, require_binary
from tests.harness.prometheus import REPO, Prometheus
from tests.harness.slurm import SlurmCluster

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def prometheus(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Prometheus]:
    binary = require_binary("prometheus", "prometheus")
    workdir = tmp_path_factory.mktemp("prometheus")
    config = {"global": {"scrape_interval": "1s"}, "scrape_configs": []}
    server = Prometheus(binary, workdir, config)
    server.start()
    try:
        yield server
    finally:
        server.stop()


def check_live(tmp_path: Path, settings: dict[str, Any]) -> subprocess.CompletedProcess[str]:
    config = tmp_path / "pitcrew.yaml"
    config.write_text(yaml.safe_dump({"store": {"path": str(tmp_path / "pitcrew.db")}, **settings}))
    env = {**os.environ, "PYTHONPATH": os.environ.get("PYTHONPATH", str(REPO))}
    return subprocess.run(
        [sys.executable, "-m", "bot.cli", "check-config", "--live", "-c", str(config)],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )


def line_of(stdout: str, system: str) -> str:
    (line,) = [ln for ln in stdout.splitlines() if ln.split()[1:2] == [system]]
    return line


def test_all_far_sides_green_with_scontrol(
    tmp_path: Path, slurm: SlurmCluster, prometheus: Prometheus
) -> None:
    before = slurm.node_states()
    result = check_live(
        tmp_path, {**slurm.pitcrew_settings("scontrol"), "resumption": {"prometheus_url": prometheus.url}}
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert line_of(result.stdout, "slurm").split()[0] == "ok"
    assert "scontrol: slurmctld answers; partitions:" in line_of(result.stdout, "slurm")
    assert line_of(result.stdout, "prometheus").split()[0] == "ok"
    assert f"{prometheus.url}: answers queries" in line_of(result.stdout, "prometheus")
    journal = line_of(result.stdout, "journal")
    assert journal.split()[0] == "-" and "(cluster)" in journal
    assert result.stderr == ""
    assert slurm.node_states() == before


def test_slurm_green_through_slurmrestd(tmp_path: Path, slurm: SlurmCluster) -> None:
    result = check_live(tmp_path, slurm.pitcrew_settings("rest"))
    assert result.returncode == 0, result.stdout + result.stderr
    line = line_of(result.stdout, "slurm")
    assert line.split()[0] == "ok" and f"slurmrestd {slurm.rest_url}" in line


def test_prometheus_down_is_named_and_slurm_still_reported(tmp_path: Path, slurm: SlurmCluster) -> None:
    nowhere = f"http://127.0.0.1:{free_port()}"
    result = check_live(
        tmp_path, {**slurm.pitcrew_settings("scontrol"), "resumption": {"prometheus_url": nowhere}}
    )
    assert result.returncode == 1
    assert line_of(result.stdout, "prometheus").split()[0] == "FAIL"
    assert line_of(result.stdout, "slurm").split()[0] == "ok"
    assert f"pitcrew: check-config --live: missing prometheus: Prometheus at {nowhere}" in result.stderr
    assert "slurm" not in result.stderr


def test_a_token_slurmrestd_refuses_is_named(tmp_path: Path, slurm: SlurmCluster) -> None:
    token = tmp_path / "wrong-token"
    token.write_text("SLURM_JWT=not-a-token-slurm-issued\n")
    result = check_live(tmp_path, slurm.pitcrew_settings("rest", rest_token_file=token))
    assert result.returncode == 1
    assert line_of(result.stdout, "slurm").split()[0] == "FAIL"
    assert "missing slurm:" in result.stderr and "token" in result.stderr
