"""One actor per store: two pitcrew processes on one store act as one — on one SQLite file, and
on one PostgreSQL database (the session's throwaway cluster, ``tests.harness.postgres``), every
case on each.

Both processes run ``serve`` in auto mode on the same store, in front of one simulated far
side (one journal, every call fsynced to it before it returns, 100 ms modelled latency, a
replacement NotReady for 3 s). Each
takes webhooks and commands; only the one holding the store's lease runs playbooks.

Cases: three XID 79 incidents delivered to both (alternately), and a rollback of one sent to
both at once while its replacement is under way: every destructive call reached the far side
exactly once, the rollback was carried out once (both callers get its report, or one is told it
is already under way), and the standby says who leads in /readyz. The leader SIGKILLed in the middle of the playbooks (right after a
DOWN reached Slurm): the standby takes the lease once it lapses, finishes every incident, and no
destructive call is repeated. The leader stopped gracefully (SIGTERM) releases the lease: the
standby takes over at its next look, not after the TTL.
"""

from __future__ import annotations

import json
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from tests.harness.pitcrew import Pitcrew
from tests.harness.proc import wait_until
from tests.harness.scenarios import delivery, destructive_calls, gpu_node, inventory

NODES = ("gpu-node-02", "gpu-node-05", "gpu-node-06")
TTL = 3.0  # seconds: a short lease, so a takeover after SIGKILL is quick to see


@pytest.fixture(params=["sqlite", "postgres"])
def store_config(request: pytest.FixtureRequest, tmp_path: Path) -> dict[str, Any]:
    """The ``store`` settings both processes share: a SQLite file, or a Postgres database."""
    shared = tmp_path / "shared"
    shared.mkdir()
    config: dict[str, Any] = {"path": str(shared / "pitcrew.db")}
    if request.param == "postgres":
        database = request.getfixturevalue("postgres_db")
        config |= {"url": database.url, "password_file": str(database.password_file)}
    return config


def _pair(
    pitcrew_factory: Any, tmp_path: Path, store: dict[str, Any], *, short_lease: bool = True
) -> tuple[Pitcrew, Pitcrew, Path]:
    """Two processes, one store, one far side; the first is started first and leads (with
    ``short_lease``, a TTL of ``TTL``; else the default, and no wait for the first to lead)."""
    shared = tmp_path / "shared"
    journal = shared / "far-side.jsonl"
    nodes = {
        "gpu-node-01": gpu_node(),
        "gpu-node-02": gpu_node("ml-train/llama-worker-2", "monitoring/node-probe"),
        "gpu-node-03": gpu_node(),
        "gpu-node-04": gpu_node(),
        "gpu-node-05": gpu_node("ml-train/bert-worker-0"),
        "gpu-node-06": gpu_node("ml-train/vit-worker-0"),
    }
    jobs = [
        {"job_id": "101", "name": "llama-pretrain", "user": "alice", "node": "gpu-node-02"},
        {"job_id": "102", "name": "bert-finetune", "user": "bob", "node": "gpu-node-05"},
        {"job_id": "103", "name": "vit", "user": "carol", "node": "gpu-node-06"},
    ]
    world = {
        "journal": journal,
        "inventory": inventory(shared / "inventory.yaml", nodes, jobs),
        "latency": "100ms",
        "replace_seconds": "3s",
    }
    config: dict[str, Any] = {
        "mode": "auto",
        "guards": {"breaker": {"max_nodes": 10, "max_fraction": 1.0}},
        "store": dict(store),
    }
    if short_lease:
        config["store"]["lease"] = {"ttl": f"{TTL:g}s", "renew_every": "1s"}
    first = pitcrew_factory("first", config=config, world=world).start()
    if short_lease:
        wait_until(lambda: _role(first) == "leader", timeout=20, what="the first process to lead")
    second = pitcrew_factory("second", config=config, world=world).start()
    return first, second, journal


def _readyz(server: Pitcrew) -> dict[str, Any]:
    status, raw = server.request("GET", "/readyz")
    assert status == 200, raw
    found: dict[str, Any] = json.loads(raw)
    return found


def _role(server: Pitcrew) -> str | None:
    role: str | None = _readyz(server).get("leadership", {}).get("role")
    return role


def _calls(journal: Path) -> Any:
    text = journal.read_text() if journal.exists() else ""
    records = [json.loads(line) for line in text.splitlines() if line.strip()]
    return destructive_calls(records)


def _open_incidents(first: Pitcrew, second: Pitcrew) -> dict[str, str]:
    opened = {}
    for index, node in enumerate(NODES):
        status, body = (first, second)[index % 2].post_alerts(delivery("xid79-firing.json", node=node))
        assert status == 200, body
        opened[node] = body["opened"][0]
    return opened


def _once_each(journal: Path, nodes: tuple[str, ...] = NODES) -> None:
    calls = _calls(journal)
    repeated = {call: n for call, n in calls.items() if n > 1}
    assert not repeated, f"destructive calls that reached the far side more than once: {repeated}"
    for node in nodes:
        for op in ("slurm_down", "cordon", "replace", "slurm_resume"):
            assert calls[(op, node)] == 1, (op, node, calls)
    assert calls[("evict", "ml-train/llama-worker-2")] == 1


def test_two_processes_on_one_store_act_once(
    pitcrew_factory: Any, tmp_path: Path, store_config: dict[str, Any]
) -> None:
    first, second, journal = _pair(pitcrew_factory, tmp_path, store_config, short_lease=False)
    opened = _open_incidents(first, second)
    # A rollback sent to both at once, while the replacement of one node is under way, is
    # carried out once, by the leader.
    target = opened["gpu-node-05"]
    wait_until(lambda: ("replace", "gpu-node-05") in _calls(journal), timeout=60, what="the replacement")
    before = _calls(journal)
    assert {c: n for c, n in before.items() if n > 1} == {}, f"reached the far side more than once: {before}"
    with ThreadPoolExecutor(2) as pool:
        answers = list(
            pool.map(
                lambda s: s.command(f"/api/v1/incidents/{target}/rollback", f"op-{s.port}"), (first, second)
            )
        )
    assert {code for code, _ in answers} <= {200, 409}, answers
    assert 200 in {code for code, _ in answers}, answers
    reports = [body["report"] for code, body in answers if code == 200]
    assert all(report == reports[0] for report in reports), answers
    assert any("resumed" in line for line in reports[0]), reports[0]
    rolled = first.wait_incident(target, "rolled_back", timeout=30)
    assert len([e for e in rolled["events"] if e["kind"] == "rollback_done"]) == 1
    undone = _calls(journal) - before
    assert undone[("slurm_resume", "gpu-node-05")] == 1, undone

    for node in ("gpu-node-02", "gpu-node-06"):
        assert first.wait_incident(opened[node], "resolved", "failed", timeout=90)["state"] == "resolved"
    _once_each(journal, ("gpu-node-02", "gpu-node-06"))
    calls = _calls(journal)
    for op in ("slurm_down", "cordon", "replace", "slurm_resume"):
        assert calls[(op, "gpu-node-05")] == 1, (op, calls)
    leader, standby = _readyz(first)["leadership"], _readyz(second)["leadership"]
    assert (leader["role"], standby["role"]) == ("leader", "standby")
    store = _readyz(second)["detail"]["store"]  # how the shared store keeps what is acknowledged
    status, raw = second.request("GET", "/metrics")
    assert status == 200
    shown = {line for line in raw.decode().splitlines() if line.startswith("pitcrew_store_replication{")}
    if "url" in store_config:  # one server, no standby streaming from it
        assert (store["kind"], store["replication"], store["standbys"]) == ("postgresql", "none", 0), store
        assert 'pitcrew_store_replication{mode="none"} 1.0' in shown, shown
    else:
        assert (store["kind"], store["synchronous"]) == ("sqlite", "FULL"), store
    assert 'pitcrew_store_replication{mode="asynchronous"} 0.0' in shown, shown
    assert (
        standby["leader"] == leader["holder_id"] == leader["leader"]
        and standby["epoch"] == leader["epoch"] == 1
    )


def test_sigkill_of_the_leader_the_standby_finishes_once(
    pitcrew_factory: Any, tmp_path: Path, store_config: dict[str, Any]
) -> None:
    first, second, journal = _pair(pitcrew_factory, tmp_path, store_config)
    opened = _open_incidents(first, second)
    # Killed right after a DOWN reached Slurm, before the leader could record it.
    wait_until(lambda: ("slurm_down", "gpu-node-02") in _calls(journal), timeout=60, what="the first DOWN")
    first.kill()
    killed = time.monotonic()
    wait_until(lambda: _role(second) == "leader", timeout=TTL * 10, what="the standby to take over")
    took_over = time.monotonic() - killed
    for incident in opened.values():
        assert second.wait_incident(incident, "resolved", "failed", timeout=90)["state"] == "resolved"
    _once_each(journal)
    lease = _readyz(second)["leadership"]
    assert lease["epoch"] == 2 and lease["leader"] == lease["holder_id"]
    print(f"\n  takeover after SIGKILL: {took_over:.1f}s (lease TTL {TTL:g}s)")


def test_a_graceful_stop_hands_over_at_once(
    pitcrew_factory: Any, tmp_path: Path, store_config: dict[str, Any]
) -> None:
    first, second, journal = _pair(pitcrew_factory, tmp_path, store_config)
    wait_until(lambda: _role(second) == "standby", timeout=20, what="the second to stand by")
    first.stop()  # SIGTERM: the lease is released
    stopped = time.monotonic()
    wait_until(lambda: _role(second) == "leader", timeout=TTL * 10, what="the standby to take over")
    print(f"\n  takeover after SIGTERM: {time.monotonic() - stopped:.1f}s (lease TTL {TTL:g}s)")
    opened = _open_incidents(second, second)
    for incident in opened.values():
        assert second.wait_incident(incident, "resolved", "failed", timeout=90)["state"] == "resolved"
    _once_each(journal)
    log = first.log.read_text()
    assert '"msg": "lease released"' in log, log[-2000:]
