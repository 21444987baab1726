"""Fencing on Postgres: a leader paused past its lease makes no far-side call when it wakes.

Two ``serve`` processes in auto mode on one real PostgreSQL database (the session's throwaway
cluster), in front of the real far sides (``tests.e2e.replicas``): the session's Slurm cluster,
the Kubernetes API emulator and the Slack stand-in. What reached each far side is read from its
own record: slurmctld's log, the emulator's request log, the stand-in's calls.

Cases: XID 79 on one node, the leader stopped with SIGSTOP

* exactly between a destructive step's intent write (its ``steps`` row ``running``, committed)
  and the far-side call: the test holds ``LOCK TABLE switches`` so the leader's last read before
  the call (the pause switch, read by the gated port) waits in Postgres; once it waits with the
  intent committed and nothing has reached Slurm or the emulator, SIGSTOP, then the lock is let go;
* inside a write transaction (its intent inserted, not committed): the frozen session holds the
  write lock and the lease row ``FOR SHARE``; PostgreSQL ends that session (pitcrew's sessions
  have an idle-in-transaction limit).

Either way the pause outlasts the lease: the standby takes over, carries the incident to its end
(Slurm saw the node DOWN once, with its DRAIN, and RESUMEd once; the emulator saw one cordon, one eviction, one
Machine delete; the Slack thread has each message once). Then SIGCONT: the old leader finds its
lease lapsed, stands by (its /readyz says standby and its log says why), and no far side sees
anything more.
"""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from proving_ground.slurm import SlurmCluster
from tests.e2e.replicas import Mark, Pair, once_each, role, running_pair, stepped_down, took_over
from tests.e2e.store_moments import catch_at, intent
from tests.harness.figures import show_figure
from tests.harness.postgres import PostgresDatabase
from tests.harness.proc import wait_until
from tests.harness.scenarios import delivery

pytestmark = pytest.mark.slow
TTL = 3.0
STEP = "slurm_down"  # the playbook's first destructive step


@pytest.fixture
def pair(
    slurm: SlurmCluster, postgres_db: PostgresDatabase, pitcrew_factory: Any, tmp_path: Path
) -> Iterator[Pair]:
    with running_pair(slurm, postgres_db, pitcrew_factory, tmp_path / "far", ttl=TTL) as started:
        yield started


@contextlib.contextmanager
def _stopped(process: Any) -> Iterator[None]:
    """SIGSTOP ``process``; SIGCONT on the way out, whatever happens (so teardown can stop it)."""
    os.kill(process.pid, signal.SIGSTOP)
    try:
        yield
    finally:
        os.kill(process.pid, signal.SIGCONT)


def _open(pair: Pair) -> Callable[[], str]:
    """Posting the alert to the standby (as ``catch_at``'s ``begin``); the incident it opened."""

    def post() -> str:
        status, body = pair.standby.post_alerts(delivery("xid79-firing.json", node=pair.node))
        assert status == 200, body
        opened: str = body["opened"][0]
        return opened

    return post


def _paused_through_takeover(pair: Pair, incident: str) -> tuple[float, Mark]:
    """With the leader already SIGSTOPped: the standby takes over and ends the incident, the
    outbox delivers its last notice; then SIGCONT, and the woken leader stands by and says why.
    The takeover's seconds, and where the far sides stood before the old leader woke."""
    assert pair.leader.process is not None
    with _stopped(pair.leader.process):
        final, took = took_over(pair.standby, incident, pair.database, ttl=TTL)
        assert final["state"] == "resolved", final.get("outcome")
        woke = pair.sides.mark()
    wait_until(lambda: role(pair.leader) == "standby", timeout=60, what="the woken leader to stand by")
    wait_until(lambda: bool(stepped_down(pair.leader)), timeout=60, what="its step-down in its log")
    return took, woke


def test_a_leader_paused_past_its_lease_makes_no_call_when_it_wakes(
    pair: Pair, capsys: pytest.CaptureFixture[str]
) -> None:
    start = pair.sides.mark()
    assert pair.leader.process is not None
    pid = pair.leader.process.pid
    incident = catch_at(
        pair.database,
        "switches",
        "FROM switches",
        lambda held: (
            intent(STEP, pair.node)(held) and not [c for c in pair.sides.calls(start) if c.side != "slack"]
        ),
        lambda: os.kill(pid, signal.SIGSTOP),
        begin=_open(pair),
    )
    took, woke = _paused_through_takeover(pair, incident)
    late = pair.sides.calls(woke)
    assert late == [], f"far-side calls after the old leader woke: {late}"
    once_each(pair, incident, start)
    [why] = stepped_down(pair.leader)
    # However it noticed: its renewals failed (its session was ended while it slept), its lease
    # had lapsed by its own clock, or the next renewal found the epoch taken over.
    assert any(sign in why for sign in ("renewals failed", "may have lapsed", "taken over by another")), why
    show_figure(
        capsys,
        f"  takeover after SIGSTOP: {took:.1f}s (lease TTL {TTL:g}s); old leader made no call on waking",
    )


def test_a_leader_frozen_inside_a_write_does_not_freeze_the_store(
    pair: Pair, capsys: pytest.CaptureFixture[str]
) -> None:
    start = pair.sides.mark()
    assert pair.leader.process is not None
    pid = pair.leader.process.pid
    incident = catch_at(
        pair.database,
        "steps",
        "INSERT INTO steps",
        lambda held: True,
        lambda: os.kill(pid, signal.SIGSTOP),
        begin=_open(pair),
    )
    took, woke = _paused_through_takeover(pair, incident)
    late = pair.sides.calls(woke)
    assert late == [], f"far-side calls after the old leader woke: {late}"
    once_each(pair, incident, start)
    show_figure(capsys, f"  takeover with the leader frozen inside a write: {took:.1f}s (lease TTL {TTL:g}s)")
