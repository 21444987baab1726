"""The webhook over real HTTP (in-process server): auth, dedupe, attach, resolved, limits, API.

Cases: Alertmanager's repeats and retries (10 identical deliveries) make one incident; a
second GPU fault on the node attaches to the open incident; a resolved alert — even one
never seen firing — starts nothing, in auto mode; bearer and basic auth; 400/401/403/413;
503 when the store cannot take the write; the incidents API; /metrics, /healthz, /readyz.
Hardening, each answer an error with nothing stored: non-ASCII bytes in ``Authorization`` (a
bearer token ending in NBSP, raw or UTF-8; ``Basic éééé``) are 401.
A ``Content-Encoding`` (on a plain body or a gzipped one) is 400; a ``truncatedAlerts``
beyond uint64 is 400.
A resolved alert redelivered beside a new one (no all-repeats shortcut) is a repeat: it does not
resolve again. A startsAt in the year 9999 is 400 naming the alert, for the whole delivery. One instant
written ``Z`` and ``+01:00`` is one alert, and resolving it resolves it.
``GPU-NODE-07`` and ``gpu-node-07`` are one node with one incident; a trailing zero-width
space, a path or a hostlist as the node is 400 naming the alert and the label, for the
whole delivery.
"""

from __future__ import annotations

import asyncio
import base64
import copy
import gzip
import json
from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from aiohttp import ClientSession
from aiohttp.test_utils import TestServer

from bot.config import load_config
from bot.runtime import build_app
from tests.conftest import FIXTURES
from tests.harness.scenarios import delivery
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


async def raw_post(server: TestServer, headers: bytes, body: bytes) -> tuple[int, bytes]:
    """POST exactly these header bytes (no client library in between to refuse or re-encode them)."""
    reader, writer = await asyncio.open_connection(server.host, server.port)
    try:
        writer.write(
            b"POST /api/v1/alerts HTTP/1.1\r\nHost: pitcrew\r\nContent-Type: application/json\r\n"
            + headers
            + b"Content-Length: %d\r\nConnection: close\r\n\r\n" % len(body)
            + body
        )
        await writer.drain()
        answer = await reader.read()
    finally:
        writer.close()
        await writer.wait_closed()
    head, _, payload = answer.partition(b"\r\n\r\n")
    return int(head.split(b" ", 2)[1]), payload


def bearer(token: bytes = TOKEN.encode()) -> bytes:
    return b"Authorization: Bearer " + token + b"\r\n"


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
        # A firing fault on another node after it: once the engine has acted on that one, it has had
        # its chance to (wrongly) act on the resolved ones.
        sentinel = json.loads(fixture("xid79-firing.json"))
        for alert in sentinel["alerts"]:
            alert["fingerprint"] = "5e" + alert["fingerprint"][2:]
            alert["labels"] = {**alert["labels"], "node": "gpu-node-05", "Hostname": "gpu-node-05"}
        _, opened = await post(client, json.dumps(sentinel).encode())
        journal = tmp_path / "journal.jsonl"
        deadline = asyncio.get_running_loop().time() + 30
        while not (journal.exists() and "gpu-node-05" in journal.read_text()):
            assert asyncio.get_running_loop().time() < deadline, "the engine never acted on the sentinel"
            await asyncio.sleep(0.05)
        assert [i["id"] for i in await incidents(client)] == opened["opened"]
        assert "gpu-node-02" not in journal.read_text()


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


async def test_a_resolved_redelivery_among_new_alerts_resolves_nothing_again(
    server: Callable[..., Any],
) -> None:
    """Alertmanager re-sends a group's resolved alerts beside a new one: the delivery cannot take the
    all-repeats shortcut, and the resolved ones must still count as repeats, not resolve again."""
    _, client = await server()
    async with client:
        await post(client, fixture("xid79-firing.json"))
        _, first = await post(client, fixture("xid79-resolved.json"))
        assert first["resolved"] == 3
        incident_id = (await incidents(client))[0]["id"]
        before = await detail(client, incident_id)
        mixed = json.loads(fixture("xid79-resolved.json"))
        new = copy.deepcopy(json.loads(fixture("xid79-firing.json"))["alerts"][0])
        new["fingerprint"] = "00000000000000a1"
        new["labels"] = {**new["labels"], "node": "gpu-node-05", "Hostname": "gpu-node-05"}
        mixed["alerts"].append(new)
        status, body = await post(client, json.dumps(mixed).encode())
        assert status == 200
        assert (body["new"], body["repeated"], body["resolved"]) == (1, 3, 0), body
        after = await detail(client, incident_id)
        assert sum(e["kind"] == "alert_resolved" for e in after["events"]) == 3
        assert [(a["fingerprint"], a["ends_at"]) for a in after["alerts"]] == [
            (a["fingerprint"], a["ends_at"]) for a in before["alerts"]
        ]


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


async def test_non_ascii_credentials_are_401_and_store_nothing(
    server: Callable[..., Any], tmp_path: Path
) -> None:
    body = fixture("xid79-firing.json")
    test_server, client = await server()
    async with client:
        for header in (
            bearer(TOKEN.encode() + b"\xa0"),  # not UTF-8: aiohttp hands over a lone surrogate
            bearer(TOKEN.encode() + "\u00a0".encode()),  # UTF-8 NBSP, which str.strip() removes
            bearer("\u00e9t\u00e9".encode()),
        ):
            status, answer = await raw_post(test_server, header, body)
            assert status == 401, answer
            assert (
                json.loads(answer)["error"] == "malformed credentials: the Authorization header is not ASCII"
            )
        assert await incidents(client) == []
    (tmp_path / "pw").write_text("s3cret\n")
    basic = {
        "bearer_token_file": None,
        "basic_auth": {"username": "am", "password_file": str(tmp_path / "pw")},
    }
    test_server, client = await server(server={"auth": basic})
    async with client:
        for header in (
            "Authorization: Basic \u00e9\u00e9\u00e9\u00e9\r\n".encode(),
            b"Authorization: Basic \xe9\xe9\r\n",
        ):
            assert (await raw_post(test_server, header, body))[0] == 401
        good = b"Authorization: Basic " + base64.b64encode(b"am:s3cret") + b"\r\n"
        assert (await raw_post(test_server, good, body))[0] == 200  # the same path still lets Alertmanager in


async def test_content_encoding_is_400_and_stores_nothing(server: Callable[..., Any]) -> None:
    body = fixture("xid79-firing.json")
    test_server, client = await server()
    async with client:
        for encoding, sent in ((b"gzip", body), (b"gzip", gzip.compress(body)), (b"br", body)):
            status, answer = await raw_post(
                test_server, bearer() + b"Content-Encoding: " + encoding + b"\r\n", sent
            )
            assert status == 400, answer
            assert json.loads(answer) == {
                "error": f"Content-Encoding {encoding.decode()!r} is not accepted; send plain JSON"
            }
        assert await incidents(client) == []
        assert (await raw_post(test_server, bearer() + b"Content-Encoding: identity\r\n", body))[0] == 200


async def test_truncated_alerts_beyond_uint64_are_400_and_store_nothing(server: Callable[..., Any]) -> None:
    body = json.loads(fixture("xid79-firing.json"))
    body["truncatedAlerts"] = 10**400
    _, client = await server()
    async with client:
        status, answer = await post(client, json.dumps(body).encode())
        assert status == 400
        assert "truncatedAlerts" in answer["error"]
        assert await incidents(client) == []
        body["truncatedAlerts"] = 2**64 - 1
        assert (await post(client, json.dumps(body).encode()))[0] == 200


async def test_a_start_in_the_year_9999_is_400_naming_the_alert(server: Callable[..., Any]) -> None:
    _, client = await server()
    async with client:
        far = json.loads(delivery(node="gpu-node-05", starts=datetime(9999, 1, 1, tzinfo=UTC)))
        status, answer = await post(client, json.dumps(far).encode())
        assert status == 400
        first = far["alerts"][0]
        assert answer["error"].startswith(
            f"delivery refused, nothing of it stored: alerts.0 ({first['labels']['alertname']}, fingerprint"
            f" {first['fingerprint']}): startsAt 9999-01-01T00:00:00+00:00 is more than 10m ahead of pitcrew's clock"
        )
        # One alert of the delivery from the future refuses all of it: the others are not stored either.
        mixed = json.loads(delivery(node="gpu-node-05", starts=datetime.now(UTC)))
        mixed["alerts"][2]["startsAt"] = "9999-01-01T00:00:00Z"
        status, answer = await post(client, json.dumps(mixed).encode())
        assert status == 400
        assert answer["error"].count("alerts.") == 1 and "alerts.2 (" in answer["error"]
        assert await incidents(client) == []


async def test_a_nul_in_what_names_an_alert_is_400_and_one_in_a_description_is_kept(
    server: Callable[..., Any],
) -> None:
    """PostgreSQL's text holds no NUL: a label, fingerprint or group key with one failed its write
    there (a 500, sent again and again) where SQLite kept it. On either store it is now a 400 naming
    the place, nothing stored; a description's is kept, marked, and its alert stored."""
    _, client = await server()
    async with client:
        named = json.loads(delivery(node="gpu-node-05", starts=datetime.now(UTC)))
        named["alerts"][1]["labels"]["alertname"] = "GpuXid\u0000Critical"
        status, answer = await post(client, json.dumps(named).encode())
        assert status == 400
        assert answer["error"] == (
            "not an Alertmanager v4 webhook: alerts.1.labels.alertname: holds a NUL character (\\u0000),"
            " which pitcrew does not store"
        )
        assert await incidents(client) == []
        described = json.loads(delivery(node="gpu-node-05", starts=datetime.now(UTC)))
        described["alerts"][0]["annotations"]["description"] = "fell\u0000off"
        status, answer = await post(client, json.dumps(described).encode())
        assert status == 200 and answer["opened"], answer
        [incident] = await incidents(client)
        assert incident["node"] == "gpu-node-05"


async def test_one_instant_with_two_offsets_is_one_alert(server: Callable[..., Any]) -> None:
    def plus_one_hour(name: str) -> bytes:
        body = json.loads(fixture(name))
        for alert in body["alerts"]:
            assert alert["startsAt"] == "2026-11-29T08:46:36.045Z"
            alert["startsAt"] = "2026-11-29T09:46:36.045+01:00"
        return json.dumps(body).encode()

    _, client = await server()
    async with client:
        _, first = await post(client, fixture("xid79-firing.json"))
        status, again = await post(client, plus_one_hour("xid79-repeat.json"))
        assert status == 200
        assert (again["new"], again["repeated"], again["opened"]) == (0, 3, [])
        _, resolved = await post(client, plus_one_hour("xid79-resolved.json"))
        assert resolved["resolved"] == 3
        record = await detail(client, first["opened"][0])
        assert len(record["alerts"]) == 3
        assert {a["status"] for a in record["alerts"]} == {"resolved"}
        assert {a["starts_at"] for a in record["alerts"]} == {"2026-11-29T08:46:36.045000+00:00"}


async def test_node_label_spellings_are_one_node_and_non_names_are_400(server: Callable[..., Any]) -> None:
    now = datetime.now(UTC)
    _, client = await server()
    async with client:
        _, upper = await post(client, delivery(node="GPU-NODE-07", starts=now))
        _, lower = await post(client, delivery(node="gpu-node-07", starts=now + timedelta(seconds=1)))
        assert upper["new"] == lower["new"] == 3  # different label values: different fingerprints
        assert lower["attached"] == upper["opened"] and not lower["opened"]
        for bad, shown in (
            ("gpu-node-07\u200b", "'gpu-node-07\\u200b' has characters outside ASCII"),
            ("../../etc/passwd", "'../../etc/passwd' is not a Kubernetes node name"),
            ("gpu-node-0[1-9]", "'gpu-node-0[1-9]' is not a Kubernetes node name"),
        ):
            body = json.loads(delivery(node=bad, starts=now))
            status, answer = await post(client, json.dumps(body).encode())
            assert status == 400, bad
            first = body["alerts"][0]
            assert answer["error"].startswith(
                f"delivery refused, nothing of it stored: alerts.0 ({first['labels']['alertname']}, fingerprint"
                f" {first['fingerprint']}): label node {shown}"
            )
        # One alert naming no node refuses the delivery: its good alerts are not stored either.
        mixed = json.loads(delivery(node="gpu-node-08", starts=now))
        mixed["alerts"][1]["labels"]["node"] = "gpu-node-0[1-9]"
        status, answer = await post(client, json.dumps(mixed).encode())
        assert status == 400
        assert "alerts.1 (" in answer["error"] and "alerts.0 (" not in answer["error"]
        found = await incidents(client)
        assert [(i["id"], i["node"]) for i in found] == [(upper["opened"][0], "gpu-node-07")]
        assert len((await detail(client, found[0]["id"]))["alerts"]) == 6
