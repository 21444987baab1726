"""Detection end to end through pitcrew: stand-in exporter -> real Prometheus (pitcrew's rules) -> real
Alertmanager (the shipped route) -> pitcrew's real ``POST /api/v1/alerts``, started as
``python -m bot.cli serve`` (tests.harness.pitcrew) in observe mode.

Cases (each on its own stand-in node):
- XID 79 on one GPU opens an incident for that node with the XID 79 fault, planned ``replace-node``,
  and starts no node action (observe mode skips them);
- XID 13 (an application XID) leads to no node action: no incident, or one that plans none; a canary
  XID 79 injected at the same moment on another node proves the pipeline ran;
- clearing the fault delivers "resolved", which pitcrew records without starting any action;
- an exporter that answers 500 opens a ``notify-only`` incident and no node action.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from proving_ground.prometheus import Alertmanager
from proving_ground.stack import DetectionStack
from tests.harness.pitcrew import Pitcrew
from tests.harness.proc import wait_until

pytestmark = pytest.mark.slow
NODE_ACTIONS = {"slurm_down", "cordon", "drain", "reset_gpu", "reboot", "replace"}


def wait_incident(
    pitcrew: Pitcrew, node: str, ready: Callable[[dict[str, Any]], bool], what: str
) -> dict[str, Any]:
    """The first incident on ``node`` (full detail: alerts and events) for which ``ready`` holds."""
    found: list[dict[str, Any]] = []

    def arrived() -> bool:
        found[:] = [i for i in (pitcrew.incident(s["id"]) for s in pitcrew.incidents(node)) if ready(i)]
        return bool(found)

    wait_until(arrived, timeout=60, interval=0.1, what=f"incident on {node}: {what}")
    return found[0]


def started_node_actions(incident: dict[str, Any]) -> list[str]:
    return [
        e["step"] for e in incident["events"] if e["kind"] == "step_started" and e["step"] in NODE_ACTIONS
    ]


def planned_steps(incident: dict[str, Any]) -> set[str]:
    return {s if isinstance(s, str) else s.get("step") or s.get("name") for s in incident.get("steps", [])}


def planned(incident: dict[str, Any]) -> bool:
    """The incident is visible as soon as it is opened; its playbook comes a moment later."""
    return incident["playbook"] is not None


def has_xid(incident: dict[str, Any], xid: int) -> bool:
    return any(f["kind"] == "xid" and f["xid"] == xid for f in incident["faults"])


def skipped_node_action(incident: dict[str, Any]) -> bool:
    """Observe mode got as far as the destructive steps (and skipped them)."""
    return any(e["kind"] == "step_skipped" and e["step"] in NODE_ACTIONS for e in incident["events"])


@pytest.fixture(scope="module")
def pitcrew(
    detection_stack: DetectionStack,
    tmp_path_factory: pytest.TempPathFactory,
    start_alertmanager: Callable[[str], Alertmanager],
) -> Iterator[Pitcrew]:
    token = detection_stack.token_file.read_text()  # the token Alertmanager sends
    service = Pitcrew(
        tmp_path_factory.mktemp("pitcrew"), token=token, config={"mode": "observe"}, simulated=False
    )
    try:
        service.start()
        start_alertmanager(f"{service.url}/api/v1/alerts")
        yield service
    finally:
        service.stop()


@pytest.fixture
def stack(detection_stack: DetectionStack, pitcrew: Pitcrew) -> Iterator[DetectionStack]:
    yield detection_stack
    for node in detection_stack.standin.nodes.values():
        node.clear()


def test_xid79_opens_a_replace_node_incident_and_acts_on_nothing(
    stack: DetectionStack, pitcrew: Pitcrew
) -> None:
    stack.standin.node("gpu-node-08").inject("xid", gpu=3, xid=79)
    incident = wait_incident(
        pitcrew,
        "gpu-node-08",
        lambda i: has_xid(i, 79) and skipped_node_action(i),
        "XID 79, planned and observed",
    )
    assert incident["playbook"] == "replace-node"
    assert incident["mode"] == "observe"
    (fault,) = [f for f in incident["faults"] if f["kind"] == "xid"]
    assert str(fault["gpu"]) == "3"
    assert not started_node_actions(incident)


def test_application_xid_touches_no_node(stack: DetectionStack, pitcrew: Pitcrew) -> None:
    stack.standin.node("gpu-node-09").inject("xid", gpu=0, xid=13)
    stack.standin.node("gpu-node-10").inject("xid", gpu=0, xid=79)  # canary: same scrape, same evaluation
    evaluated = 'pitcrew:gpu_xid:recent{node="gpu-node-09",xid="13"}'  # the rules saw XID 13 (and ignored it)
    wait_until(lambda: bool(stack.prometheus.query(evaluated)), timeout=60, what=evaluated)
    wait_incident(pitcrew, "gpu-node-10", lambda i: has_xid(i, 79), "canary XID 79")
    assert not stack.prometheus.query('ALERTS{node="gpu-node-09"}')
    if pitcrew.incidents("gpu-node-09"):  # allowed, if it plans no node action
        incident = wait_incident(pitcrew, "gpu-node-09", planned, "planned")
        assert not planned_steps(incident) & NODE_ACTIONS, incident
        assert not started_node_actions(incident), incident


def test_cleared_fault_is_recorded_resolved_without_action(stack: DetectionStack, pitcrew: Pitcrew) -> None:
    node = stack.standin.node("gpu-node-11")
    node.inject("xid", gpu=2, xid=79)
    opened = wait_incident(pitcrew, "gpu-node-11", lambda i: has_xid(i, 79), "XID 79")
    node.clear()

    def xid_alert_resolved(incident: dict[str, Any]) -> bool:
        return incident["id"] == opened["id"] and any(
            a["alertname"] == "GpuXidCritical" and a["status"] == "resolved" for a in incident["alerts"]
        )

    incident = wait_incident(pitcrew, "gpu-node-11", xid_alert_resolved, "GpuXidCritical resolved")
    assert not started_node_actions(incident)


def test_exporter_down_opens_a_notify_only_incident(stack: DetectionStack, pitcrew: Pitcrew) -> None:
    stack.standin.node("gpu-node-12").inject("exporter_500")
    incident = wait_incident(
        pitcrew,
        "gpu-node-12",
        lambda i: planned(i) and any(f["kind"] == "exporter-down" for f in i["faults"]),
        "exporter-down, planned",
    )
    assert incident["playbook"] == "notify-only"
    assert not planned_steps(incident) & NODE_ACTIONS
    assert not started_node_actions(incident)
