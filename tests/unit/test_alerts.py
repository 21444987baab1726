"""Alertmanager payloads → subjects: every captured delivery parses and names the right node, GPU, XID.

Cases: each fixture file (the wire bytes too), lowercase ``hostname``, ``instance`` fallback,
XID from ``err_code`` and from the alert value, malformed bodies rejected with a reason; a
``truncatedAlerts`` beyond uint64 is malformed.
XIDs are ASCII digits only: ``7_9``, Arabic-Indic and full-width digits, ``7.9e1``, ``4.8e1``
and ``79.5`` are unknown XIDs that go to a human; ``79.000000`` is 79.
Times are UTC: one instant written with two offsets is one dedupe key. A startsAt more than
10 minutes ahead of now or 10 years before it, or a resolved endsAt ahead, refuses the
delivery naming the alert; a time with no UTC equivalent is malformed.
Node labels become Kubernetes node names (``GPU-NODE-07`` is ``gpu-node-07``); a value that is
none (a path, a hostlist, a zero-width space, a Kelvin sign, an IPv6 ``instance``) refuses
the delivery, naming every such alert and its label.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any, cast

import pytest

from bot.domain.alerts import (
    ANNOTATION_MAX,
    URL_MAX,
    AlertRejected,
    PayloadError,
    WebhookPayload,
    check_times,
    parse_webhook,
)
from bot.domain.faults import classify
from bot.domain.labels import LabelRules, host_part, subject_of, subjects_of
from tests.conftest import FIXTURES
from tests.unit.test_catalog import CATALOG

AM = FIXTURES / "alertmanager"

# fixture → {fingerprint: (status, node, gpu, xid)}
EXPECTED = {
    "xid79-firing.json": {
        "8dd43c753491e259": ("firing", "gpu-node-02", "3", 79),
        "8909f72b4ad89758": ("firing", "gpu-node-02", "3", 79),
        "54faa5ba6fe53303": ("firing", "gpu-node-02", "3", 79),
    },
    "xid79-repeat.json": {
        "8dd43c753491e259": ("firing", "gpu-node-02", "3", 79),
        "8909f72b4ad89758": ("firing", "gpu-node-02", "3", 79),
        "54faa5ba6fe53303": ("firing", "gpu-node-02", "3", 79),
    },
    "xid79-resolved.json": {
        "8dd43c753491e259": ("resolved", "gpu-node-02", "3", 79),
        "8909f72b4ad89758": ("resolved", "gpu-node-02", "3", 79),
        "54faa5ba6fe53303": ("resolved", "gpu-node-02", "3", 79),
    },
    "xid79-firing-lowercase-hostname-label.json": {
        "d918c4a4e3de9e84": ("firing", "gpu-node-02", "3", 79),
        "b76b3e86d86fa2a5": ("firing", "gpu-node-02", "3", 79),
        "606ffff696241634": ("firing", "gpu-node-02", "3", 79),
    },
    "two-faults-same-node.json": {
        "8dd43c753491e259": ("firing", "gpu-node-02", "3", 79),
        "8909f72b4ad89758": ("firing", "gpu-node-02", "3", 79),
        "54faa5ba6fe53303": ("firing", "gpu-node-02", "3", 79),
        "4d9533919175687a": ("firing", "gpu-node-02", "5", None),
    },
    "row-remap-failure-firing.json": {"6e6d6114f6d1dfaa": ("firing", "gpu-node-01", "6", None)},
    "exporter-down-firing.json": {"932ecce106a3c285": ("firing", "gpu-node-04", None, None)},
    "gpu-fallen-off-bus-firing.json": {"ba8bcadb0c181ec8": ("firing", "gpu-node-03", None, None)},
    "xid48-then-xid154-1-after-xid48.json": {
        "bfff16c2f4e5c47f": ("firing", "gpu-node-01", "0", 48),
        "7d1d447274931396": ("firing", "gpu-node-01", "0", 48),
        "629b39b77c0dafa6": ("firing", "gpu-node-01", "0", 48),
    },
    "xid48-then-xid154-2-after-xid154.json": {
        "bfff16c2f4e5c47f": ("firing", "gpu-node-01", "0", 48),
        "7d1d447274931396": ("firing", "gpu-node-01", "0", 48),
        "629b39b77c0dafa6": ("resolved", "gpu-node-01", "0", 48),
        "02288f933644fbe2": ("firing", "gpu-node-01", "0", 154),
    },
}


def test_every_fixture_has_an_expectation() -> None:
    payloads = {p.name for p in AM.glob("*.json")} - {"request-headers.json", "xid79-firing.wire.json"}
    assert payloads == set(EXPECTED), "a new capture needs its expected node/GPU/XID here"


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_fixture_subjects(name: str) -> None:
    payload = parse_webhook((AM / name).read_bytes())
    got = {a.fingerprint: (a.status, *_subject(a)) for a in payload.alerts}
    assert got == EXPECTED[name]


def _subject(alert: object) -> tuple[str | None, str | None, int | None]:
    s = subject_of(alert)  # type: ignore[arg-type]
    return s.node, s.gpu, s.xid


def test_wire_bytes_equal_the_pretty_capture() -> None:
    wire = parse_webhook((AM / "xid79-firing.wire.json").read_bytes())
    pretty = parse_webhook((AM / "xid79-firing.json").read_bytes())
    assert wire == pretty
    assert wire.group_key == '{}:{node="gpu-node-02"}'
    assert wire.alerts[0].ends_at is None  # 0001-01-01 means "not ended"


def test_retry_sequence_bodies_are_identical_and_parse() -> None:
    lines = [json.loads(line) for line in (AM / "retry-500x3-then-200.jsonl").read_text().splitlines()]
    bodies = [parse_webhook(json.dumps(line["body"]).encode()) for line in lines]
    assert len(bodies) == 4
    assert all(b == bodies[0] for b in bodies)


def test_unknown_fields_and_truncated_alerts_are_accepted() -> None:
    body = json.loads((AM / "xid79-firing.json").read_text())
    body["somethingNew"] = {"x": 1}
    body["truncatedAlerts"] = 7
    body["alerts"][0]["extra"] = "ignored"
    payload = parse_webhook(json.dumps(body).encode())
    assert payload.truncated_alerts == 7
    assert len(payload.alerts) == 3


@pytest.mark.parametrize(
    ("labels", "annotations", "expected"),
    [
        ({"node": "n1", "gpu": "2", "xid": "79"}, {}, ("n1", "2", 79)),
        ({"kubernetes_node": "n2", "UUID": "GPU-abc", "err_code": "48"}, {}, ("n2", "GPU-abc", 48)),
        ({"hostname": "n3", "pci_bus_id": "00:1B.0"}, {}, ("n3", "00:1B.0", None)),
        ({"instance": "10.0.0.5:9400"}, {}, ("10.0.0.5", None, None)),
        ({"alertname": "GpuXid", "node": "n4"}, {"value": "79.000000"}, ("n4", None, 79)),
        ({"alertname": "GpuXid", "node": "n4", "xid": "abc"}, {}, ("n4", None, None)),
        ({"gpu": "1"}, {}, (None, "1", None)),
    ],
)
def test_label_normalisation(
    labels: dict[str, str], annotations: dict[str, str], expected: tuple[str | None, str | None, int | None]
) -> None:
    alert = {
        "status": "firing",
        "labels": labels,
        "annotations": annotations,
        "startsAt": "2026-11-29T08:46:36.045Z",
        "fingerprint": "f",
    }
    payload = parse_webhook(json.dumps({"version": "4", "status": "firing", "alerts": [alert]}).encode())
    assert _subject(payload.alerts[0]) == expected


def test_node_label_order_is_configurable() -> None:
    alert = {
        "status": "firing",
        "labels": {"node": "a", "Hostname": "b"},
        "startsAt": "2026-11-29T00:00:00Z",
        "fingerprint": "f",
    }
    payload = parse_webhook(json.dumps({"version": "4", "status": "firing", "alerts": [alert]}).encode())
    assert subject_of(payload.alerts[0], LabelRules(node=("Hostname", "node"))).node == "b"


@pytest.mark.parametrize(("instance", "host"), [("h:1", "h"), ("h", "h"), ("[::1]:9", "::1"), ("::1", "::1")])
def test_host_part(instance: str, host: str) -> None:
    assert host_part(instance) == host


@pytest.mark.parametrize(
    ("body", "says"),
    [
        (b"", "Invalid JSON"),
        (b"\xff\xfe\x00", "Invalid JSON"),
        (b"[]", "body"),
        (b'{"version": "3", "status": "firing", "alerts": []}', "version 4"),
        (b'{"version": "4", "status": "weird", "alerts": []}', "status"),
        (b'{"version": "4", "status": "firing", "alerts": [{"status": "firing"}]}', "alerts.0.labels"),
        (
            b'{"version": "4", "status": "firing", "alerts": [{"status": "firing", "labels": {"a": 1},'
            b' "startsAt": "2026-01-01T00:00:00Z", "fingerprint": "x"}]}',
            "alerts.0.labels.a",
        ),
        (
            b'{"version": "4", "status": "firing", "alerts": [{"status": "firing", "labels": {},'
            b' "startsAt": "2026-01-01T00:00:00", "fingerprint": "x"}]}',
            "timezone",
        ),
    ],
)
def test_malformed_bodies_are_rejected_with_a_reason(body: bytes, says: str) -> None:
    with pytest.raises(PayloadError, match=says):
        parse_webhook(body)


def one_alert(
    labels: dict[str, str],
    annotations: dict[str, str] | None = None,
    starts: str = "2026-11-29T08:46:36.045Z",
    **fields: str,
) -> WebhookPayload:
    alert = {
        "status": "firing",
        "labels": {"alertname": "GpuXidCritical", **labels},
        "annotations": annotations or {},
        "startsAt": starts,
        "fingerprint": "54faa5ba6fe53303",
        **fields,
    }
    return parse_webhook(json.dumps({"version": "4", "status": "firing", "alerts": [alert]}).encode())


@pytest.mark.parametrize(
    ("text", "xid"),
    [
        ("79", 79),
        (" 79 ", 79),
        ("079", 79),
        ("79.000000", 79),  # a rule that renders the sample value with printf "%f"
        ("79.0", 79),
        ("7_9", None),
        ("\u0667\u0669", None),  # Arabic-Indic 79
        ("\uff17\uff19", None),  # full-width 79
        ("7.9e1", None),
        ("4.8e1", None),
        ("79.5", None),
        ("79.", None),
        ("+79", None),
        ("-79", None),
        ("0x4f", None),
        ("inf", None),
        ("79\u00a0", None),
        ("0", None),
        ("1234567", None),
    ],
)
def test_xid_is_ascii_digits_only(text: str, xid: int | None) -> None:
    for where in ("label", "annotation"):
        if where == "label":
            payload = one_alert({"node": "gpu-node-02", "gpu": "3", "err_code": text})
        else:
            payload = one_alert({"node": "gpu-node-02", "gpu": "3"}, {"value": text})
        subject = subject_of(payload.alerts[0])
        assert subject.xid == xid, where
        fault = classify(subject, CATALOG)
        assert fault is not None
        if xid is None:
            assert (fault.xid, fault.playbook, fault.known) == (None, "ask-human", False)
            assert repr(text.strip(" ")) in fault.detail
        else:
            assert (fault.xid, fault.known) == (79, True)


@pytest.mark.parametrize(
    ("labels", "node"),
    [
        ({"node": "GPU-NODE-07"}, "gpu-node-07"),
        ({"node": " gpu-node-07\t"}, "gpu-node-07"),
        ({"Hostname": "Gpu-Node-07.Cluster.Example"}, "gpu-node-07.cluster.example"),
        ({"instance": "GPU-NODE-07:9400"}, "gpu-node-07"),
        ({"node": "a" * 253}, "a" * 253),
    ],
)
def test_node_labels_become_kubernetes_node_names(labels: dict[str, str], node: str) -> None:
    assert subject_of(one_alert(labels).alerts[0]).node == node


@pytest.mark.parametrize(
    ("labels", "says"),
    [
        ({"node": "../../etc/passwd"}, "label node '../../etc/passwd' is not a Kubernetes node name"),
        ({"node": "gpu-node-0[1-9]"}, "label node 'gpu-node-0[1-9]' is not a Kubernetes node name"),
        ({"node": "gpu-node-07\u200b"}, "label node 'gpu-node-07\\u200b' has characters outside ASCII"),
        ({"node": "\u212a8s-node"}, "outside ASCII"),  # KELVIN SIGN, which lower() makes a "k"
        ({"node": "gpu_node_07"}, "not a Kubernetes node name"),
        ({"node": "gpu-node-07-"}, "not a Kubernetes node name"),
        ({"node": "gpu node 07"}, "not a Kubernetes node name"),
        ({"node": "a" * 254}, "longer than 253 characters"),
        ({"Hostname": "gpu-node-07/"}, "label Hostname 'gpu-node-07/'"),
        (
            {"instance": "[fd00::7]:9400"},
            "label instance '[fd00::7]:9400': host 'fd00::7' is not a Kubernetes",
        ),
    ],
)
def test_node_labels_that_are_no_node_name_refuse_the_delivery(labels: dict[str, str], says: str) -> None:
    payload = one_alert(labels)
    with pytest.raises(AlertRejected) as refused:
        subjects_of(payload)
    message = str(refused.value)
    assert message.startswith("alerts.0 (GpuXidCritical, fingerprint 54faa5ba6fe53303): label ")
    assert says in message


def test_every_refused_alert_of_a_delivery_is_named() -> None:
    body = json.loads((AM / "two-faults-same-node.json").read_text())
    body["alerts"][1]["labels"]["node"] = "GPU/NODE"
    body["alerts"][2]["labels"]["node"] = "gpu-node-0[1-9]"
    payload = parse_webhook(json.dumps(body).encode())
    with pytest.raises(AlertRejected) as refused:
        subjects_of(payload)
    message = str(refused.value)
    assert "alerts.1 (GpuXidCriticalTotal, fingerprint 8909f72b4ad89758): label node 'GPU/NODE'" in message
    assert (
        "alerts.2 (GpuEccDoubleBitVolatile, fingerprint 4d9533919175687a): label node 'gpu-node-0[1-9]'"
        in (message)
    )
    assert "alerts.0" not in message and "alerts.3" not in message


def test_one_instant_with_two_offsets_is_one_key() -> None:
    z = one_alert({"node": "n"}, starts="2026-11-29T08:46:36.045Z").alerts[0]
    plus_one = one_alert({"node": "n"}, starts="2026-11-29T09:46:36.045+01:00").alerts[0]
    assert z.key == plus_one.key == ("54faa5ba6fe53303", "2026-11-29T08:46:36.045000+00:00")
    assert plus_one.starts_at.utcoffset() == timedelta(0)
    ended = one_alert({"node": "n"}, endsAt="2026-11-29T03:47:09-05:00").alerts[0]
    assert ended.ends_at == datetime(2026, 11, 29, 8, 47, 9, tzinfo=UTC)
    assert ended.ends_at is not None and ended.ends_at.utcoffset() == timedelta(0)


NOW = datetime(2026, 11, 29, 9, 0, tzinfo=UTC)

#: Times that can be true at NOW: a sender clock a little ahead, an alert firing for years.
ACCEPTED_TIMES = [
    {"startsAt": "2026-11-29T09:09:59Z"},
    {"startsAt": "2026-11-29T10:09:59+01:00"},
    {"startsAt": "2016-12-01T00:00:00Z"},
    {"status": "resolved", "endsAt": "2026-11-29T09:09:00Z"},
    {"endsAt": "9999-01-01T00:00:00Z"},  # a firing alert's endsAt is only a lease
]


@pytest.mark.parametrize("fields", ACCEPTED_TIMES)
def test_times_in_the_window_around_now_are_accepted(fields: dict[str, Any]) -> None:
    check_times(one_alert({"node": "n"}, **fields), NOW)


@pytest.mark.parametrize(
    ("fields", "refused"),
    [
        ({"startsAt": "2026-11-29T09:10:01Z"}, "startsAt 2026-11-29T09:10:01+00:00 is more than 10m ahead"),
        (
            {"startsAt": "2026-11-29T10:10:01+01:00"},
            "startsAt 2026-11-29T09:10:01+00:00 is more than 10m ahead",
        ),
        ({"startsAt": "9999-01-01T00:00:00Z"}, "startsAt 9999-01-01T00:00:00+00:00 is more than 10m ahead"),
        (
            {"startsAt": "1970-01-01T00:00:00Z"},
            "startsAt 1970-01-01T00:00:00+00:00 is more than 3653 days ago",
        ),
        ({"startsAt": "0001-01-01T00:00:00Z"}, "more than 3653 days ago"),
        ({"status": "resolved", "endsAt": "9999-01-01T00:00:00Z"}, "resolved, but endsAt 9999-01-01"),
    ],
)
def test_times_outside_the_window_around_now_refuse_the_delivery(
    fields: dict[str, Any], refused: str
) -> None:
    with pytest.raises(AlertRejected) as error:
        check_times(one_alert({"node": "n"}, **fields), NOW)
    message = str(error.value)
    assert message.startswith("alerts.0 (GpuXidCritical, fingerprint 54faa5ba6fe53303): ")
    assert refused in message
    assert "pitcrew's clock reads 2026-11-29T09:00:00+00:00" in message


@pytest.mark.parametrize(
    ("field", "value", "says"),
    [
        ("startsAt", "9999-12-31T23:59:59-01:00", "alerts.0.startsAt"),
        ("startsAt", "0001-01-01T00:00:00+01:00", "alerts.0.startsAt"),
        ("endsAt", "9999-12-31T23:59:59-01:00", "alerts.0.endsAt"),
    ],
)
def test_times_with_no_utc_equivalent_are_malformed(field: str, value: str, says: str) -> None:
    with pytest.raises(PayloadError, match=says):
        one_alert({"node": "n"}, **cast(dict[str, Any], {field: value}))


@pytest.mark.parametrize("count", [10**400, 2**64])
def test_truncated_alerts_beyond_uint64_are_malformed(count: int) -> None:
    body = json.loads((AM / "xid79-firing.json").read_text())
    body["truncatedAlerts"] = count
    with pytest.raises(PayloadError, match="truncatedAlerts"):
        parse_webhook(json.dumps(body).encode())
    body["truncatedAlerts"] = 2**64 - 1
    assert parse_webhook(json.dumps(body).encode()).truncated_alerts == 2**64 - 1


def test_long_descriptions_and_urls_are_clipped_never_refused() -> None:
    """Alertmanager sets no length limit, and a 4xx is never retried: a delivery refused for one
    alert's long templated description (a site's rule) would be refused at every group_interval,
    and the node's real fault never seen. What only describes an alert is clipped, with a mark."""
    payload = one_alert(
        {"node": "gpu-node-01", "xid": "79"},
        {"description": "d" * 20_000, "runbook_url": "https://runbooks.example/" + "r" * 9_000},
        generatorURL="http://prometheus.example/graph?g0.expr=" + "e" * 9_000,
    )
    body = {
        "version": "4",
        "status": "firing",
        "alerts": [payload.alerts[0].model_dump(by_alias=True, mode="json")],
        "commonAnnotations": {"description": "c" * 10_000},
        "externalURL": "http://alertmanager.example/" + "x" * 9_000,
    }
    parsed = parse_webhook(json.dumps(body).encode())
    alert = parsed.alerts[0]
    for text in (*alert.annotations.values(), *parsed.common_annotations.values()):
        assert len(text) <= ANNOTATION_MAX and text.endswith(" characters clipped]"), text[-40:]
    assert alert.annotations["description"].startswith("d" * 4000)
    assert len(alert.generator_url) <= URL_MAX and len(parsed.external_url) <= URL_MAX
    # Labels are the alert's identity (its fingerprint): an absurd one still refuses the delivery.
    with pytest.raises(PayloadError, match="labels"):
        one_alert({"node": "gpu-node-01", "xid": "7" * 5_000})


@pytest.mark.parametrize(
    ("change", "where"),
    [
        (lambda a, d: a["labels"].update(alertname="Gpu\x00Xid"), "alerts.0.labels.alertname"),
        (lambda a, d: a["labels"].update({"k\x00": "v"}), "alerts.0.labels.k\\u0000"),
        (lambda a, d: a.update(fingerprint="54faa5ba\x00"), "alerts.0.fingerprint"),
        (lambda a, d: d.update(groupKey='{}:{node="a\x00"}'), "groupKey"),
        (lambda a, d: d.update(receiver="pit\x00crew"), "receiver"),
        (lambda a, d: d.update(commonLabels={"node": "gpu-node-01\x00"}), "commonLabels.node"),
    ],
    ids=["label value", "label name", "fingerprint", "group key", "receiver", "common label"],
)
def test_a_nul_in_what_names_an_alert_refuses_the_delivery(
    change: Callable[[dict[str, Any], dict[str, Any]], None], where: str
) -> None:
    """PostgreSQL's text holds no NUL: refused on both stores, the place named (escaped)."""
    alert = {
        "status": "firing",
        "labels": {"alertname": "GpuXidCritical", "node": "gpu-node-01"},
        "startsAt": "2026-11-29T08:46:36.045Z",
        "fingerprint": "54faa5ba6fe53303",
    }
    body: dict[str, Any] = {"version": "4", "status": "firing", "alerts": [alert]}
    change(alert, body)
    with pytest.raises(PayloadError) as refused:
        parse_webhook(json.dumps(body).encode())
    assert str(refused.value) == f"{where}: holds a NUL character (\\u0000), which pitcrew does not store"


def test_a_nul_in_what_describes_an_alert_is_replaced_never_refused() -> None:
    """As a long description is clipped: kept, the NUL marked (U+FFFD), the alert stored; and a
    backslash written before ``u0000`` is no NUL at all."""
    payload = one_alert(
        {"node": "gpu-node-01", "text": "\\u0000"},
        {"description": "fell\x00off"},
        generatorURL="http://prometheus.example/\x00",
    )
    alert = payload.alerts[0]
    assert alert.annotations["description"] == "fell\ufffdoff"
    assert alert.generator_url == "http://prometheus.example/\ufffd"
    assert alert.labels["text"] == "\\u0000"
    body = {
        "version": "4",
        "status": "firing",
        "alerts": [alert.model_dump(by_alias=True, mode="json")],
        "commonAnnotations": {"summary": "\x00"},
        "externalURL": "http://alertmanager.example/\x00",
    }
    parsed = parse_webhook(json.dumps(body).encode())
    assert parsed.common_annotations == {"summary": "\ufffd"}
    assert parsed.external_url == "http://alertmanager.example/\ufffd"
