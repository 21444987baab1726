"""The read API (``GET /api/v1/incidents``, ``GET /api/v1/incidents/{id}``) over real HTTP, in process.

Cases: without credentials a read gets 401 and a Bearer challenge; a wrong token, and the
webhook's own token, get 403; the read token and the admin token read; with neither token
configured reads are off (403 naming the key to set); ``allow_unauthenticated_reads`` on a
loopback listen reads without credentials (and is refused on any other listen: see
tests/unit/test_settings.py). The alerts and events of a 250-alert incident come in pages
(``alerts_limit``/``alerts_after``, ``events_limit``/``events_after``) that join up to every row
exactly once and in order, the last page saying there is no next one; without parameters a
page has 100 rows; a limit that is not a number or out of 1..200, and a cursor that is not
one, get 400 and the read nothing. A webhook is answered while a read of the incident is held
in the middle of decoding its rows: reads do not run on the event loop. The ``node`` filter
spells node names as the webhook does (``GPU-NODE-02`` is ``gpu-node-02``) and refuses what is
no node name with 400. ``/metrics`` gives every aggregate series to anyone, the per-incident
series (node, Slack thread) only with the read or admin token (or with reads open to all on
loopback); a wrong token there is a 403. A webhook is answered while a scrape is held in the
middle of collecting a family: ``/metrics`` is not rendered on the event loop either.
"""

from __future__ import annotations

import asyncio
import copy
import json
import threading
from collections.abc import AsyncIterator, Callable, Iterable
from pathlib import Path
from typing import Any

import pytest
from aiohttp import ClientSession
from aiohttp.test_utils import TestServer
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from bot.config import load_config
from bot.runtime import build_app
from bot.store import codec
from bot.web.app import DEPS
from tests.conftest import FIXTURES
from tests.simulator.serve import WorldFile, simulated_ports

AM = FIXTURES / "alertmanager"
WEBHOOK, READ, ADMIN = "webhook-token", "read-token", "admin-token"


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def alerts_body(first: int, count: int, node: str = "gpu-node-02") -> bytes:
    """One delivery of ``count`` distinct XID 79 alerts (fingerprints ``first``…) for ``node``."""
    body = json.loads((AM / "xid79-firing.json").read_text())
    template = body["alerts"][0]
    body["alerts"] = []
    for number in range(first, first + count):
        alert = copy.deepcopy(template)
        alert["fingerprint"] = f"{number:016x}"
        alert["labels"] = {**alert["labels"], "node": node, "Hostname": node}
        body["alerts"].append(alert)
    return json.dumps(body).encode()


@pytest.fixture
async def server(tmp_path: Path) -> AsyncIterator[Callable[..., Any]]:
    servers: list[TestServer] = []
    for name, token in (("webhook", WEBHOOK), ("read", READ), ("admin", ADMIN)):
        (tmp_path / name).write_text(token + "\n")

    async def start(**auth: Any) -> tuple[TestServer, ClientSession]:
        settings = {
            "bearer_token_file": str(tmp_path / "webhook"),
            "read_token_file": str(tmp_path / "read"),
            "admin_token_file": str(tmp_path / "admin"),
            **auth,
        }
        config = load_config(
            None,
            store={"path": str(tmp_path / f"p{len(servers)}.db")},
            server={"auth": settings},
            engine={"poll_interval": "0.1s"},
        )
        ports = simulated_ports(config, WorldFile(journal=tmp_path / "journal.jsonl"))
        test_server = TestServer(build_app(config, ports=ports, allow_simulated=True), host="127.0.0.1")
        await test_server.start_server()
        servers.append(test_server)
        return test_server, ClientSession(base_url=str(test_server.make_url("")))

    yield start
    for each in servers:
        await each.close()


async def post(client: ClientSession, body: bytes) -> dict[str, Any]:
    async with client.post("/api/v1/alerts", data=body, headers=bearer(WEBHOOK)) as r:
        assert r.status == 200, await r.text()
        return dict(await r.json())


async def get(client: ClientSession, path: str, token: str | None = READ) -> tuple[int, Any]:
    async with client.get(path, headers=bearer(token) if token else {}) as r:
        return r.status, await r.json()


async def big_incident(client: ClientSession, alerts: int, per_delivery: int = 50) -> str:
    opened = await post(client, alerts_body(0, per_delivery))
    for first in range(per_delivery, alerts, per_delivery):
        await post(client, alerts_body(first, per_delivery))
    return str(opened["opened"][0])


async def test_reads_need_the_read_or_admin_token(server: Callable[..., Any]) -> None:
    _, client = await server()
    async with client:
        incident = (await post(client, (AM / "xid79-firing.json").read_bytes()))["opened"][0]
        for path in ("/api/v1/incidents", f"/api/v1/incidents/{incident}"):
            async with client.get(path) as r:
                assert r.status == 401
                assert r.headers["WWW-Authenticate"].startswith("Bearer")
                assert "gpu-node-02" not in await r.text()
            for wrong in ("nope", WEBHOOK, READ + "x"):
                status, answer = await get(client, path, wrong)
                assert status == 403 and "gpu-node-02" not in json.dumps(answer)
            for token in (READ, ADMIN):
                status, answer = await get(client, path, token)
                assert status == 200 and "gpu-node-02" in json.dumps(answer)


async def test_reads_are_off_without_a_read_or_admin_token(server: Callable[..., Any]) -> None:
    _, client = await server(read_token_file=None, admin_token_file=None)
    async with client:
        await post(client, (AM / "xid79-firing.json").read_bytes())
        for token in (None, READ, WEBHOOK):
            status, answer = await get(client, "/api/v1/incidents", token)
            assert status == 403
            assert "server.auth.read_token_file" in answer["error"]


async def test_unauthenticated_reads_on_loopback_when_asked_for(server: Callable[..., Any]) -> None:
    _, client = await server(read_token_file=None, allow_unauthenticated_reads=True)
    async with client:
        incident = (await post(client, (AM / "xid79-firing.json").read_bytes()))["opened"][0]
        status, answer = await get(client, f"/api/v1/incidents/{incident}", None)
        assert status == 200 and answer["node"] == "gpu-node-02"


async def read_all(
    client: ClientSession, incident: str, what: str, limit: int
) -> tuple[list[dict[str, Any]], int]:
    """Every ``what`` (alerts or events) of the incident, following the cursor; and the page count."""
    rows: list[dict[str, Any]] = []
    cursor, pages = None, 0
    while True:
        query = f"{what}_limit={limit}" + (f"&{what}_after={cursor}" if cursor else "")
        status, page = await get(client, f"/api/v1/incidents/{incident}?{query}")
        assert status == 200, page
        assert len(page[what]) <= limit
        rows += page[what]
        pages += 1
        cursor = page[f"{what}_next"]
        if cursor is None:
            return rows, pages


async def test_alerts_and_events_come_in_pages(server: Callable[..., Any]) -> None:
    test_server, client = await server()
    store = test_server.app[DEPS].store
    async with client:
        incident = await big_incident(client, 250)
        status, first = await get(client, f"/api/v1/incidents/{incident}")
        assert status == 200
        assert len(first["alerts"]) == 100 and first["alerts_next"] is not None
        assert len(first["events"]) == 100 and first["events_next"] is not None

        alerts, pages = await read_all(client, incident, "alerts", 100)
        assert pages == 3
        want = await store.alerts_of(incident)
        assert len(want) == 250
        assert [a["fingerprint"] for a in alerts] == [a.fingerprint for a in want]

        # The engine is still writing this incident's timeline: the pages hold every event up to
        # the last page read, once and in order — the start of the timeline as read afterwards.
        events, pages = await read_all(client, incident, "events", 64)
        want_events = await store.events_of(incident)
        assert pages == -(-len(events) // 64) and len(events) <= len(want_events)
        assert [e["seq"] for e in events] == [e.seq for e in want_events[: len(events)]]

        # Alerts arriving while a reader pages through come on its later pages.
        status, second = await get(
            client, f"/api/v1/incidents/{incident}?alerts_limit=100&alerts_after={first['alerts_next']}"
        )
        await post(client, alerts_body(250, 5))
        status, rest = await get(
            client, f"/api/v1/incidents/{incident}?alerts_limit=200&alerts_after={second['alerts_next']}"
        )
        assert status == 200 and rest["alerts_next"] is None
        assert [a["fingerprint"] for a in rest["alerts"]][-5:] == [f"{n:016x}" for n in range(250, 255)]
        assert len(rest["alerts"]) == 55


@pytest.mark.parametrize(
    "query",
    [
        "alerts_limit=ten",
        "alerts_limit=0",
        "alerts_limit=201",
        "events_limit=-1",
        "events_after=abc",
        "alerts_after=not-a-cursor",
        "alerts_after=",
    ],
)
async def test_bad_page_parameters_get_400(server: Callable[..., Any], query: str) -> None:
    _, client = await server()
    async with client:
        incident = (await post(client, (AM / "xid79-firing.json").read_bytes()))["opened"][0]
        status, answer = await get(client, f"/api/v1/incidents/{incident}?{query}")
        assert status == 400
        assert query.split("=")[0] in answer["error"]


async def test_a_webhook_is_answered_while_a_read_is_held(
    server: Callable[..., Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    _, client = await server()
    async with client:
        incident = await big_incident(client, 200)
        held, release = threading.Event(), threading.Event()
        decode = codec.alert_from

        def slow_decode(row: Any) -> Any:
            if not held.is_set():
                held.set()
                release.wait(timeout=10)  # a safety net: the test releases it long before
            return decode(row)

        monkeypatch.setattr(codec, "alert_from", slow_decode)
        read = asyncio.create_task(get(client, f"/api/v1/incidents/{incident}"))
        try:
            assert await asyncio.get_running_loop().run_in_executor(None, held.wait, 10)
            answer = await post(client, alerts_body(10_000, 3, node="gpu-node-07"))
            assert answer["opened"], answer
            assert not read.done()  # the read is still held in the middle of its rows
        finally:
            release.set()
        status, page = await read
        assert status == 200 and len(page["alerts"]) == 100


async def test_the_node_filter_spells_nodes_as_the_webhook_does(server: Callable[..., Any]) -> None:
    _, client = await server()
    async with client:
        incident = (await post(client, (AM / "xid79-firing.json").read_bytes()))["opened"][0]
        for spelling in ("gpu-node-02", "GPU-NODE-02", " Gpu-Node-02 "):
            status, answer = await get(client, f"/api/v1/incidents?node={spelling}")
            assert status == 200 and [i["id"] for i in answer["incidents"]] == [incident], spelling
        status, answer = await get(client, "/api/v1/incidents?node=../../etc/passwd")
        assert status == 400 and "is not a Kubernetes node name" in answer["error"]


async def _metrics(client: ClientSession, token: str | None) -> tuple[int, str]:
    async with client.get("/metrics", headers=bearer(token) if token else {}) as r:
        return r.status, await r.text()


async def test_metrics_name_incidents_only_to_who_may_read_them(server: Callable[..., Any]) -> None:
    test_server, client = await server()
    # A lemon names its node too (the fleet dashboard's table of repeat offenders).
    test_server.app[DEPS].metrics.lemon_nodes.labels("gpu-node-07", "gpu-lost").inc()
    async with client:
        incident = (await post(client, (AM / "xid79-firing.json").read_bytes()))["opened"][0]
        deadline = asyncio.get_running_loop().time() + 20
        while "pitcrew_incident_info{" not in (await _metrics(client, READ))[1]:
            assert asyncio.get_running_loop().time() < deadline, "no incident series with the read token"
            await asyncio.sleep(0.05)
        for token in (READ, ADMIN):
            status, text = await _metrics(client, token)
            assert status == 200 and f'incident="{incident}"' in text and 'node="gpu-node-02"' in text
            assert 'pitcrew_lemon_nodes_total{fault_class="gpu-lost",node="gpu-node-07"} 1.0' in text
        status, text = await _metrics(client, None)  # what any peer that reaches the port sees
        assert status == 200 and "pitcrew_incidents_active" in text and "pitcrew_webhook_requests" in text
        assert "pitcrew_incident_info" not in text and "gpu-node-02" not in text and incident not in text
        assert "pitcrew_lemon_nodes" not in text and "gpu-node-07" not in text
        for wrong in ("nope", WEBHOOK):
            status, text = await _metrics(client, wrong)
            assert status == 403 and "gpu-node-02" not in text
    _, client = await server(read_token_file=None, admin_token_file=None, allow_unauthenticated_reads=True)
    async with client:
        incident = (await post(client, (AM / "xid79-firing.json").read_bytes()))["opened"][0]
        deadline = asyncio.get_running_loop().time() + 20
        while f'incident="{incident}"' not in (await _metrics(client, None))[1]:
            assert asyncio.get_running_loop().time() < deadline, "reads open to all: so are the series"
            await asyncio.sleep(0.05)


class _Held(Collector):
    """A family whose collection waits until the test lets it go: a scrape that takes long."""

    def __init__(self) -> None:
        self.collecting, self.release = threading.Event(), threading.Event()

    def collect(self) -> Iterable[Metric]:
        self.collecting.set()
        self.release.wait(10)
        yield GaugeMetricFamily("probe_held", "A family that takes long to collect.", value=1)


async def test_a_slow_scrape_never_holds_the_webhook(server: Callable[..., Any]) -> None:
    test_server, client = await server()
    held = _Held()
    test_server.app[DEPS].metrics.registry.register(held)
    async with client:
        scrape = asyncio.create_task(_metrics(client, READ))
        assert await asyncio.to_thread(held.collecting.wait, 10)
        try:
            # Rendered on the loop, the scrape would hold this delivery until it ended.
            async with asyncio.timeout(5):
                answer = await post(client, (AM / "xid79-firing.json").read_bytes())
            assert answer["opened"] and not scrape.done()
        finally:
            held.release.set()
        status, text = await scrape
        assert status == 200 and "probe_held 1.0" in text
