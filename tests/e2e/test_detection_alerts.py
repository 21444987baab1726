"""Detection end to end, up to the webhook: stand-in exporter -> real Prometheus (pitcrew's rules) ->
real Alertmanager (the shipped route) -> a bare webhook receiver. No pitcrew involved, so this proves
the rules and the route on their own; test_detection.py repeats the essentials through pitcrew.

Cases (each on its own stand-in node, cleared afterwards):
- XID 79 on one GPU: exactly one alert, labels normalised (node, gpu, UUID, xid, fault, severity;
  no pod, instance or Hostname), bearer token sent; the same label set from an exporter that spells
  the label ``hostname``; clearing the GPU delivers "resolved";
- XID 13 (application): nothing is delivered for that node, while a canary XID 79 injected at the
  same moment on another node is;
- a GPU fallen off the bus: GpuMissingFromNode; an exporter answering 500: DcgmExporterDown;
- one GPU's readings frozen (the exporter answers, DCGM serves its last reading): DcgmExporterFrozen
  for that GPU alone, resolved once it reads again;
- a double-bit ECC error (a field dcgm-exporter's default CSV leaves off) on a node already notified
  arrives in the same node group;
- the harness can reload Prometheus's configuration.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from proving_ground.prometheus import Alertmanager
from proving_ground.stack import DetectionStack, WebhookSink
from tests.harness.proc import wait_until

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def alertmanager(
    start_alertmanager: Callable[[str], Alertmanager], webhook_sink: WebhookSink
) -> Alertmanager:
    return start_alertmanager(webhook_sink.url)


@pytest.fixture
def stack(detection_stack: DetectionStack, alertmanager: Alertmanager) -> Iterator[DetectionStack]:
    yield detection_stack
    for node in detection_stack.standin.nodes.values():
        node.clear()
        node.hostname_label = "Hostname"


def test_xid79_one_normalised_alert_per_gpu_then_resolved(
    stack: DetectionStack, webhook_sink: WebhookSink
) -> None:
    spellings = {"gpu-node-01": "Hostname", "gpu-node-02": "hostname"}  # dcgm-exporter <= 4.5 and 4.6+
    for node, spelling in spellings.items():
        stack.standin.node(node).hostname_label = spelling
        stack.standin.node(node).inject("xid", gpu=3, xid=79)
    alerts = {
        node: webhook_sink.wait_for(node=node, alertname="GpuXidCritical", timeout=60) for node in spellings
    }
    for node, alert in alerts.items():
        assert alert["labels"] == {
            "alertname": "GpuXidCritical",
            "node": node,
            "gpu": "3",
            "UUID": stack.standin.node(node).uuid(3),
            "xid": "79",
            "fault": "xid",
            "severity": "critical",
        }
        firing = {a["fingerprint"] for _, a in webhook_sink.alerts(node=node) if a["status"] == "firing"}
        assert firing == {alert["fingerprint"]}, "three XID signals must make one alert, not three"
        delivery = next(
            d for d, a in webhook_sink.alerts(node=node) if a["fingerprint"] == alert["fingerprint"]
        )
        assert delivery.headers["Authorization"] == f"Bearer {stack.token_file.read_text()}"

    for node in spellings:
        stack.standin.node(node).clear()
    for node, alert in alerts.items():
        resolved = webhook_sink.wait_for(node=node, alertname="GpuXidCritical", status="resolved", timeout=60)
        assert (resolved["fingerprint"], resolved["startsAt"]) == (alert["fingerprint"], alert["startsAt"])


def test_application_xid_is_never_delivered(stack: DetectionStack, webhook_sink: WebhookSink) -> None:
    stack.standin.node("gpu-node-03").inject("xid", gpu=0, xid=13)
    stack.standin.node("gpu-node-04").inject("xid", gpu=0, xid=79)  # canary: same scrape, same evaluation
    evaluated = 'pitcrew:gpu_xid:recent{node="gpu-node-03",xid="13"}'  # the rules saw XID 13 (and ignored it)
    wait_until(lambda: bool(stack.prometheus.query(evaluated)), timeout=60, what=evaluated)
    webhook_sink.wait_for(node="gpu-node-04", alertname="GpuXidCritical", timeout=60)
    assert not stack.prometheus.query('ALERTS{node="gpu-node-03"}')
    assert not list(webhook_sink.alerts(node="gpu-node-03"))


def test_gpu_fallen_off_the_bus_is_a_missing_gpu(stack: DetectionStack, webhook_sink: WebhookSink) -> None:
    stack.standin.node("gpu-node-05").inject("fallen_off", gpu=1)
    alert = webhook_sink.wait_for(node="gpu-node-05", alertname="GpuMissingFromNode", timeout=60)
    assert alert["labels"]["fault"] == "gpu-missing"
    assert alert["annotations"]["summary"] == "1 GPU(s) missing on gpu-node-05"


def test_exporter_down(stack: DetectionStack, webhook_sink: WebhookSink) -> None:
    stack.standin.node("gpu-node-06").inject("exporter_500")
    alert = webhook_sink.wait_for(node="gpu-node-06", alertname="DcgmExporterDown", timeout=60)
    assert alert["labels"] == {
        "alertname": "DcgmExporterDown",
        "node": "gpu-node-06",
        "fault": "exporter-down",
        "severity": "warning",
    }


def test_frozen_readings_of_one_gpu(stack: DetectionStack, webhook_sink: WebhookSink) -> None:
    node = stack.standin.node("gpu-node-08")
    node.inject("frozen", gpu=2)
    alert = webhook_sink.wait_for(node="gpu-node-08", alertname="DcgmExporterFrozen", timeout=90)
    assert alert["labels"] == {
        "alertname": "DcgmExporterFrozen",
        "node": "gpu-node-08",
        "gpu": "2",
        "UUID": node.uuid(2),
        "fault": "exporter-down",
        "severity": "warning",
    }
    frozen = stack.prometheus.query('ALERTS{alertname="DcgmExporterFrozen",alertstate="firing"}')
    assert [(s["metric"]["node"], s["metric"]["gpu"]) for s in frozen] == [("gpu-node-08", "2")]
    node.clear(2)  # the exporter restarted: DCGM reads the GPU again
    resolved = webhook_sink.wait_for(
        node="gpu-node-08", alertname="DcgmExporterFrozen", status="resolved", timeout=60
    )
    assert resolved["fingerprint"] == alert["fingerprint"]


def test_second_fault_on_a_notified_node_joins_its_group(
    stack: DetectionStack, webhook_sink: WebhookSink
) -> None:
    node = stack.standin.node("gpu-node-07")
    node.inject("xid", gpu=3, xid=79)
    webhook_sink.wait_for(node="gpu-node-07", alertname="GpuXidCritical", timeout=60)
    node.inject("ecc_dbe", gpu=5)
    ecc = webhook_sink.wait_for(node="gpu-node-07", alertname="GpuEccDoubleBitError", timeout=60)
    delivery = next(d for d, a in webhook_sink.alerts(node="gpu-node-07") if a is ecc)
    assert delivery.body["groupLabels"] == {"node": "gpu-node-07"}
    assert {a["labels"]["alertname"] for a in delivery.body["alerts"]} == {
        "GpuXidCritical",
        "GpuEccDoubleBitError",
    }


def test_prometheus_reloads_its_config(stack: DetectionStack) -> None:
    stack.prometheus.reload()  # later issues point the session Prometheus at more targets this way
    assert stack.prometheus.query('up{job="dcgm-exporter"}')
