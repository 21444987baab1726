"""Slurm unreachable while pitcrew remediates: slurmctld stopped before the alert arrives.

pitcrew (subprocess, mode auto) with short Slurm timeouts (2 s per command or request). Cases:

* the controller comes back within slurm_down's budget (both backends): the step retries
  (``step_retry`` events, reason slurm_unreachable or timeout), then records the training job,
  DOWNs the node and the incident resolves with the job resumed elsewhere — nothing lost;
* the controller stays down past a small budget (2 attempts): the incident ends ``failed`` with
  an ``escalation`` notice; the alert and incident are kept, the node was never touched, and
  the cluster is whole again once the controller is back.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest

from proving_ground.slurm import SlurmCluster
from tests.e2e.slurm_engine import TERMINAL, open_incident, replace_node, start_pitcrew, training_on_a_node
from tests.harness.figures import show_figure
from tests.harness.pitcrew import Pitcrew
from tests.harness.proc import wait_until
from tests.harness.scenarios import delivery, events, notices, step_result

pytestmark = [pytest.mark.slow, pytest.mark.every_slurm]  # 22.05 and 24.11 in CI
SHORT = {"command_timeout": 2, "request_timeout": 2}


@pytest.fixture
def outage(slurm: SlurmCluster) -> Iterator[SlurmCluster]:
    """The cluster, with its controller restarted after the test whatever happened."""
    yield slurm
    if not slurm.ping():
        slurm.start_controller()


def retries(server: Pitcrew, incident_id: str) -> list[dict[str, Any]]:
    return events(server.incident(incident_id), "step_retry", "slurm_down")


@pytest.mark.parametrize("backend", ["scontrol", "rest"])
def test_controller_back_within_the_budget_the_incident_resumes(
    outage: SlurmCluster, pitcrew_factory: Any, backend: str, capsys: pytest.CaptureFixture[str]
) -> None:
    playbooks = replace_node(slurm_down={"attempts": 40, "timeout": "120s"})
    server = start_pitcrew(
        pitcrew_factory, outage, f"outage-{backend}", backend, slurm_options=SHORT, playbooks=playbooks
    )
    job_id, node = training_on_a_node(outage)
    outage.stop_controller()
    stopped = time.monotonic()
    incident_id = open_incident(server, delivery("xid79-firing.json", node=node))
    wait_until(lambda: retries(server, incident_id), timeout=30, what="slurm_down retrying")
    outage.start_controller()
    back = time.monotonic()
    final = server.wait_incident(incident_id, *TERMINAL, timeout=90)

    assert final["state"] == "resolved", final["outcome"]
    tried = events(final, "step_retry", "slurm_down")
    assert {e["data"]["reason"] for e in tried} <= {"slurm_unreachable", "timeout"}, tried
    record = next(s for s in final["step_records"] if s["step"] == "slurm_down")
    assert record["attempts"] == len(tried) + 1 <= 40
    down = step_result(final, "slurm_down")
    assert [j["job_id"] for j in down["jobs"]] == [job_id]  # recorded once Slurm answered again
    assert down["owned"] == {node: True}
    [job] = step_result(final, "confirm_resumed")["jobs"]
    assert (job["status"], job["restarts_now"]) == ("resumed", 1)
    assert job["new_nodes"] != [node]
    wait_until(lambda: outage.node(node).in_service, timeout=60, what=f"{node} back in service")
    show_figure(
        capsys,
        f"\n[pitcrew + slurm {outage.version} {backend}, controller down {back - stopped:.1f}s] slurm_down took "
        f"{record['attempts']} attempts; incident resolved "
        f"{time.monotonic() - back:.1f}s after the controller was back",
    )


def test_controller_down_past_the_budget_escalates(outage: SlurmCluster, pitcrew_factory: Any) -> None:
    playbooks = replace_node(slurm_down={"attempts": 2, "timeout": "30s"})
    server = start_pitcrew(
        pitcrew_factory, outage, "outage-escalates", slurm_options=SHORT, playbooks=playbooks
    )
    node = "gpu-003"
    outage.stop_controller()
    incident_id = open_incident(server, delivery("xid79-firing.json", node=node))
    final = server.wait_incident(incident_id, *TERMINAL, timeout=60)

    assert final["state"] == "failed"
    assert final["outcome"].startswith("slurm_down failed: slurm_down failed 2 times")
    [retry] = events(final, "step_retry", "slurm_down")
    assert retry["data"]["reason"] in {"slurm_unreachable", "timeout"}
    [escalation] = notices(server.journal_records(), "escalation")
    assert escalation["incident_id"] == incident_id
    assert escalation["title"] == f"{node}: slurm_down failed — a human must take over"
    assert "rollback" in escalation["actions"]
    # Nothing is lost: the alert and the incident are kept for the humans who take over.
    assert sorted(a["alertname"] for a in final["alerts"]) == [
        "GpuXidCritical",
        "GpuXidCriticalRecent",
        "GpuXidCriticalTotal",
    ]
    assert not events(final, "action")  # pitcrew changed nothing

    outage.start_controller()
    state = outage.node(node)
    assert state.in_service
    assert state.reason == ""
