"""XID 145 by its sub-code, pitcrew itself (a subprocess, mode auto) against a real Slurm cluster.

The alert is what a kernel-log rule sends through Alertmanager: dcgm-exporter's labels (its ``err_msg``
for 145 is the fixed "NVLINK: RLW Error") and the driver's ``NVRM: Xid`` line in the description.
No XID 154 is sent. Kubernetes and the notifier are simulated; Slurm is real. Cases:

* a fatal RLW_REMAP sub-code (errorStatus 0x40, NVIDIA: Fatal, RESET_GPU): the node goes DOWN with
  pitcrew's reason, its GPU is reset, the training job resumes elsewhere, the incident resolves;
* a non-fatal sub-code of the same unit (errorStatus 0x100, IGNORE): a notice only; Slurm is never
  touched and the job runs on.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from proving_ground.slurm import SlurmCluster
from tests.e2e.slurm_engine import TERMINAL, open_incident, start_pitcrew, training_on_a_node
from tests.harness.scenarios import delivery, events, step_result

pytestmark = pytest.mark.slow

LINE = (
    "[171167.620236] NVRM: Xid (PCI:0000:61:00): 145, RLW_REMAP {words} XC0 i0 Link 03"
    " (0x00000082 0x{status:08x} 0x00000000 0x00000000 0x00000000 0x00000000)"
)


def kernel_log_alert(node: str, status: int, words: str) -> bytes:
    """One XID 145 alert as a log ruler raises it, for ``node`` (from a captured delivery's shape)."""
    body: dict[str, Any] = json.loads(delivery("xid79-firing.json", node=node))
    alert = body["alerts"][0]
    alert["labels"] = {
        "alertname": "GpuXidKernelLog",
        "node": node,
        "gpu": "3",
        "xid": "145",
        "err_msg": "NVLINK: RLW Error",
        "fault": "xid",
        "severity": "critical",
    }
    alert["annotations"] = {"description": LINE.format(words=words, status=status)}
    alert["fingerprint"] = f"{alert['fingerprint'][:12]}{status:04x}"
    body["alerts"] = [alert]
    return json.dumps(body).encode()


def test_a_fatal_sub_code_resets_the_gpu_without_xid_154(slurm: SlurmCluster, pitcrew_factory: Any) -> None:
    server = start_pitcrew(pitcrew_factory, slurm, "xid145-fatal")
    job_id, node = training_on_a_node(slurm)
    incident_id = open_incident(server, kernel_log_alert(node, 0x40, "Fatal"))
    final = server.wait_incident(incident_id, *TERMINAL, timeout=90)

    assert final["state"] == "resolved", final["outcome"]
    assert final["playbook"] == "reset-gpu"
    down = step_result(final, "slurm_down")
    assert down["action"] == "down"  # NVIDIA: Fatal, the GPU's channels are gone
    assert down["reason"].startswith(f"pitcrew: {incident_id} XID 145")
    [reset] = [e for e in events(final, "action") if e["data"]["action"] == "reset_gpu"]
    assert node in reset["detail"]
    [record] = step_result(final, "confirm_resumed")["jobs"]
    assert (record["job_id"], record["status"]) == (job_id, "resumed")
    decided = " ".join(final["reasons"])
    assert "RLW_REMAP" in decided and "NVIDIA decode RESET_GPU (Fatal" in decided


def test_a_non_fatal_sub_code_is_a_notice_only(slurm: SlurmCluster, pitcrew_factory: Any) -> None:
    server = start_pitcrew(pitcrew_factory, slurm, "xid145-nonfatal")
    job_id, node = training_on_a_node(slurm)
    incident_id = open_incident(server, kernel_log_alert(node, 0x100, "Nonfatal"))
    server.wait_event(incident_id, "step_finished", "notify", timeout=60)
    incident = server.incident(incident_id)
    assert incident["playbook"] == "notify-only"
    assert "slurm_down" not in incident["steps"]
    assert not events(incident, "action")
    state, job = slurm.node(node), slurm.job(job_id)
    assert state.in_service and not state.reason
    assert job is not None and (job.state, job.restarts, job.nodes) == ("RUNNING", 0, (node,))
