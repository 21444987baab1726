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

import contextlib
import json
import signal
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from bot.store.schema import SCHEMA_VERSION
from proving_ground.postgres import PostgresServer
from tests.conftest import FIXTURES
from tests.harness.pitcrew import Pitcrew
from tests.harness.postgres import running_postgres
from tests.harness.proc import wait_until
from tests.harness.stores import newer_schema

XID79 = (FIXTURES / "alertmanager" / "xid79-firing.json").read_bytes()


def _config(url: str, password: Path) -> dict[str, Any]:
    return {"mode": "observe", "store": {"url": url, "password_file": str(password)}}


@contextlib.contextmanager
def _started_while_away(
    factory: Any, tmp_path: Path, prepare: Callable[[PostgresServer, dict[str, Any]], None] | None = None
) -> Iterator[tuple[PostgresServer, str, Pitcrew]]:
    """A database of its own on a cluster of its own (``prepare`` may use it first); the cluster
    stopped; pitcrew started on it, serving (``/healthz``) with the store away."""
    with running_postgres() as server:
        database = server.create_database()
        config = _config(server.url(database), server.password_file(tmp_path / "pg-password"))
        if prepare is not None:
            prepare(server, config)
        server.stop()
        crew: Pitcrew = factory("crew", config=config, simulated=False)
        crew.start(ready=False, timeout=60)
        yield server, database, crew


def test_started_while_postgres_is_away_it_serves_unready_and_opens_the_store_once_back(
    pitcrew_factory: Any, tmp_path: Path
) -> None:
    with _started_while_away(pitcrew_factory, tmp_path) as (server, _, crew):
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
    with _started_while_away(pitcrew_factory, tmp_path) as (_, _, crew):
        assert crew.process is not None
        crew.process.send_signal(signal.SIGTERM)
        assert crew.process.wait(timeout=20) == 0
        crew.process = None
        assert "Traceback" not in crew.log.read_text()


def test_a_store_found_refused_once_postgres_is_back_stops_pitcrew_with_one_line(
    pitcrew_factory: Any, tmp_path: Path
) -> None:
    def migrated_by_a_newer_pitcrew(server: PostgresServer, config: dict[str, Any]) -> None:
        first: Pitcrew = pitcrew_factory("first", config=config, simulated=False)
        first.start()
        first.stop()
        database = config["store"]["url"].rsplit("/", 1)[1]
        with server.connect(database) as conn:  # a newer pitcrew's migration this one may not run after
            for statement in newer_schema(False, SCHEMA_VERSION + 1, SCHEMA_VERSION + 1):
                conn.execute(statement)

    with _started_while_away(pitcrew_factory, tmp_path, migrated_by_a_newer_pitcrew) as (server, name, crew):
        server.start()
        assert crew.process is not None
        assert crew.process.wait(timeout=60) == 1
        crew.process = None
        log = crew.log.read_text()
        assert f"pitcrew: postgresql://127.0.0.1:{server.port}/{name} has schema {SCHEMA_VERSION + 1}" in log
        assert "newer than this pitcrew" in log and "Traceback" not in log
