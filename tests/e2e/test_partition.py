"""Fencing under a real network partition: the leader cut off from Postgres, still reaching the far sides.

Each replica runs in a network namespace of its own (``tests.harness.netns``: made by the test,
deleted after it), joined to this machine by two veth pairs: one to the store's bridge (a
PostgreSQL cluster of the test's own listens there, and lets that network in with the password),
one to the far sides' bridge (the session's real Slurm cluster, reached through a ``slurm.conf``
naming slurmctld by that bridge's address; the Kubernetes API emulator and the Slack stand-in,
listening there). Each far side records who sent what (``tests.e2e.replicas``): slurmctld and the
emulator by the peer address, which differs per namespace; the stand-in by the bot token, one
per replica.

Case: XID 79 on one node, two replicas in auto mode. The leader is caught between a destructive
step's intent write (its ``steps`` row ``running``, committed) and the far-side call: its last
read before the call waits on ``switches``, which the test holds; then its link to Postgres goes
down (``ip link set db0 down`` in its namespace) and the read is let go (it completes in the
server; the answer cannot reach the leader). The leader's links to Slurm, the emulator and Slack
stay up. Shown:

* the deposed leader sends nothing that changes anything: no request at slurmctld and no write
  at the emulator from the cut on (it was caught before its call), and nothing at all, the Slack
  stand-in included, once the lease it held at the cut has run out (the cut plus the TTL less one
  renewal period, at the latest), while cut off and after the link is back. Until then it still
  leads: a notice its outbox had taken may be posted just after the cut, as any leader's may be,
  and the new leader finds it by its metadata and does not post it again (each message once);
* it notices: its renewals fail, it stops acting before its lease can lapse, its log says why,
  and its ``/readyz`` says standby while still cut off (503: its store is unreachable);
* the other replica takes over (the figure: seconds from the cut, against the TTL plus one
  renewal period) and finishes the incident: Slurm saw the node DOWN once, with its DRAIN, and RESUMEd once, the
  emulator one cordon, one eviction, one Machine delete, the Slack thread each message once;
* the link restored, the old leader reads the lease again and stays a standby under the new
  leader's epoch.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from proving_ground.slurm import SlurmCluster
from tests.e2e.replicas import (
    FarCall,
    FarSides,
    Mark,
    Pair,
    far_sides,
    leadership,
    once_each,
    role,
    stepped_down,
    took_over,
)
from tests.e2e.store_moments import catch_at, connect, intent
from tests.harness.figures import show_figure
from tests.harness.netns import Site, TwoSites
from tests.harness.postgres import PostgresDatabase, running_postgres
from tests.harness.proc import wait_until
from tests.harness.scenarios import delivery

pytestmark = pytest.mark.slow
TTL = 3.0
RENEW = 1.0
STEP = "slurm_down"  # the playbook's first destructive step


@dataclass
class Partitioned:
    pair: Pair
    sites: TwoSites

    @property
    def leader_site(self) -> Site:
        return self.sites.sites[0]


@pytest.fixture
def partitioned(
    two_sites: TwoSites, slurm: SlurmCluster, pitcrew_factory: Any, tmp_path: Path
) -> Iterator[Partitioned]:
    """Two replicas, each in its own namespace, on a Postgres reached over the store's bridge;
    the far sides on theirs. The replicas are stopped, and the leader's link restored, before
    the far sides, the database and the namespaces go."""
    with running_postgres(networks=(two_sites.db_network,)) as server:
        name = server.create_database()
        database = PostgresDatabase(
            server.url(name), server.password_file(tmp_path / "postgres-password"), name, server
        )
        store = {
            "url": server.url(name, host=two_sites.db_host),
            "password_file": str(database.password_file),
            "lease": {"ttl": f"{TTL:g}s", "renew_every": f"{RENEW:g}s"},
        }
        replicas = ("first", "second")
        with far_sides(slurm, tmp_path / "far", replicas, host=two_sites.far_host) as sides:
            first, second = (
                pitcrew_factory(
                    replica,
                    config=sides.config(replica, store),
                    simulated=False,
                    host=site.address,
                    prefix=site.prefix,
                )
                for replica, site in zip(replicas, two_sites.sites, strict=True)
            )
            try:
                first.start()
                wait_until(lambda: role(first) == "leader", timeout=20, what="the first replica to lead")
                second.start()
                assert role(second) == "standby"
                yield Partitioned(Pair(sides, first, second, database, slurm.nodes[1]), two_sites)
            finally:
                two_sites.sites[0].restore()
                first.stop()
                second.stop()


def _from(site: Site, replica: str, calls: list[FarCall]) -> list[FarCall]:
    """The calls sent from ``site`` (slurmctld and the emulator see its address; Slack, its token)."""
    return [c for c in calls if c.who in (site.address, replica)]


def test_a_leader_cut_off_from_its_store_makes_no_far_side_call_and_steps_down(
    partitioned: Partitioned, capsys: pytest.CaptureFixture[str]
) -> None:
    pair, site = partitioned.pair, partitioned.leader_site
    sides: FarSides = pair.sides
    start = sides.mark()
    cut: list[tuple[float, Mark]] = []

    def cut_off() -> None:
        site.cut()
        cut.append((time.monotonic(), sides.mark()))

    # The moment: the intent committed and no replica has called Slurm or the emulator yet. Only
    # the replicas' own calls count (each site's address): a request of the harness's own that a
    # loaded slurmctld logs late is not the leader's, and would keep the moment from coming. The
    # alert is posted only once the test holds the table (two CI runs never caught the leader:
    # posted first, a quick leader could pass the moment while the test was still connecting).
    replicas = {s.address for s in partitioned.sites.sites}
    status, body = catch_at(
        pair.database,
        "switches",
        "FROM switches",
        lambda held: (
            intent(STEP, pair.node)(held)
            and not [c for c in sides.calls(start) if c.side != "slack" and c.who in replicas]
        ),
        cut_off,
        begin=lambda: pair.standby.post_alerts(delivery("xid79-firing.json", node=pair.node)),
    )
    assert status == 200, body
    incident = body["opened"][0]
    [(cut_at, at_cut)] = cut
    assert not site.db_link_up()
    # The lease it held at the cut runs out by the cut plus TTL - one renewal period (its fence:
    # renewed at most a period before): from then on nothing of it may reach any far side.
    time.sleep(max(0.0, cut_at + TTL - RENEW - time.monotonic()))
    lease_out = sides.mark()

    final, _ = took_over(pair.standby, incident, pair.database, ttl=TTL)
    took = _took_over_at(pair.database) - cut_at
    assert final["state"] == "resolved", final.get("outcome")
    # It noticed while still cut off: stopped acting, says so in its log and on /readyz.
    wait_until(lambda: bool(stepped_down(pair.leader)), timeout=30, what="the cut-off leader to step down")
    assert leadership(pair.leader)["role"] == "standby"
    within = _from(site, "first", sides.calls(at_cut))
    acting = [c for c in within if c.side != "slack"]
    assert acting == [], f"calls from the cut-off leader, caught before its call: {acting}"
    while_cut = _from(site, "first", sides.calls(lease_out))
    assert while_cut == [], f"far-side calls from the cut-off leader once its lease ran out: {while_cut}"

    site.restore()
    epoch = leadership(pair.standby)["epoch"]
    wait_until(
        lambda: (shown := leadership(pair.leader)).get("epoch") == epoch and shown.get("role") == "standby",
        timeout=30,
        what="the old leader, reconnected, to read the new epoch and stand by",
    )
    assert role(pair.standby) == "leader"
    late = _from(site, "first", sides.calls(lease_out))
    assert late == [], f"far-side calls from the old leader: {late}"
    # Each far side told the replicas apart: the new leader's calls are its own.
    by_new = _from(partitioned.sites.sites[1], "second", sides.calls(at_cut))
    assert {c.side for c in by_new} == {"slurm", "kubernetes", "slack"}, by_new
    once_each(pair, incident, start)
    [why] = stepped_down(pair.leader)
    assert "renewals failed" in why or "may have lapsed" in why, why
    show_figure(
        capsys,
        f"  partition: the leader cut off from Postgres, the standby led {took:.1f}s after the cut "
        f"(lease TTL {TTL:g}s + one renewal {RENEW:g}s); the cut-off leader made no far-side call "
        f"once its lease ran out ({len(within)} Slack call(s) within it)",
    )


def _took_over_at(database: PostgresDatabase) -> float:
    """When the current lease was acquired (the database's clock), on this machine's monotonic clock."""
    with connect(database) as conn:
        row = conn.execute("SELECT EXTRACT(EPOCH FROM now() - acquired_at) FROM leadership").fetchone()
    assert row is not None
    return time.monotonic() - float(row[0])
