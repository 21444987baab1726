"""pitcrew as a real process: any body never yields a 5xx, and a SIGKILL after 200 loses nothing.

Cases: hypothesis throws random JSON, valid payloads with wrong types, huge arrays and
invalid UTF-8 at the running server — every answer is 2xx or 4xx and the server keeps
serving; SIGKILL right after a 200 and the alert (and its incident) are in the store
after the restart; after SIGTERM with ``server.shutdown_delay`` it serves on (not ready) for the
delay and then stops, a second signal at once.
"""

from __future__ import annotations

import json
import signal
import time
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from proving_ground.proc import wait_until
from tests.conftest import FIXTURES
from tests.harness.pitcrew import Pitcrew

VALID = json.loads((FIXTURES / "alertmanager" / "two-faults-same-node.json").read_text())

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=50),
    lambda inner: st.lists(inner, max_size=5) | st.dictionaries(st.text(max_size=10), inner, max_size=5),
    max_leaves=30,
)


@st.composite
def mutated_payloads(draw: st.DrawFn) -> bytes:
    """A real payload with one field replaced by something of the wrong type or shape."""
    body: Any = json.loads(json.dumps(VALID))
    path = draw(
        st.sampled_from(
            [
                ("version",),
                ("status",),
                ("alerts",),
                ("groupLabels",),
                ("truncatedAlerts",),
                ("alerts", 0, "labels"),
                ("alerts", 0, "startsAt"),
                ("alerts", 0, "fingerprint"),
                ("alerts", 0, "status"),
                ("alerts", 0, "labels", "node"),
                ("alerts", 0, "annotations"),
                ("alerts", 1, "labels", "xid"),
                ("alerts", 2, "endsAt"),
            ]
        )
    )
    target = body
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = draw(json_values)
    return json.dumps(body).encode()


huge_arrays = st.integers(min_value=1_000, max_value=20_000).map(
    lambda n: json.dumps({**VALID, "alerts": [VALID["alerts"][0]] * n}).encode()
)
bodies = st.one_of(
    json_values.map(lambda v: json.dumps(v).encode()),
    mutated_payloads(),
    st.binary(max_size=2_000),  # mostly invalid UTF-8
    st.binary(max_size=200).map(lambda b: b'{"version": "4", "alerts": ["' + b + b'"]}'),
    huge_arrays,
)


@pytest.fixture(scope="module")
def running(tmp_path_factory: pytest.TempPathFactory) -> Any:
    server = Pitcrew(tmp_path_factory.mktemp("fuzz"), config={"mode": "observe"}, simulated=False).start()
    yield server
    server.stop()


@settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(body=bodies)
def test_any_body_gets_2xx_or_4xx_never_5xx(running: Pitcrew, body: bytes) -> None:
    status, raw = running.request(
        "POST", "/api/v1/alerts", body, {"Authorization": f"Bearer {running.token}"}
    )
    assert 200 <= status < 500, (status, raw[:300])
    assert running.alive


def test_server_still_serves_after_the_fuzzing(running: Pitcrew) -> None:
    status, _ = running.post_alerts((FIXTURES / "alertmanager" / "xid79-firing.json").read_bytes())
    assert status == 200
    assert running.request("GET", "/healthz")[0] == 200


def test_sigkill_right_after_200_loses_nothing(pitcrew_factory: Any) -> None:
    server: Pitcrew = pitcrew_factory("crash", config={"mode": "observe"}, simulated=False).start()
    status, body = server.post_alerts((FIXTURES / "alertmanager" / "xid79-firing.json").read_bytes())
    assert status == 200
    server.kill()  # no graceful shutdown, nothing flushed by us after the answer
    server.start()
    found = server.incidents("gpu-node-02")
    assert [i["id"] for i in found] == body["opened"]
    record = server.incident(found[0]["id"])
    assert {a["fingerprint"] for a in record["alerts"]} == {
        "8dd43c753491e259",
        "8909f72b4ad89758",
        "54faa5ba6fe53303",
    }
    # The redelivery Alertmanager would make after a crash is recognised, not doubled.
    status, again = server.post_alerts((FIXTURES / "alertmanager" / "xid79-repeat.json").read_bytes())
    assert status == 200
    assert again["repeated"] == 3 and not again["opened"]


def test_incidents_cli_reads_the_store(pitcrew_factory: Any) -> None:
    import subprocess
    import sys

    server: Pitcrew = pitcrew_factory("cli", config={"mode": "observe"}, simulated=False).start()
    _, body = server.post_alerts((FIXTURES / "alertmanager" / "two-faults-same-node.json").read_bytes())
    [incident_id] = body["opened"]
    server.stop()

    def cli(*args: str) -> str:
        done = subprocess.run(
            [sys.executable, "-m", "bot.cli", *args, "--config", str(server.config_path)],
            capture_output=True,
            text=True,
            check=True,
        )
        return done.stdout

    listed = json.loads(cli("incidents", "--json"))
    assert [i["id"] for i in listed] == [incident_id]
    assert "gpu-node-02" in cli("incidents")
    shown = json.loads(cli("incidents", "show", incident_id, "--json"))
    assert shown["node"] == "gpu-node-02"
    assert len(shown["alerts"]) == 4
    assert shown["events"][0]["kind"] == "incident_opened"
    assert "timeline:" in cli("incidents", "show", incident_id)


def test_after_sigterm_it_serves_on_for_the_shutdown_delay_then_stops(pitcrew_factory: Any) -> None:
    """A terminating pod leaves its Service's endpoints as SIGTERM is sent, and kube-proxy, an
    ingress controller or a load balancer go on sending to it for a few seconds: with
    ``server.shutdown_delay`` it answers meanwhile (``/readyz`` 503 ``stopping``, a webhook stored),
    then stops by itself, gracefully."""
    delay = 3.0
    config = {"mode": "observe", "server": {"shutdown_delay": f"{delay:g}s"}}
    server: Pitcrew = pitcrew_factory("drain", config=config, simulated=False).start()
    process = server.process
    assert process is not None
    signalled = time.monotonic()
    process.send_signal(signal.SIGTERM)
    wait_until(lambda: server.request("GET", "/readyz")[0] == 503, timeout=10, what="/readyz 503")
    status, raw = server.request("GET", "/readyz")
    assert json.loads(raw)["status"] == "stopping"
    status, body = server.post_alerts((FIXTURES / "alertmanager" / "xid79-firing.json").read_bytes())
    assert status == 200 and body["opened"]
    assert server.alive and server.request("GET", "/healthz")[0] == 200
    assert process.wait(timeout=delay + 20) == 0
    assert time.monotonic() - signalled >= delay
    server.process = None
    server.start()  # what it took while stopping is stored
    assert [i["id"] for i in server.incidents("gpu-node-02")] == body["opened"]


def test_a_second_signal_stops_at_once(pitcrew_factory: Any) -> None:
    config = {"mode": "observe", "server": {"shutdown_delay": "120s"}}
    server: Pitcrew = pitcrew_factory("drain-twice", config=config, simulated=False).start()
    process = server.process
    assert process is not None
    process.send_signal(signal.SIGTERM)
    wait_until(lambda: server.request("GET", "/readyz")[0] == 503, timeout=10, what="/readyz 503")
    process.send_signal(signal.SIGINT)
    assert process.wait(timeout=30) == 0  # not the 120 s the delay would have held it
    server.process = None
