"""A SIGKILL of pitcrew between Grafana storing the annotation and pitcrew recording its id: no duplicate.

Cases (pitcrew as a real process, the simulated far side, the Grafana stand-in in its own
thread): the stand-in kills pitcrew (SIGKILL) the moment it has stored the incident's annotation,
before answering; pitcrew restarts, the incident runs on to resolved, and the redelivery asks
Grafana for the incident's tag (``incident:<id>``) before creating, finds the annotation and
patches its end instead: one annotation, created once, closed at the incident's close.
"""

from __future__ import annotations

from datetime import datetime
from pathlib import Path
from typing import Any

from tests.grafana.server import TOKEN
from tests.grafana.threaded import threaded_grafana
from tests.harness.pitcrew import Crash, Pitcrew
from tests.harness.proc import wait_until
from tests.harness.scenarios import delivery


def test_sigkill_after_grafana_stored_the_annotation_does_not_create_it_twice(
    pitcrew_factory: Any, tmp_path: Path
) -> None:
    (tmp_path / "grafana.token").write_text(TOKEN)
    with threaded_grafana() as grafana:
        server: Pitcrew = pitcrew_factory(
            "crash",
            config={
                "mode": "auto",
                "guards": {"breaker": {"max_nodes": 10, "max_fraction": 1.0}},
                "grafana": {
                    "url": grafana.url,
                    "token_file": str(tmp_path / "grafana.token"),
                    "retry_backoff_max": "0.5s",
                },
            },
        )
        crash = Crash(server)
        grafana.world.on_create = lambda annotation: crash.fire()
        server.start()
        _, body = server.post_alerts(delivery(node="gpu-node-02"))
        incident = body["opened"][0]
        crash.wait("the annotation to be created")
        assert len(grafana.world.annotations) == 1

        server.start()
        done = server.wait_incident(incident, "resolved", timeout=60)
        made = grafana.world.annotations[1]
        wait_until(lambda: made.time_end is not None, timeout=30, what="the annotation's end")
        # Notices reach Grafana in order, and the outbox has nothing left to send: a wrong second
        # annotation (it would come before the close) has had its chance.
        wait_until(lambda: _pending(server) == 0, timeout=30, what="the outbox drained")

    assert len(grafana.world.annotations) == 1
    assert f"incident:{incident}" in made.tags
    closed = datetime.fromisoformat(done["closed_at"].replace("Z", "+00:00"))
    assert made.time_end == int(closed.timestamp() * 1000)
    methods = [m for m, p, _ in grafana.world.requests if p.startswith("/api/annotations")]
    assert methods.count("POST") == 1
    assert methods.index("GET") > methods.index("POST"), "the restarted pitcrew did not look first"
    assert methods[-1] == "PATCH"


def _pending(server: Pitcrew) -> float:
    """Notices not yet delivered to Grafana (``pitcrew_outbox_pending``), from ``/metrics``."""
    status, body = server.request("GET", "/metrics")
    assert status == 200
    for line in body.decode().splitlines():
        if line.startswith("pitcrew_outbox_pending{") and 'destination="grafana"' in line:
            return float(line.rsplit(" ", 1)[1])
    return float("inf")  # not reported yet: the sender has not looked
