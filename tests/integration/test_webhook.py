"""The webhook over real HTTP (in-process server): auth, dedupe, attach, resolved, limits, API.

Cases: Alertmanager's repeats and retries (10 identical deliveries) make one incident; a
second GPU fault on the node attaches to the open incident; a resolved alert — even one
never seen firing — starts nothing, in auto mode; bearer and basic auth; 400/401/403/413;
503 when the store cannot take the write; the incidents API; /metrics, /healthz, /readyz.
"""

from __future__ import annotations

import asyncio
import base64
import json
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
from aiohttp import ClientSession
from aiohttp.test_utils import TestServer

from bot.config import load_config
from bot.runtime import build_app
from tests.conftest import FIXTURES
from tests.simulator.serve import WorldFile, simulated_ports

AM = FIXTURES / "alertmanager"
TOKEN = "t0ken-for-tests"
READ = "read-t0ken-for-tests"


def fixture(name: str) -> bytes:
    return (AM / name).read_bytes()


@pytest.fixture
async def server(tmp_path: Path) -> AsyncIterator[Callable[..., Any]]:
    servers: list[TestServer] = []

    async def start(**settings: Any) -> tuple[TestServer, ClientSession]:
        (tmp_path / "token").write_text(TOKEN + "\n")
        (tmp_path / "read-token").write_text(READ + "\n")
        auth = {"bearer_token_file": str(tmp_path / "token"), "read_token_file": str(tmp_path / "read-token")}
        base: dict[str, Any] = {
            "store": {"path": str(tmp_path / f"p{len(servers)}.db")},
            "server": {"auth": auth},
            "engine": {"poll_interval": "0.1s"},
        }
        for key, value in settings.items():
            base[key] = {**base.get(key, {}), **value} if isinstance(value, dict) else value
        config = load_config(None, **base)
        # The simulated far side, so that auto mode could act (and the tests see that it does not).
        ports = simulated_ports(config, WorldFile(journal=tmp_path / "journal.jsonl"))
        test_server = TestServer(build_app(config, ports=ports, allow_simulated=True), host="127.0.0.1")
        await test_server.start_server()
        servers.append(test_server)
        return test_server, ClientSession(base_url=str(test_server.make_url("")))

    yield start
    for s in servers:
        await s.close()


async def post(client: ClientSession, body: bytes, token: str = TOKEN) -> tuple[int, dict[str, Any]]:
    async with client.post("/api/v1/alerts", data=body, headers={"Authorization": f"Bearer {token}"}) as r:
        return r.status, await r.json()


async def incidents(client: ClientSession) -> list[dict[str, Any]]:
    async with client.get("/api/v1/incidents", headers={"Authorization": f"Bearer {READ}"}) as r:
        assert r.status == 200
        return list((await r.json())["incidents"])


async def detail(client: ClientSession, incident_id: str) -> dict[str, Any]:
    async with client.get(
        f"/api/v1/incidents/{incident_id}", headers={"Authorization": f"Bearer {READ}"}
    ) as r:
        assert r.status == 200
        return dict(await r.json())


async def test_ten_identical_deliveries_make_one_incident(server: Callable[..., Any]) -> None:
    _, client = await server()
    async with client:
        statuses = [await post(client, fixture("xid79-firing.wire.json")) for _ in range(10)]
        assert [s for s, _ in statuses] == [200] * 10
        assert statuses[0][1]["new"] == 3
        assert all(body["new"] == 0 and body["repeated"] == 3 for _, body in statuses[1:])
        # Concurrent, overlapping redeliveries (Alertmanager's retries) change nothing either.
        await asyncio.gather(*(post(client, fixture("xid79-repeat.json")) for _ in range(10)))
        found = await incidents(client)
        assert len(found) == 1
        record = await detail(client, found[0]["id"])
        assert {a["fingerprint"]: a["deliveries"] for a in record["alerts"]} == {
            "8dd43c753491e259": 20,
            "8909f72b4ad89758": 20,
            "54faa5ba6fe53303": 20,
        }
        assert [f["key"] for f in record["faults"]] == ["xid79@gpu3"]
        assert sum(e["kind"] == "incident_opened" for e in record["events"]) == 1


async def test_second_gpu_fault_attaches_to_the_open_incident(server: Callable[..., Any]) -> None:
    _, client = await server()
    async with client:
        _, first = await post(client, fixture("xid79-firing.json"))
        _, second = await post(client, fixture("two-faults-same-node.json"))
        assert first["opened"] and not second["opened"]
        assert second["attached"] == first["opened"]
        found = await incidents(client)
        assert len(found) == 1
        assert {f["key"] for f in found[0]["faults"]} == {"xid79@gpu3", "ecc-dbe@gpu5"}


async def test_resolved_alert_never_starts_an_action(server: Callable[..., Any], tmp_path: Path) -> None:
    _, client = await server(mode="auto")
    async with client:
        status, body = await post(client, fixture("xid79-resolved.json"))
        assert status == 200
        assert body["resolved"] == 3 and not body["opened"]
        await asyncio.sleep(0.5)  # give the engine every chance to (wrongly) act
        assert await incidents(client) == []
        journal = tmp_path / "journal.jsonl"
        assert not journal.exists() or journal.read_text() == ""


async def test_resolution_of_a_seen_alert_is_recorded(server: Callable[..., Any]) -> None:
    _, client = await server()
    async with client:
        await post(client, fixture("xid79-firing.json"))
        _, body = await post(client, fixture("xid79-resolved.json"))
        assert body["resolved"] == 3 and body["repeated"] == 3
        # A stale firing redelivery arriving late never un-resolves.
        await post(client, fixture("xid79-repeat.json"))
        record = await detail(client, (await incidents(client))[0]["id"])
        assert {a["status"] for a in record["alerts"]} == {"resolved"}
        assert sum(e["kind"] == "alert_resolved" for e in record["events"]) == 3


async def test_auth(server: Callable[..., Any], tmp_path: Path) -> None:
    _, client = await server()
    async with client:
        async with client.post("/api/v1/alerts", data=fixture("xid79-firing.json")) as r:
            assert r.status == 401
            assert r.headers["WWW-Authenticate"].startswith("Bearer")
        assert (await post(client, fixture("xid79-firing.json"), token="wrong"))[0] == 403
        assert await incidents(client) == []
    (tmp_path / "pw").write_text("s3cret\n")
    _, client = await server(
        server={
            "auth": {
                "bearer_token_file": None,
                "basic_auth": {"username": "am", "password_file": str(tmp_path / "pw")},
            }
        }
    )
    async with client:
        good = base64.b64encode(b"am:s3cret").decode()
        bad = base64.b64encode(b"am:nope").decode()
        async with client.post(
            "/api/v1/alerts", data=fixture("xid79-firing.json"), headers={"Authorization": f"Basic {good}"}
        ) as r:
            assert r.status == 200
        async with client.post(
            "/api/v1/alerts", data=fixture("xid79-firing.json"), headers={"Authorization": f"Basic {bad}"}
        ) as r:
            assert r.status == 403
        async with client.post(
            "/api/v1/alerts", data=fixture("xid79-firing.json"), headers={"Authorization": "Basic !!!"}
        ) as r:
            assert r.status == 401


async def test_bad_input_gets_a_clear_4xx(server: Callable[..., Any]) -> None:
    _, client = await server(server={"max_body_bytes": 4096})
    async with client:
        status, body = await post(client, b'{"version": "4", "status": "firing", "alerts": "nope"}')
        assert status == 400
        assert "alerts" in body["error"]
        status, body = await post(client, b"x" * 10_000)
        assert status == 413
        assert "max_body_bytes" in body["error"]
        status, _ = await post(client, fixture("xid79-firing.json"))
        assert status == 200  # still serving


async def test_store_unavailable_asks_for_redelivery(server: Callable[..., Any]) -> None:
    test_server, client = await server()
    async with client:
        from bot.web.app import DEPS

        deps = test_server.app[DEPS]
        await deps.store.close()  # the disk went away
        status, body = await post(client, fixture("xid79-firing.json"))
        assert status == 503
        assert "retry" in body["error"]
        async with client.get("/readyz") as r:
            assert r.status == 503
        await deps.store.open()
        assert (await post(client, fixture("xid79-firing.json")))[0] == 200


async def test_unroutable_alerts_are_kept_and_never_acted_on(server: Callable[..., Any]) -> None:
    _, client = await server(mode="auto")
    async with client:
        body = json.loads(fixture("exporter-down-firing.json"))
        for alert in body["alerts"]:
            alert["labels"] = {"alertname": "PitcrewSomething", "severity": "warning"}
        status, answer = await post(client, json.dumps(body).encode())
        assert status == 200
        assert answer["unroutable"] == 1 and not answer["opened"]
        assert await incidents(client) == []


async def test_health_ready_and_metrics(server: Callable[..., Any]) -> None:
    _, client = await server()
    async with client:
        await post(client, fixture("xid79-firing.json"))
        await post(client, b"{}")
        async with client.get("/healthz") as r:
            assert r.status == 200
        async with client.get("/readyz") as r:
            assert r.status == 200
            assert (await r.json())["checks"]["store"] is True
        async with client.get("/metrics") as r:
            text = await r.text()
        assert 'pitcrew_webhook_requests_total{code="200"} 1.0' in text
        assert 'pitcrew_webhook_requests_total{code="400"} 1.0' in text
        assert 'pitcrew_alerts_received_total{outcome="new"} 3.0' in text
        assert "pitcrew_incidents_opened_total 1.0" in text
        async with client.get("/api/v1/incidents/pc-99999", headers={"Authorization": f"Bearer {READ}"}) as r:
            assert r.status == 404
