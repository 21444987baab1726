"""Alert payloads and simulator inventories for engine scenarios (crash, storm, approvals, rollback).

Payloads are the captured Alertmanager deliveries re-addressed to other nodes and times,
so every scenario speaks the exact wire format Alertmanager sends.
"""

from __future__ import annotations

import hashlib
import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import yaml

from proving_ground.pitcrew import DESTRUCTIVE_OPS, destructive_calls, notices
from tests.conftest import FIXTURES

__all__ = [
    "DESTRUCTIVE_OPS",
    "delivery",
    "destructive_calls",
    "events",
    "fault_delivery",
    "gpu_node",
    "inventory",
    "notices",
    "step_result",
]


def delivery(
    fixture: str = "xid79-firing.json",
    *,
    node: str = "gpu-node-02",
    starts: datetime | None = None,
    status: str | None = None,
) -> bytes:
    """A captured delivery moved to ``node`` (new fingerprints) and ``starts`` (new occurrence)."""
    body: dict[str, Any] = json.loads((FIXTURES / "alertmanager" / fixture).read_text())
    stamp = (starts or datetime.now(UTC)).isoformat(timespec="milliseconds").replace("+00:00", "Z")
    for alert in body["alerts"]:
        alert["labels"]["node"] = node
        for spelling in ("Hostname", "hostname"):
            if spelling in alert["labels"]:
                alert["labels"][spelling] = node
        alert["fingerprint"] = hashlib.sha256(f"{alert['fingerprint']}/{node}".encode()).hexdigest()[:16]
        alert["startsAt"] = stamp
        if status is not None:
            alert["status"] = status
            if status == "resolved":
                alert["endsAt"] = (starts or datetime.now(UTC)) + timedelta(seconds=30)
                alert["endsAt"] = alert["endsAt"].isoformat().replace("+00:00", "Z")
    if status is not None:
        body["status"] = status
    body["groupKey"] = f'{{}}:{{node="{node}"}}'
    return json.dumps(body).encode()


def fault_delivery(
    fault: str,
    *,
    alertname: str,
    node: str,
    fixture: str = "row-remap-failure-firing.json",
    starts: datetime | None = None,
) -> bytes:
    """A captured delivery turned into another catalog fault (its ``fault`` and ``alertname`` labels)."""
    body: dict[str, Any] = json.loads(delivery(fixture, node=node, starts=starts))
    for labels in [*(a["labels"] for a in body["alerts"]), body["commonLabels"]]:
        labels.update(fault=fault, alertname=alertname)
    for alert in body["alerts"]:
        alert["fingerprint"] = hashlib.sha256(f"{alert['fingerprint']}/{fault}".encode()).hexdigest()[:16]
    return json.dumps(body).encode()


def step_result(incident: dict[str, Any], step: str) -> dict[str, Any]:
    """The stored result of one step of an incident document (``Pitcrew.incident``); {} if it never ran."""
    record = next((s for s in incident["step_records"] if s["step"] == step), None)
    return dict(record["result"]) if record else {}


def events(incident: dict[str, Any], kind: str, step: str | None = None) -> list[dict[str, Any]]:
    """The incident's timeline events of one kind (and step)."""
    return [e for e in incident["events"] if e["kind"] == kind and (step is None or e["step"] == step)]


def inventory(path: Path, nodes: dict[str, dict[str, Any]], jobs: list[dict[str, Any]]) -> Path:
    path.write_text(yaml.safe_dump({"nodes": nodes, "jobs": jobs}))
    return path


def gpu_node(
    *pods: str, daemonsets: tuple[str, ...] = ("kube-system/nvidia-dcgm-exporter",), **extra: Any
) -> dict[str, Any]:
    return {
        "pods": [*pods, *({"pod": d, "owner_kind": "DaemonSet"} for d in daemonsets)],
        **extra,
    }
