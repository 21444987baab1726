"""Alert payloads and recording inventories for engine scenarios (crash, storm, approvals, rollback).

Payloads are the captured Alertmanager deliveries re-addressed to other nodes and times,
so every scenario speaks the exact wire format Alertmanager sends.
"""

from __future__ import annotations

import hashlib
import json
from collections import Counter
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import yaml

from tests.conftest import FIXTURES

DESTRUCTIVE_OPS = (
    "slurm_down",
    "slurm_drain",
    "cordon",
    "evict",
    "delete_pod",
    "replace",
    "reboot",
    "reset_gpu",
)


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


def destructive_calls(records: list[dict[str, Any]]) -> Counter[tuple[str, str]]:
    """How many times each destructive call reached the far side, by (op, target)."""
    return Counter(
        (r["op"], r.get("pod") or r.get("node") or r.get("job_id") or "?")
        for r in records
        if r.get("op") in DESTRUCTIVE_OPS or r.get("op") in {"slurm_resume", "uncordon", "requeue"}
    )


def notices(records: list[dict[str, Any]], kind: str | None = None) -> list[dict[str, Any]]:
    return [r for r in records if r.get("op") == "notice" and (kind is None or r.get("kind") == kind)]
