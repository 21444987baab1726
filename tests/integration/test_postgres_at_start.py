"""pitcrew started while its Postgres is away (a pod rolled out, or rescheduled off a lost node,
during an outage): it serves at once, not ready, and opens the store once Postgres is back,
without a restart; stopped meanwhile, it exits at once; a store found then that this pitcrew must
not open stops it with one line.

Before, the start failed after the pool's connect timeout with a traceback, and the kubelet's
restarts backed off up to five minutes, which the pod could stay down after Postgres was back.
Meanwhile webhooks answer 503 with ``Retry-After`` (Alertmanager sends them again), and so do the
read API and the commands, which answered 500 while the store was away.
"""

from __future__ import annotations

import json
import signal
from pathlib import Path
from typing import Any

import psycopg

from bot.store.schema import SCHEMA_VERSION
from tests.conftest import FIXTURES
from tests.harness.pitcrew import Pitcrew
from tests.harness.postgres import running_postgres
from tests.harness.proc import wait_until

XID79 = (FIXTURES / "alertmanager" / "xid79-firing.json").read_bytes()


def _config(url: str, password: Path) -> dict[str, Any]:
    return {"mode": "observe", "store": {"url": url, "password_file": str(password)}}


def test_started_while_postgres_is_away_it_serves_unready_and_opens_the_store_once_back(
    pitcrew_factory: Any, tmp_path: Path
) -> None:
    with running_postgres() as server:
        name = server.create_database()
        password = server.password_file(tmp_path / "pg-password")
        server.stop()
        crew: Pitcrew = pitcrew_factory("early", config=_config(server.url(name), password), simulated=False)
        crew.start(ready=False, timeout=60)  # /healthz answers with the store away
        status, raw = crew.request("GET", "/readyz")
        assert status == 503 and json.loads(raw)["checks"]["store"] is False
        status, answer = crew.post_alerts(XID79)
        assert status == 503 and answer == {"error": "store unavailable, retry"}
        status, raw = crew.read("/api/v1/incidents")
        assert status == 503, raw
        assert json.loads(raw) == {"error": "store unavailable, retry"}
        status, answer = crew.command("/api/v1/pause", "ops@example.com", reason="maintenance")
        assert status == 503, answer

        server.start()
        wait_until(lambda: crew.request("GET", "/readyz")[0] == 200, timeout=60, what="/readyz 200")
        status, body = crew.post_alerts(XID79)
        assert status == 200 and body["opened"], body
        ready = json.loads(crew.request("GET", "/readyz")[1])
        assert ready["leadership"]["role"] == "leader"  # the workers started with the store
        assert crew.alive and crew.starts == 1
        assert [i["id"] for i in crew.incidents("gpu-node-02")] == body["opened"]
        log = crew.log.read_text()
        assert "store unavailable at start" in log and "Traceback" not in log


def test_stopped_while_waiting_for_postgres_it_exits_at_once(pitcrew_factory: Any, tmp_path: Path) -> None:
    with running_postgres() as server:
        name = server.create_database()
        password = server.password_file(tmp_path / "pg-password")
        server.stop()
        crew: Pitcrew = pitcrew_factory(
            "stopped", config=_config(server.url(name), password), simulated=False
        )
        crew.start(ready=False, timeout=60)
        assert crew.process is not None
        crew.process.send_signal(signal.SIGTERM)
        assert crew.process.wait(timeout=20) == 0
        crew.process = None
        assert "Traceback" not in crew.log.read_text()


def test_a_store_found_refused_once_postgres_is_back_stops_pitcrew_with_one_line(
    pitcrew_factory: Any, tmp_path: Path
) -> None:
    with running_postgres() as server:
        name = server.create_database()
        password = server.password_file(tmp_path / "pg-password")
        first: Pitcrew = pitcrew_factory("first", config=_config(server.url(name), password), simulated=False)
        first.start()
        first.stop()
        with server.connect(name) as conn:  # migrated since by a newer pitcrew, which this one may not run on
            conn.execute(
                psycopg.sql.SQL("UPDATE pitcrew_schema SET version = {v}, compatible_from = {v}").format(
                    v=psycopg.sql.Literal(SCHEMA_VERSION + 1)
                )
            )
        server.stop()
        crew: Pitcrew = pitcrew_factory("late", config=_config(server.url(name), password), simulated=False)
        crew.start(ready=False, timeout=60)
        server.start()
        assert crew.process is not None
        assert crew.process.wait(timeout=60) == 1
        crew.process = None
        log = crew.log.read_text()
        assert f"pitcrew: postgresql://127.0.0.1:{server.port}/{name} has schema {SCHEMA_VERSION + 1}" in log
        assert "newer than this pitcrew" in log and "Traceback" not in log
