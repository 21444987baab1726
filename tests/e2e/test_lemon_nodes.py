"""A lemon node on the real cluster: real Slurm, the Kubernetes API emulator, the Slack stand-in.

pitcrew is the real ``python -m bot.cli serve`` (mode auto) behind the demo's far sides: the
Kubernetes API emulator (``KubernetesFarSide``: cluster-api replacement, Job templates for a GPU
reset) and the Slack stand-in behind pitcrew's real Slack adapter (``SlackFarSide``), with the
session's real Slurm cluster (Kubernetes node names are the Slurm node names). XID 79 is sent to
``reset-gpu`` (``catalog.overrides``) and ``escalation.window`` is one second, so the repair ladder
never climbs between the incidents here, seconds apart: only the lemon rule can choose more.

Shown: two XID 79 resets of one node, each resolved (GPU reset Job, RESUME); the third XID 79 on it
in the lemon window → ``replace-node`` chosen by the planner (the plan names the two earlier
incidents), the Kubernetes node labelled ``pitcrew.dev/lemon=true`` from its cordon on, its Machine
deleted, the incident's Slack message asking for an RMA with the node's history, the incident
resolved once the replacement is Ready; then ``pitcrew trust`` (the CLI, on the running server's
configuration and store) lists the node as a lemon with its three incidents, and ``/metrics``
(read token) counts it once.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from proving_ground.kubeside import KubernetesFarSide
from proving_ground.pitcrew import Pitcrew
from proving_ground.slackside import SlackFarSide
from proving_ground.slurm import SlurmCluster
from tests.e2e.slurm_engine import TERMINAL, open_incident
from tests.harness.proc import wait_until
from tests.harness.scenarios import delivery, step_result

pytestmark = pytest.mark.slow

LABEL = "pitcrew.dev/lemon"
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def far_side(slurm: SlurmCluster, tmp_path: Path) -> Iterator[SlackFarSide]:
    far = SlackFarSide(KubernetesFarSide())
    far.start(tmp_path / "far-side", list(slurm.nodes))
    try:
        yield far
    finally:
        far.stop()


def _labels(far: SlackFarSide, node: str) -> dict[str, str]:
    world = far.cluster.world  # type: ignore[attr-defined]

    def read(e: Any) -> dict[str, str]:
        found = e.objects.get(("nodes", None, node))
        return dict((found or {}).get("metadata", {}).get("labels") or {})

    labels: dict[str, str] = world.call(read)
    return labels


def test_the_third_incident_in_the_window_replaces_labels_and_asks_for_an_rma(
    slurm: SlurmCluster, far_side: SlackFarSide, tmp_path: Path
) -> None:
    node = slurm.nodes[1]
    config = {
        "mode": "auto",
        "guards": {
            "breaker": {"max_nodes": 10, "max_fraction": 1.0},
            "node": {"max_attempts": 10, "cooldown": "0s"},
        },
        **slurm.pitcrew_settings("scontrol", command_timeout=5),
        "integrations": {"scheduler": "slurm"},
        "catalog": {"overrides": {"79": {"playbook": "reset-gpu"}}},
        "escalation": {"window": "1s"},
    }
    server: Pitcrew = far_side.pitcrew(tmp_path / "pitcrew", config, {}, 0).start()
    try:
        earlier = []
        for _ in range(2):
            incident_id = open_incident(server, delivery("xid79-firing.json", node=node))
            final = server.wait_incident(incident_id, *TERMINAL, timeout=120)
            assert (final["state"], final["playbook"]) == ("resolved", "reset-gpu"), final["outcome"]
            earlier.append(incident_id)
            time.sleep(1.5)  # past escalation.window: the next XID 79 is no repeat of this one
        assert LABEL not in _labels(far_side, node)
        assert far_side.resets() == [node, node] and far_side.replacements() == []

        third = open_incident(server, delivery("xid79-firing.json", node=node))
        wait_until(
            lambda: _labels(far_side, node).get(LABEL) == "true", timeout=60, interval=0.05, what="the label"
        )
        wait_until(
            lambda: node in far_side.replacements(), timeout=60, interval=0.1, what="the Machine deleted"
        )
        slurm.restart_slurmd(node)  # the new machine's slurmd registers under the name
        far_side.node_ready(node)
        final = server.wait_incident(third, *TERMINAL, timeout=120)
        assert (final["state"], final["playbook"]) == ("resolved", "replace-node"), final["outcome"]
        [why] = [r for r in final["reasons"] if r.startswith("lemon: remediation 3")]
        assert f"(earlier: incidents {', '.join(earlier)}) → replace-node" in why, why
        assert step_result(final, "cordon")["lemon"] is True

        # Slack: the incident's message says it is a lemon, names its history and asks for an RMA.
        thread = far_side.thread(third)
        text = "\n".join(n.text() for n in thread)
        assert "lemon: remediation 3" in text and "RMA" in text, text
        assert all(incident in text for incident in earlier), text

        # ``pitcrew trust``, run against the running server's configuration and store.
        answer = subprocess.run(
            [sys.executable, "-m", "bot.cli", "trust", "--json", "--config", str(server.config_path)],
            capture_output=True,
            text=True,
            cwd=REPO,
            timeout=60,
            check=True,
        )
        [offender] = json.loads(answer.stdout)["offenders"]
        assert (offender["node"], offender["lemon"], offender["incidents"]) == (node, True, [*earlier, third])

        status, body = server.read("/metrics")
        assert status == 200
        lemon = f'pitcrew_lemon_nodes_total{{fault_class="gpu-lost",node="{node}"}} 1.0'
        assert lemon in body.decode(), body.decode()[-2000:]
        print(
            f"\n[lemon] {node}: {', '.join(earlier)} reset, {third} → replace-node; labelled {LABEL}=true; "
            f"Slack: {thread[0].title if thread else '-'}"
        )
    finally:
        server.stop()
