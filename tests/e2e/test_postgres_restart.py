"""PostgreSQL restarted, or failed over, in the middle of a storm: nothing acknowledged is lost,
nothing done twice.

Two ``serve`` processes in auto mode on a PostgreSQL cluster of this test's own (it is stopped
and started again, so it is not the session's shared one), in front of one simulated far side
whose replacements take a minute (so the nodes taken out stay out and the breaker's count is
visible at the end). The breaker allows 3 nodes.

A storm of XID 79 alerts on 12 nodes is sent as Alertmanager sends it: to either replica, and
again after any answer but 200 (Alertmanager redelivers a notification it could not deliver).
After the first four are acknowledged the sender holds, the database goes away for longer than
the lease, and the sender goes on:

* ``restart``: it is shut down (``pg_ctl stop -m fast``), then started again;
* ``failover``: a primary with a synchronous streaming standby (``tests.harness.postgres``), the
  replicas' URL listing both with ``target_session_attrs=read-write``; the primary is killed
  (``pg_ctl stop -m immediate``: its node died), then the standby promoted, as a failover
  manager does.

Meanwhile webhooks answer 503 with ``Retry-After``, ``/readyz`` answers 503 on both, the leader's
renewals fail and it stops acting. Once the database is back (restarted, or the standby
promoted), without a restart of either process, both are ready again, one leads, every
acknowledged alert is in the store (one incident per node), the breaker still holds (3 nodes
taken out, the others suppressed by it), no destructive call reached the far side twice, and
``/readyz`` says how the store's commits are replicated before and after.
"""

from __future__ import annotations

import json
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.harness.pitcrew import Pitcrew
from tests.harness.postgres import running_postgres, running_standby
from tests.harness.proc import wait_until
from tests.harness.scenarios import delivery, destructive_calls, gpu_node, inventory

pytestmark = pytest.mark.slow
NODES = tuple(f"gpu-node-{i:02d}" for i in range(1, 13))
MAX_NODES = 3
TTL = 3.0


@dataclass(frozen=True)
class Outage:
    """The database the replicas share, how it goes away and how it comes back."""

    kind: str
    url: str
    password: str
    take_down: Callable[[], None]
    bring_back: Callable[[], None]
    #: ``detail.store.replication`` before the outage, and after.
    replication: tuple[str, str]


@pytest.fixture(params=["restart", "failover"])
def outage(request: pytest.FixtureRequest) -> Iterator[Outage]:
    if request.param == "restart":
        with running_postgres() as server:
            name = server.create_database()
            yield Outage(
                "restart", server.url(name), server.password, server.stop, server.start, ("none", "none")
            )
        return
    with running_postgres(durable=True) as primary:
        name = primary.create_database()
        with running_standby(primary) as standby:
            standby.synchronous()  # a commit returns once the standby has it
            yield Outage(
                "failover",
                standby.url(name, primary.port, standby.port),
                primary.password,
                lambda: primary.stop("immediate"),
                standby.promote,
                ("synchronous", "none"),  # the promoted standby has no standby of its own
            )


class Alertmanager:
    """Delivers one alert per node, alternating replicas, redelivering until answered 200.

    It holds after ``hold_after`` acknowledgements until ``resume``: the test takes the database
    down in between, so the rest of the storm meets the outage however fast the replicas answer
    and however long the database takes to go (a free-running sender could have had every alert
    acknowledged before a loaded machine's ``pg_ctl stop`` returned, and no delivery met it)."""

    def __init__(self, replicas: tuple[Pitcrew, Pitcrew], hold_after: int) -> None:
        self.replicas = replicas
        self.hold_after = hold_after
        self.acknowledged: dict[str, list[str]] = {}  # node -> incidents opened/attached
        self.answers: Counter[int] = Counter()
        self.gate = threading.Event()  # set: keep sending
        self.gate.set()
        self.held = threading.Event()  # set once it holds
        self.thread = threading.Thread(target=self._run, daemon=True)

    def resume(self) -> None:
        self.gate.set()

    def _run(self) -> None:
        for index, node in enumerate(NODES):
            if index == self.hold_after:
                self.gate.clear()
                self.held.set()
            attempt = 0
            while True:
                self.gate.wait()
                server = self.replicas[(index + attempt) % 2]
                try:
                    status, body = server.post_alerts(delivery("xid79-firing.json", node=node))
                except OSError:
                    status, body = 0, {}
                self.answers[status] += 1
                if status == 200:
                    self.acknowledged[node] = [*body["opened"], *body["attached"]]
                    break
                attempt += 1
                time.sleep(0.2)


def _ready(server: Pitcrew) -> tuple[int, dict[str, Any]]:
    status, raw = server.request("GET", "/readyz")
    return status, json.loads(raw)


def test_a_postgres_outage_mid_storm_loses_nothing_and_does_nothing_twice(
    pitcrew_factory: Any, tmp_path: Path, outage: Outage
) -> None:
    password_file = tmp_path / "pg-password"
    password_file.write_text(outage.password + "\n")
    shared = tmp_path / "shared"
    shared.mkdir()
    journal = shared / "far-side.jsonl"
    nodes = {node: gpu_node() for node in NODES}
    world = {
        "journal": journal,
        "inventory": inventory(shared / "inventory.yaml", nodes, []),
        "replace_seconds": "120s",
    }
    config = {
        "mode": "auto",
        "guards": {"breaker": {"max_nodes": MAX_NODES, "max_fraction": 1.0}},
        "store": {
            "path": str(shared / "unused.db"),
            "url": outage.url,
            "password_file": str(password_file),
            "lease": {"ttl": f"{TTL:g}s", "renew_every": "1s"},
        },
    }
    first = pitcrew_factory("first", config=config, world=world).start()
    wait_until(
        lambda: _ready(first)[1].get("leadership", {}).get("role") == "leader", timeout=20, what="a leader"
    )
    second = pitcrew_factory("second", config=config, world=world).start()
    sender = Alertmanager((first, second), hold_after=4)
    sender.thread.start()
    assert sender.held.wait(60), f"four acknowledged deliveries: {dict(sender.answers)}"
    assert len(sender.acknowledged) == 4, sender.acknowledged
    before = _ready(first)[1]["detail"]["store"]
    assert before["replication"] == outage.replication[0], before

    outage.take_down()
    down = time.monotonic()
    sender.resume()
    try:
        wait_until(lambda: sender.answers[503] >= 1, timeout=60, what="a webhook answered 503")

        def timed_post() -> tuple[int, dict[str, Any], float]:
            asked = time.monotonic()
            status, answer = first.post_alerts(delivery("xid79-firing.json", node=NODES[-1]))
            return status, answer, time.monotonic() - asked

        # A webhook waits out the store's connect timeout, /readyz its PING_TIMEOUT: all at once.
        with ThreadPoolExecutor(3) as pool:
            ready = list(pool.map(_ready, (first, second)))
            status, answer, answered = pool.submit(timed_post).result()
        assert [code for code, _ in ready] == [503, 503], ready
        assert status == 503 and "retry" in answer["error"], answer
        wait_until(
            lambda: "stepped down: standing by" in first.log.read_text(),
            timeout=TTL * 10,
            what="the leader to stop acting without its lease",
        )
        away = time.monotonic() - down
    finally:
        outage.bring_back()
    back = time.monotonic()
    wait_until(lambda: all(_ready(s)[0] == 200 for s in (first, second)), timeout=60, what="ready again")
    ready_after = time.monotonic() - back
    after = _ready(first)[1]["detail"]["store"]
    assert (after["kind"], after["replication"]) == ("postgresql", outage.replication[1]), after
    wait_until(lambda: len(sender.acknowledged) == len(NODES), timeout=120, what="every alert acknowledged")
    roles = Counter(_ready(s)[1]["leadership"]["role"] for s in (first, second))
    wait_until(
        lambda: (
            Counter(_ready(s)[1]["leadership"]["role"] for s in (first, second))
            == {"leader": 1, "standby": 1}
        ),
        timeout=TTL * 10,
        what="one leader again",
    )
    leader = next(s for s in (first, second) if _ready(s)[1]["leadership"]["role"] == "leader")

    incidents = {node: leader.incidents(node) for node in NODES}
    assert {node: len(found) for node, found in incidents.items()} == dict.fromkeys(NODES, 1), incidents
    for node, ids in sender.acknowledged.items():
        assert set(ids) == {incidents[node][0]["id"]}, (node, ids, incidents[node])

    def taken_out() -> set[str]:
        calls = destructive_calls([json.loads(x) for x in journal.read_text().splitlines() if x.strip()])
        return {node for (op, node), _ in calls.items() if op == "slurm_down"}

    wait_until(lambda: len(taken_out()) == MAX_NODES, timeout=60, what="the breaker's allowance used")
    calls = destructive_calls([json.loads(x) for x in journal.read_text().splitlines() if x.strip()])
    assert {c: n for c, n in calls.items() if n > 1} == {}, calls
    assert len(taken_out()) == MAX_NODES, calls

    def judged() -> dict[str, Any]:
        """Each node's incident, once the guards have judged every one (none still ``open``: the
        last one admitted may trail the breaker's allowance being used up by a scan)."""
        return {node: leader.incident(found[0]["id"]) for node, found in incidents.items()}

    wait_until(
        lambda: all(r["state"] != "open" for r in judged().values()), timeout=60, what="every incident judged"
    )
    records = judged()
    failed = {node: r["outcome"] for node, r in records.items() if r["state"] == "failed"}
    assert failed == {}, failed
    states = Counter(r["state"] for r in records.values())
    assert states["suppressed"] == len(NODES) - MAX_NODES, states
    print(
        f"\n  {outage.kind}: away {away:.1f}s; a webhook while down answered 503 in {answered:.1f}s; answers {dict(sender.answers)}; ready {ready_after:.1f}s after it was back;"
        f" roles right after {dict(roles)}; states {dict(states)}"
    )
