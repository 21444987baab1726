"""SIGKILL of the leader at every step boundary of the playbook: the other replica finishes it, once.

Two ``serve`` replicas in auto mode on one real PostgreSQL database (the session's throwaway
cluster), in front of the real far sides (``tests.e2e.replicas``): the session's Slurm cluster,
the Kubernetes API emulator and the Slack stand-in, each recording what reached it.

Case, once per step boundary of ``replace-node``'s node track (parametrised: after notify,
slurm_down, cordon, drain, replace, wait_ready, give_back, slurm_resume): XID 79 on one node;
the leader is caught exactly at the boundary (the step before it finished and committed, the next
one's intent write waiting on ``steps``, which the test holds) and SIGKILLed there. The standby takes over once
the lease lapses (the figure: seconds from the kill, against the TTL plus one renewal period) and
finishes the incident: Slurm saw the node DOWN once (with its DRAIN once) and RESUMEd once, the emulator one cordon, one
eviction, one Machine delete, and the Slack thread has each message once.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from proving_ground.slurm import SlurmCluster
from tests.e2e.replicas import Pair, once_each, running_pair, took_over
from tests.e2e.store_moments import catch_at, steps_on
from tests.harness.figures import show_figure
from tests.harness.postgres import PostgresDatabase
from tests.harness.scenarios import delivery

pytestmark = pytest.mark.slow
TTL = 3.0
#: ``replace-node``'s node track, in order; its job track (``capacity``, ``confirm_resumed``) runs
#: beside it (``bot.engine.flow``) and is done, with no job on the node, within its first steps.
NODE_TRACK = (
    "notify",
    "slurm_down",
    "cordon",
    "drain",
    "replace",
    "wait_ready",
    "give_back",
    "slurm_resume",
    "close",
)
#: The statement a step's intent write sends (``bot.store.queries.step_started``).
STEP_STARTED = "DO UPDATE SET status = 'running'"


@pytest.fixture
def pair(
    slurm: SlurmCluster, postgres_db: PostgresDatabase, pitcrew_factory: Any, tmp_path: Path
) -> Iterator[Pair]:
    with running_pair(slurm, postgres_db, pitcrew_factory, tmp_path / "far", ttl=TTL) as started:
        yield started


def _boundary(node: str, after: str) -> Callable[[psycopg.Connection[tuple[Any, ...]]], bool]:
    """The moment ``after`` has finished and no later step of the node track has begun."""
    later = set(NODE_TRACK[NODE_TRACK.index(after) + 1 :])

    def reached(holder: psycopg.Connection[tuple[Any, ...]]) -> bool:
        rows = steps_on(holder, node)
        return rows.get(after) not in (None, "running") and not later & set(rows)

    return reached


@pytest.mark.parametrize("after", NODE_TRACK[:-1])
def test_sigkill_of_the_leader_at_a_step_boundary_is_finished_once_by_the_other(
    pair: Pair, after: str, capsys: pytest.CaptureFixture[str]
) -> None:
    start = pair.sides.mark()
    assert pair.leader.process is not None
    pid = pair.leader.process.pid
    status, body = catch_at(
        pair.database,
        "steps",
        STEP_STARTED,
        _boundary(pair.node, after),
        lambda: os.kill(pid, signal.SIGKILL),
        begin=lambda: pair.standby.post_alerts(delivery("xid79-firing.json", node=pair.node)),
    )
    assert status == 200, body
    incident = body["opened"][0]
    final, took = took_over(pair.standby, incident, pair.database, ttl=TTL)
    assert final["state"] == "resolved", final.get("outcome")
    once_each(pair, incident, start)
    show_figure(capsys, f"  SIGKILL after {after}: the standby led {took:.1f}s later (lease TTL {TTL:g}s)")
