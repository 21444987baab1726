"""``pitcrew serve`` on a Slurm-only site never loads the Kubernetes client (~0.2 s of CPU a start).

Cases: building the app as ``serve`` does (``bot.cli``'s imports, the config read with the step
registry, ``bot.runtime.build_app``) for ``integrations.cluster: none`` leaves ``kubernetes`` and
pitcrew's Kubernetes adapter out of ``sys.modules``; ``cluster: kubernetes`` loads both, so the
first case is not vacuous. Each in a fresh interpreter: this one may have loaded them already.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

SERVE_PATH = """
import json, sys
import bot.cli  # what `pitcrew serve` imports before it reads the config
from bot.config import load_config
from bot.engine.steps import REGISTRY
from bot.runtime import build_app

cluster, store = sys.argv[1:]
config = load_config(
    None, steps=REGISTRY, integrations={"scheduler": "slurm", "cluster": cluster}, store={"path": store}
)
build_app(config)
print(json.dumps(sorted(m for m in sys.modules if m == "kubernetes" or m == "bot.integrations.kubernetes")))
"""


@pytest.mark.parametrize(
    ("cluster", "loaded"), [("none", []), ("kubernetes", ["bot.integrations.kubernetes", "kubernetes"])]
)
def test_the_kubernetes_client_loads_only_where_config_selects_it(
    tmp_path: Path, cluster: str, loaded: list[str]
) -> None:
    env = {**os.environ, "PYTHONPATH": os.environ.get("PYTHONPATH", str(REPO))}
    done = subprocess.run(
        [sys.executable, "-c", SERVE_PATH, cluster, str(tmp_path / "pitcrew.db")],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == loaded
