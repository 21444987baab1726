"""``/metrics`` of the running service: a closed set of error reasons, no ``_created`` series.

Cases: ``pitcrew serve`` (a real process) answers ``/metrics`` with
``pitcrew_integration_errors_total`` made for every system and every ``Reason`` before anything
failed, and with no other reason after a far side refused a call (the refusal counted under its
member); no counter or histogram exports a ``_created`` series, because the service's start-up
switched them off. Importing pitcrew does not: the switch is process-wide, and a library
that imports pitcrew's modules keeps prometheus_client as it found it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry, Counter, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from bot.engine.errors import Reason
from bot.engine.metrics import SYSTEMS
from tests.harness.pitcrew import Pitcrew
from tests.harness.scenarios import delivery, gpu_node, inventory


def _scrape(server: Pitcrew) -> list[Any]:
    status, body = server.request("GET", "/metrics")
    assert status == 200, body
    return [s for family in text_string_to_metric_families(body.decode()) for s in family.samples]


def test_the_service_exports_every_reason_and_no_created_series(pitcrew_factory: Any, tmp_path: Path) -> None:
    world = inventory(tmp_path / "inventory.yaml", {"gpu-node-01": gpu_node()}, [])
    config = {
        "mode": "auto",
        "guards": {"breaker": {"max_nodes": 10, "max_fraction": 1.0}},
        "playbooks": {"replace-node": {"steps": ["notify", "slurm_down", "cordon", "close"]}},
    }
    server: Pitcrew = pitcrew_factory("metrics", config=config, world={"inventory": world}).start()
    every = {(system, reason.value) for system in SYSTEMS for reason in Reason}

    def errors(samples: list[Any]) -> dict[tuple[str, str], float]:
        return {
            (s.labels["system"], s.labels["reason"]): s.value
            for s in samples
            if s.name == "pitcrew_integration_errors_total"
        }

    before = _scrape(server)
    assert set(errors(before)) == every and not any(errors(before).values())
    assert not [s.name for s in before if s.name.endswith("_created")]

    # gpu-node-09 is not in the inventory: the far side refuses every call about it.
    _, body = server.post_alerts(delivery(node="gpu-node-09"))
    server.wait_incident(body["opened"][0], "failed", timeout=30)
    after = _scrape(server)
    assert set(errors(after)) == every  # a refusal adds a count, never a label value
    assert errors(after)[("scheduler", Reason.UNKNOWN_NODE.value)] >= 1
    assert not [s.name for s in after if s.name.endswith("_created")]


def test_importing_pitcrew_leaves_prometheus_clients_created_series_alone() -> None:
    import bot.runtime  # noqa: F401  # the service's whole import graph, the metrics module included

    registry = CollectorRegistry()
    Counter("probe_total", "A counter of nobody's.", registry=registry).inc()
    assert b"probe_created " in generate_latest(registry)
