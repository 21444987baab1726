"""Fencing on Postgres: a leader paused past its lease makes no far-side call when it wakes.

Two ``serve`` processes in auto mode on one real PostgreSQL database (the session's throwaway
cluster), in front of one simulated far side (one journal: every call that changes something is
fsynced to it before it returns, so it is the far side's own count).

Case: XID 79 on one node. The leader is stopped with SIGSTOP exactly between a destructive step's
intent write (its ``steps`` row ``running``, committed) and the far-side call: the test holds
``LOCK TABLE switches`` so the leader's last read before the call (the pause switch, read by the
gated port) waits in Postgres; once it waits with the intent committed, SIGSTOP, then the lock is
let go. The pause outlasts the lease: the standby takes over, carries the incident to its end,
and every destructive call reaches the far side once. Then SIGCONT: the old leader's read
completes, it finds its lease lapsed before the call, makes none, and stands by (its /readyz says
standby and its log says why).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from tests.harness.pitcrew import Pitcrew
from tests.harness.postgres import PostgresDatabase
from tests.harness.proc import wait_until
from tests.harness.scenarios import delivery, destructive_calls, gpu_node, inventory

pytestmark = pytest.mark.slow
TTL = 3.0
NODE = "gpu-node-02"
STEP = "slurm_down"  # the playbook's first destructive step


def _role(server: Pitcrew) -> str | None:
    status, raw = server.request("GET", "/readyz")
    if status != 200:
        return None
    role: str | None = json.loads(raw).get("leadership", {}).get("role")
    return role


def _records(journal: Path) -> list[dict[str, Any]]:
    text = journal.read_text() if journal.exists() else ""
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def _connect(database: PostgresDatabase) -> psycopg.Connection[tuple[Any, ...]]:
    return psycopg.connect(database.url, password=database.server.password)


def _waiting(watch: psycopg.Connection[tuple[Any, ...]]) -> list[str]:
    """The statements of other sessions waiting for a lock."""
    rows = watch.execute(
        "SELECT query FROM pg_stat_activity WHERE pid != pg_backend_pid() AND wait_event_type = 'Lock'"
    ).fetchall()
    return [str(row[0]) for row in rows]


def _intent(watch: psycopg.Connection[tuple[Any, ...]], incident: str) -> bool:
    row = watch.execute(
        "SELECT status FROM steps WHERE incident_id = %s AND step = %s", (incident, STEP)
    ).fetchone()
    return row is not None and row[0] == "running"


@contextlib.contextmanager
def _stopped(process: Any) -> Iterator[None]:
    """SIGSTOP ``process``; SIGCONT on the way out, whatever happens (so teardown can stop it)."""
    os.kill(process.pid, signal.SIGSTOP)
    try:
        yield
    finally:
        os.kill(process.pid, signal.SIGCONT)


def _stop_at(
    database: PostgresDatabase,
    leader: Pitcrew,
    table: str,
    query: str,
    moment: Callable[[psycopg.Connection[tuple[Any, ...]]], bool],
) -> None:
    """SIGSTOP ``leader`` while its statement containing ``query`` waits for ``table``, which the
    test holds, once ``moment`` says it is the right one (a wait at another statement, or at the
    wrong moment: let it go and take the table again); then let the statement go: it completes in
    the server while the leader is stopped."""
    assert leader.process is not None
    with _connect(database) as watch, _connect(database) as holder:
        watch.autocommit = True
        deadline = time.monotonic() + 60
        try:
            while True:  # one connection for the lock: retaking it must be quicker than a write
                assert time.monotonic() < deadline, f"never caught the leader at {query}"
                holder.execute(f"LOCK TABLE {table} IN ACCESS EXCLUSIVE MODE")
                wait_until(lambda: bool(_waiting(watch)), timeout=30, interval=0.002, what=f"{table} wanted")
                if any(query in waiting for waiting in _waiting(watch)) and moment(watch):
                    os.kill(leader.process.pid, signal.SIGSTOP)
                    return
                holder.commit()
        finally:
            holder.commit()  # let the statement go (the stopped leader does not see its answer yet)


def _pair(pitcrew_factory: Any, tmp_path: Path, database: PostgresDatabase) -> tuple[Pitcrew, Pitcrew, Path]:
    """The leader and a standby on ``database``, one job on ``NODE``; the far side's journal."""
    shared = tmp_path / "shared"
    shared.mkdir()
    journal = shared / "far-side.jsonl"
    nodes = {"gpu-node-01": gpu_node(), NODE: gpu_node("ml-train/llama-worker-2"), "gpu-node-03": gpu_node()}
    jobs = [{"job_id": "101", "name": "llama-pretrain", "user": "alice", "node": NODE}]
    world = {"journal": journal, "inventory": inventory(shared / "inventory.yaml", nodes, jobs)}
    config = {
        "mode": "auto",
        "guards": {"breaker": {"max_nodes": 10, "max_fraction": 1.0}},
        "store": {
            "path": str(shared / "unused.db"),
            "url": database.url,
            "password_file": str(database.password_file),
            "lease": {"ttl": f"{TTL:g}s", "renew_every": "1s"},
        },
    }
    first = pitcrew_factory("first", config=config, world=world).start()
    wait_until(lambda: _role(first) == "leader", timeout=20, what="the first process to lead")
    second = pitcrew_factory("second", config=config, world=world).start()
    assert _role(second) == "standby"
    return first, second, journal


def _once_each(journal: Path) -> None:
    calls = destructive_calls(_records(journal))
    assert {c: n for c, n in calls.items() if n > 1} == {}, calls
    for op in ("slurm_down", "cordon", "replace", "slurm_resume"):
        assert calls[(op, NODE)] == 1, (op, calls)
    assert calls[("evict", "ml-train/llama-worker-2")] == 1, calls


def test_a_leader_paused_past_its_lease_makes_no_call_when_it_wakes(
    pitcrew_factory: Any, tmp_path: Path, postgres_db: PostgresDatabase
) -> None:
    first, second, journal = _pair(pitcrew_factory, tmp_path, postgres_db)
    status, body = second.post_alerts(delivery("xid79-firing.json", node=NODE))
    assert status == 200, body
    incident = body["opened"][0]
    assert first.process is not None
    _stop_at(
        postgres_db,
        first,
        "switches",
        "FROM switches",
        lambda watch: _intent(watch, incident) and not destructive_records(_records(journal)),
    )
    with _stopped(first.process):
        paused = time.monotonic()
        wait_until(lambda: _role(second) == "leader", timeout=TTL * 10, what="the standby to take over")
        took_over = time.monotonic() - paused
        final = second.wait_incident(incident, "resolved", "failed", timeout=90)
        assert final["state"] == "resolved", final.get("outcome")
        before = len(_records(journal))
    # SIGCONT (leaving the block): the old leader's read of the switch completes now.
    wait_until(lambda: _role(first) == "standby", timeout=20, what="the woken leader to stand by")
    wait_until(
        lambda: '"msg": "stepped down: standing by"' in first.log.read_text(), timeout=20, what="step-down"
    )
    late = destructive_records(_records(journal)[before:])
    assert late == [], f"far-side calls after the old leader woke: {late}"
    _once_each(journal)
    log = first.log.read_text()
    [why] = [
        json.loads(line)["why"] for line in log.splitlines() if '"msg": "stepped down: standing by"' in line
    ]
    assert "may have lapsed" in why or "taken over by another process" in why, why
    print(
        f"\n  takeover after SIGSTOP: {took_over:.1f}s (lease TTL {TTL:g}s); old leader made no call on waking"
    )


def destructive_records(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The records that count as destructive calls (as ``destructive_calls`` counts them)."""
    return [r for r in records if destructive_calls([r])]


def test_a_leader_frozen_inside_a_write_does_not_freeze_the_store(
    pitcrew_factory: Any, tmp_path: Path, postgres_db: PostgresDatabase
) -> None:
    """SIGSTOP inside a write transaction (its intent inserted, not committed): the frozen
    session holds the write lock and the lease row ``FOR SHARE``. PostgreSQL ends that session
    (pitcrew's sessions have an idle-in-transaction limit), so the standby takes over and
    finishes; the woken leader's commit fails and it calls no far side."""
    first, second, journal = _pair(pitcrew_factory, tmp_path, postgres_db)
    status, body = second.post_alerts(delivery("xid79-firing.json", node=NODE))
    assert status == 200, body
    incident = body["opened"][0]
    assert first.process is not None
    _stop_at(postgres_db, first, "steps", "INSERT INTO steps", lambda watch: True)
    with _stopped(first.process):
        paused = time.monotonic()
        wait_until(lambda: _role(second) == "leader", timeout=TTL * 10, what="the standby to take over")
        took_over = time.monotonic() - paused
        final = second.wait_incident(incident, "resolved", "failed", timeout=90)
        assert final["state"] == "resolved", final.get("outcome")
        before = len(_records(journal))
    wait_until(lambda: _role(first) == "standby", timeout=20, what="the woken leader to stand by")
    assert destructive_records(_records(journal)[before:]) == []
    _once_each(journal)
    print(f"\n  takeover with the leader frozen inside a write: {took_over:.1f}s (lease TTL {TTL:g}s)")
