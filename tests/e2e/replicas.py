"""Two pitcrew replicas on one PostgreSQL database in front of the real far sides, and what reached them.

The far sides are the session's real Slurm cluster (scontrol), the Kubernetes API emulator
(``integrations.cluster: kubernetes``, ``cluster-api`` replacement, the demo's fleet: a DaemonSet
pod, a mirror pod and a training worker on every node) and the Slack stand-in (HTTP mode; each
replica has a bot token of its own, so the stand-in's record says which replica called). Each
records what reached it, and who sent it:

* Slurm: slurmctld's own log, with ``DebugFlags=Protocol`` set for the test (``scontrol
  setdebugflags``, taken off again after): one ``received opcode REQUEST_UPDATE_NODE from
  ADDRESS:PORT`` line per request, then ``update_node: node N state set to S``;
* the emulator: its request log, each request with the peer address of its socket;
* Slack: the stand-in's calls, each with the token it carried.

``FarSides.mark()`` takes where each record stands; ``calls(mark)`` lists what changed something
since (``FarCall``: far side, what, who). The far sides listen on ``host``: loopback, or the far-side
bridge of ``tests.harness.netns`` when the replicas run in namespaces of their own (pitcrew then
reads a copy of ``slurm.conf`` naming slurmctld by that address).

``running_pair`` starts replica ``first`` (leading) and ``second`` (standing by) on loopback;
``took_over`` is the takeover every fencing test waits for: the standby leads, it finishes the
incident, and the far sides are quiet (the outbox has delivered the last notice); ``once_each``
is what they all check at the end.
"""

from __future__ import annotations

import contextlib
import json
import re
import secrets
import time
from collections import Counter
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from proving_ground.kubernetes.emulator import KubeEmulator
from proving_ground.kubernetes.host_slurmds import HostSlurmds
from proving_ground.kubernetes.world import KubeWorld, demo_fleet, settings_for
from proving_ground.pitcrew import Pitcrew
from proving_ground.slack.threaded import ThreadedStandin
from proving_ground.slack.world import World
from proving_ground.slurm import NODE_UPDATE, SlurmCluster
from tests.e2e.store_moments import delivered
from tests.harness.postgres import PostgresDatabase
from tests.harness.proc import wait_until

CHANNEL = "C0GPUOPS"
#: Requests that change something at slurmctld (the ones pitcrew can send).
SLURM_WRITES = frozenset(
    {
        "REQUEST_UPDATE_NODE",
        "REQUEST_UPDATE_JOB",
        "REQUEST_REQUEUE",
        "REQUEST_KILL_JOB",
        "REQUEST_CANCEL_JOB_STEP",
        "REQUEST_CREATE_RESERVATION",
        "REQUEST_UPDATE_RESERVATION",
        "REQUEST_DELETE_RESERVATION",
    }
)
_OPCODE = re.compile(r"received opcode (\S+) from (\S+?):\d+ uid")
#: How slurmctld logs a DRAIN: DRAINED on a node without jobs, DRAINING on one with them.
DRAIN = frozenset({"DRAINED", "DRAINING"})
_KUBE_READS = frozenset({"get", "list", "watch"})
#: The Slack methods pitcrew calls that change nothing (it writes with chat.postMessage,
#: chat.update and chat.postEphemeral).
_SLACK_READS = frozenset(
    {
        "auth.test",
        "apps.connections.open",
        "chat.getPermalink",
        "conversations.info",
        "conversations.history",
        "conversations.replies",
        "usergroups.users.list",
    }
)


@dataclass(frozen=True)
class FarCall:
    """One request that changed something at a far side: ``side``, ``what``, ``who`` sent it (an
    address, or for Slack the replica whose token it carried)."""

    side: str
    what: str
    who: str


@dataclass(frozen=True)
class Mark:
    slurm_log: int
    kube_log: int
    slack_calls: int


class FarSides:
    """Slurm, the emulator and the Slack stand-in, for ``replicas`` (names)."""

    def __init__(self, slurm: SlurmCluster, workdir: Path, replicas: tuple[str, ...], host: str) -> None:
        self.slurm, self.workdir, self.host = slurm, workdir, host
        workdir.mkdir(parents=True, exist_ok=True)
        self.tokens = {name: f"xoxb-{name}-{secrets.token_hex(8)}" for name in replicas}
        self.log = slurm.run_dir / "log" / "slurmctld.log"
        self.kube = KubeWorld(host)
        self.slack = ThreadedStandin(World(bot_tokens=set(self.tokens.values()), app_tokens=set()), host=host)
        self.conf = slurm.conf
        self.hosts: HostSlurmds | None = None
        if host != "127.0.0.1":  # scontrol in a namespace reaches slurmctld by its bridge address
            # In the cluster's run directory: a 24.11 or 26.05 cluster's clients see only that
            # inside their root (``proving_ground.slurm_root``).
            self.conf = slurm.run_dir / f"slurm-via-{host}.conf"
            text = slurm.conf.read_text().replace(
                "SlurmctldHost=localhost\n", f"SlurmctldHost=localhost({host})\n"
            )
            self.conf.write_text(text)

    def start(self) -> FarSides:
        self.slurm.run("scontrol", "setdebugflags", "+Protocol")
        self.kube.start()

        def seed(emulator: KubeEmulator) -> None:
            emulator.replace_delay, emulator.ready_delay = 0.5, 1.0  # the new Machine's node joins, Ready
            demo_fleet(emulator, list(self.slurm.nodes))

        self.kube.call(seed)
        # The nodes' slurmds run on the emulator's machines: the replacement's successor starts the
        # replaced node's again, which wait_ready waits for (a new SlurmdStartTime).
        self.hosts = HostSlurmds(self.kube, self.slurm).start()
        self.slack.start()
        return self

    def stop(self) -> None:
        with contextlib.suppress(Exception):
            self.slack.stop()
        if self.hosts is not None:
            self.hosts.stop()
        with contextlib.suppress(Exception):
            self.kube.stop()
        self.slurm.run("scontrol", "setdebugflags", "-Protocol", check=False)

    def config(self, name: str, store: Mapping[str, Any]) -> dict[str, Any]:
        """Replica ``name``'s configuration: mode auto on the three far sides, ``store`` its store."""
        files = self.workdir / name
        files.mkdir(parents=True, exist_ok=True)
        (files / "bot.token").write_text(self.tokens[name] + "\n")
        (files / "signing.secret").write_text(secrets.token_hex(16) + "\n")
        cluster = settings_for(
            self.kube, files / "kube", request_timeout=5.0, replace={"strategy": "cluster-api"}
        )
        # The cluster's own clients (its wrappers on 24.11 and 26.05: this machine's 22.05 scontrol
        # cannot talk to their controller).
        slurm = self.slurm.pitcrew_settings("scontrol", slurm_conf=self.conf, command_timeout=5)
        return {
            "mode": "auto",
            "guards": {"breaker": {"max_nodes": 10, "max_fraction": 1.0}},
            "integrations": {"scheduler": "slurm", "cluster": "kubernetes", "notifier": "slack"},
            "slurm": slurm["slurm"],
            "kubernetes": cluster["kubernetes"],
            "slack": {
                "bot_token_file": str(files / "bot.token"),
                "transport": "http",
                "signing_secret_file": str(files / "signing.secret"),
                "channel": CHANNEL,
                "approvers": ["U0ALICE"],
                "base_url": self.slack.standin.base_url,
                "retry_backoff_max": "2s",
            },
            "store": dict(store),
        }

    # ------------------------------------------------------------------ what reached them
    def mark(self) -> Mark:
        return Mark(self.log.stat().st_size, len(self.kube.log()), len(self._slack_calls()))

    def calls(self, since: Mark) -> list[FarCall]:
        """Every request since ``since`` that changed something, at each far side, in its order."""
        with self.log.open("rb") as file:
            file.seek(since.slurm_log)
            text = file.read().decode(errors="replace")
        found = [FarCall("slurm", op, who) for op, who in _OPCODE.findall(text) if op in SLURM_WRITES]
        kube = self.kube.log()[since.kube_log :]
        found += [
            FarCall(
                "kubernetes",
                f"{e.verb} {e.resource}{'/' + e.subresource if e.subresource else ''} {e.name}",
                e.peer,
            )
            for e in kube
            if e.verb not in _KUBE_READS
        ]
        owner = {token: name for name, token in self.tokens.items()}
        found += [
            FarCall("slack", method, owner.get(token or "", "?"))
            for method, token in self._slack_calls()[since.slack_calls :]
            if method not in _SLACK_READS
        ]
        return found

    def node_changes(self, since: Mark) -> Counter[tuple[str, str]]:
        """slurmctld's node state changes since ``since``, by (node, state set)."""
        with self.log.open("rb") as file:
            file.seek(since.slurm_log)
            text = file.read().decode(errors="replace")
        return Counter(NODE_UPDATE.findall(text))

    def _slack_calls(self) -> list[tuple[str, str | None]]:
        async def read() -> list[tuple[str, str | None]]:
            return [(c.method, c.token) for c in self.slack.standin.api.calls]

        return self.slack.run(read())

    def thread(self, incident_id: str) -> list[str]:
        """The incident's Slack thread as the channel shows it: the parent, then each reply."""

        async def read() -> list[str]:
            api = self.slack.standin.api
            parents = [
                m
                for m in api.messages
                if m.channel == CHANNEL
                and m.thread_ts is None
                and ((m.metadata or {}).get("event_payload") or {}).get("incident_id") == incident_id
            ]
            if not parents:
                return []
            return [m.text for m in api.thread(CHANNEL, parents[0].ts)]

        return self.slack.run(read())


@contextlib.contextmanager
def far_sides(
    slurm: SlurmCluster, workdir: Path, replicas: tuple[str, ...], host: str = "127.0.0.1"
) -> Iterator[FarSides]:
    sides = FarSides(slurm, workdir, replicas, host)
    try:
        yield sides.start()
    finally:
        sides.stop()
    sides.slack.standin.api.check_served()  # no replica called a method the stand-in does not serve


@contextlib.contextmanager
def running_pair(
    slurm: SlurmCluster, database: PostgresDatabase, factory: Any, workdir: Path, *, ttl: float
) -> Iterator[Pair]:
    """Replica ``first`` leading and ``second`` standing by on ``database`` (lease ``ttl``, renewed
    every second), in front of the far sides, on loopback; the node the test faults is Slurm's
    second. Both are stopped before the far sides are."""
    store = {
        "url": database.url,
        "password_file": str(database.password_file),
        "lease": {"ttl": f"{ttl:g}s", "renew_every": "1s"},
    }
    with far_sides(slurm, workdir, ("first", "second")) as sides:
        first = factory("first", config=sides.config("first", store), simulated=False)
        second = factory("second", config=sides.config("second", store), simulated=False)
        try:
            first.start()
            wait_until(lambda: role(first) == "leader", timeout=20, what="the first replica to lead")
            second.start()
            assert role(second) == "standby"
            yield Pair(sides, first, second, database, slurm.nodes[1])
        finally:
            first.stop()
            second.stop()


def role(server: Pitcrew) -> str | None:
    """``leader`` or ``standby``, as a ready ``/readyz`` says (``None``: not ready)."""
    status, raw = server.request("GET", "/readyz")
    if status != 200:
        return None
    found: str | None = json.loads(raw).get("leadership", {}).get("role")
    return found


def leadership(server: Pitcrew) -> dict[str, Any]:
    """``/readyz``'s leadership detail, ready or not (cut off from its store, it answers 503 and
    still says what it believes)."""
    status, raw = server.request("GET", "/readyz")
    assert status in (200, 503), (status, raw)
    found: dict[str, Any] = json.loads(raw).get("leadership", {})
    return found


def stepped_down(server: Pitcrew) -> list[str]:
    """Why ``server`` stepped down, each time it did (its log's ``stepped down`` lines)."""
    lines = server.log.read_text().splitlines()
    return [json.loads(line)["why"] for line in lines if '"msg": "stepped down: standing by"' in line]


def took_over(
    standby: Pitcrew, incident: str, database: PostgresDatabase, *, ttl: float
) -> tuple[dict[str, Any], float]:
    """Wait until ``standby`` leads and has carried ``incident`` to its end, and until the outbox
    has nothing left to deliver; the incident as it ended, and the seconds until it led."""
    began = time.monotonic()
    wait_until(lambda: role(standby) == "leader", timeout=ttl * 10, what="the standby to take over")
    took = time.monotonic() - began
    final = standby.wait_incident(incident, "resolved", "failed", timeout=120)
    wait_until(delivered(database), timeout=60, what="the outbox to deliver every notice")
    return final, took


@dataclass
class Pair:
    """Two replicas on one database in front of the far sides, and the node the test faults."""

    sides: FarSides
    leader: Pitcrew
    standby: Pitcrew
    database: PostgresDatabase
    node: str


def once_each(pair: Pair, incident: str, start: Mark) -> None:
    """Every destructive call reached its far side once; the Slack thread has each message once."""
    changes = pair.sides.node_changes(start)
    assert changes[(pair.node, "DOWN")] == 1, changes
    # The DOWN's DRAIN (ReturnToService=2), once, whichever replica made it.
    assert sum(n for (node, state), n in changes.items() if node == pair.node and state in DRAIN) == 1, (
        changes
    )
    resumed = [
        n for (node, state), n in changes.items() if node == pair.node and state not in {"DOWN", *DRAIN}
    ]
    assert sum(resumed) == 1, changes
    kube = Counter(c.what for c in pair.sides.calls(start) if c.side == "kubernetes")
    machine = f"gpu-east-gpu-h100-x7b2n-m{pair.sides.slurm.nodes.index(pair.node)}"
    # Two writes to the node: the cordon (taint and mark in one), then the replacement's handle,
    # recorded on it before the Machine is deleted.
    assert kube[f"patch nodes {pair.node}"] == 2, kube
    assert kube[f"delete machines {machine}"] == 1, kube
    evictions = {what: n for what, n in kube.items() if what.startswith("create pods/eviction")}
    assert evictions == {
        f"create pods/eviction llama-pretrain-worker-{pair.sides.slurm.nodes.index(pair.node)}": 1
    }
    thread = pair.sides.thread(incident)
    assert thread and len(thread) == len(set(thread)), thread
