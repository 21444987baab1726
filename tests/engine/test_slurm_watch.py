"""The Slurm watch in the engine, on a real SQLite store, against a fake Slurm (the far side of the port).

Cases:
- a node a health check drained opens one incident; a node out with pitcrew's own reason, a node in
  service and a node whose Kubernetes name is not its Slurm name open none;
- later polls of the same outage are repeats (no second incident, no second alert); Slurm is asked at
  most once per ``poll_interval``, however often the scan runs;
- the node back in service resolves the watch's alert; a node left out of Slurm's list (22.05 lists
  no powered-down CLOUD node unless ``PrivateData=cloud``: ``node_mgr.c`` ``_is_cloud_hidden``) is
  read alone while its outage fires: out still, the alert keeps firing; back, it resolves; a node
  Slurm no longer knows at all ends its outage;
- Slurm unreachable: the poll gives up quietly and the next one tries again;
- an outage names the jobs the watch saw on the node at its last look while it was in service (a
  DOWN by Slurm takes them off the node at once); a node already out at the first look names none;
  only busy nodes in service have their jobs read; a look that raced the outage (listed busy, its
  job already ended when read) keeps what the look before saw;
- that memory is kept in the store: a node Slurm takes out while pitcrew is down (the store closed,
  a new process's watch on it) still names its jobs; a node back idle, or gone from Slurm's list,
  is forgotten there too.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import AsyncIterator, Sequence
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from bot.config import EngineSettings, load_catalog, load_playbooks
from bot.domain.jobs import JobSnapshot, SlurmNodeState
from bot.domain.policy import Policy
from bot.engine.context import Ports
from bot.engine.deps import EngineDeps
from bot.engine.errors import PermanentError, Reason, TransientError
from bot.engine.metrics import Metrics
from bot.engine.slurm_watch import SlurmWatch
from bot.integrations.journal import LogNotifier
from bot.store.sqlite import SqliteStore

START = datetime(2026, 12, 1, 22, 0, tzinfo=UTC)
NHC = "NHC: check_fs_mount: /scratch not mounted"


class FakeSlurm:
    """What ``scontrol show node`` would list; counts the listings."""

    def __init__(self) -> None:
        self.listed: list[SlurmNodeState] = []
        #: Nodes Slurm knows but leaves out of its list (22.05: powered-down CLOUD nodes), read alone.
        self.unlisted: dict[str, SlurmNodeState] = {}
        self.node_reads: Counter[str] = Counter()
        self.calls = 0
        self.down = False
        self.jobs: dict[str, list[JobSnapshot]] = {}
        self.job_reads: Counter[str] = Counter()

    async def jobs_on_node(self, name: str) -> list[JobSnapshot]:
        self.job_reads[name] += 1
        return list(self.jobs.get(name, []))

    async def node(self, name: str) -> SlurmNodeState:
        self.node_reads[name] += 1
        found = {n.name: n for n in self.listed} | self.unlisted
        if name not in found:
            raise PermanentError(f"Slurm node {name!r} not found", reason=Reason.UNKNOWN_NODE)
        return found[name]

    async def nodes(self) -> list[SlurmNodeState]:
        self.calls += 1
        if self.down:
            raise TransientError("show_nodes: Unable to contact slurm controller", reason=Reason.UNREACHABLE)
        return list(self.listed)


class Clock:
    def __init__(self) -> None:
        self.now = START

    def __call__(self) -> datetime:
        return self.now


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[SqliteStore]:
    db = SqliteStore(tmp_path / "p.db", synchronous="off")
    await db.open()
    yield db
    await db.close()


async def slurm_names(node: str) -> Sequence[str]:
    return {"gpu-009": ["slurm-gpu-9"]}.get(node, [node])


def watch(store: SqliteStore, slurm: FakeSlurm, clock: Clock) -> SlurmWatch:
    deps = EngineDeps(
        store=store,
        ports=Ports(scheduler=slurm, cluster=None, notifier=LogNotifier(), slurm_names=slurm_names),  # type: ignore[arg-type]
        metrics=Metrics(),
        clock=clock,
        policy=Policy(),
        playbooks=load_playbooks(),
        settings=EngineSettings(slurm_watch=True, poll_interval=timedelta(seconds=2)),
    )
    return SlurmWatch(deps, load_catalog(), look_again=lambda _: None, opened=lambda: None)


def node(name: str, *states: str, reason: str = "") -> SlurmNodeState:
    return SlurmNodeState(
        name, frozenset(states), reason, "root" if reason else None, START - timedelta(minutes=1)
    )


async def test_an_nhc_drain_opens_one_incident_and_its_return_resolves_it(store: SqliteStore) -> None:
    slurm, clock = FakeSlurm(), Clock()
    slurm.listed = [
        node("gpu-001", "IDLE", "DRAIN", reason=NHC),
        node("gpu-002", "DOWN", reason="pitcrew: pc-00007 XID 79 gpu3"),
        node("gpu-003", "IDLE"),
        node("gpu-009", "DOWN", reason="Not responding"),  # its Kubernetes node is named otherwise
    ]
    watcher = watch(store, slurm, clock)
    await watcher.poll()
    [(incident_id, _, _)] = await store.active()
    incident = await store.incident(incident_id)
    assert incident is not None and incident.node == "gpu-001"
    [alert] = await store.alerts_of(incident_id)
    assert (alert.alertname, alert.status, alert.labels["fault"]) == (
        "SlurmNodeOut",
        "firing",
        "slurm-node-out",
    )

    await watcher.poll()  # the scan runs again at once: Slurm is not asked again
    assert slurm.calls == 1
    clock.now += timedelta(seconds=3)
    await watcher.poll()
    assert slurm.calls == 2
    assert len(await store.active()) == 1
    [again] = await store.alerts_of(incident_id)
    assert again.deliveries == 2 and again.status == "firing"

    slurm.listed[0] = node("gpu-001", "IDLE")  # a person's RESUME
    clock.now += timedelta(seconds=3)
    await watcher.poll()
    [resolved] = await store.alerts_of(incident_id)
    assert resolved.status == "resolved"


async def test_a_node_left_out_of_slurms_list_is_read_alone_while_its_outage_fires(
    store: SqliteStore,
) -> None:
    slurm, clock = FakeSlurm(), Clock()
    slurm.listed = [node("gpu-001", "DOWN", "CLOUD", reason=NHC), node("gpu-002", "IDLE")]
    watcher = watch(store, slurm, clock)
    await watcher.poll()
    [(incident_id, _, _)] = await store.active()

    # Power saving suspends the DOWN node; 22.05 lists it no more, but it is still out.
    slurm.unlisted["gpu-001"] = node("gpu-001", "DOWN", "CLOUD", "POWERED_DOWN", reason=NHC)
    slurm.listed = [node("gpu-002", "IDLE")]
    clock.now += timedelta(seconds=3)
    await watcher.poll()
    [alert] = await store.alerts_of(incident_id)
    assert alert.status == "firing"
    assert slurm.node_reads == {"gpu-001": 1}  # only the node with a firing outage, not gpu-002

    # A person's RESUME: in service, still unlisted (asleep): the outage is over.
    slurm.unlisted["gpu-001"] = node("gpu-001", "IDLE", "CLOUD", "POWERED_DOWN", "NOT_RESPONDING")
    clock.now += timedelta(seconds=3)
    await watcher.poll()
    [alert] = await store.alerts_of(incident_id)
    assert alert.status == "resolved"


async def test_a_node_slurm_no_longer_knows_ends_its_outage(store: SqliteStore) -> None:
    slurm, clock = FakeSlurm(), Clock()
    slurm.listed = [node("gpu-001", "DOWN", reason=NHC)]
    watcher = watch(store, slurm, clock)
    await watcher.poll()
    [(incident_id, _, _)] = await store.active()
    slurm.listed = []  # removed from slurm.conf
    clock.now += timedelta(seconds=3)
    await watcher.poll()
    [alert] = await store.alerts_of(incident_id)
    assert alert.status == "resolved"


async def test_slurm_unreachable_is_tried_again_at_the_next_poll(store: SqliteStore) -> None:
    slurm, clock = FakeSlurm(), Clock()
    slurm.listed = [node("gpu-001", "IDLE", "DRAIN", reason=NHC)]
    slurm.down = True
    watcher = watch(store, slurm, clock)
    await watcher.poll()
    assert not await store.active()
    slurm.down = False
    clock.now += timedelta(seconds=3)
    await watcher.poll()
    assert len(await store.active()) == 1


async def test_an_outage_names_the_jobs_seen_on_the_node_at_the_last_look_before(store: SqliteStore) -> None:
    slurm, clock = FakeSlurm(), Clock()
    train = JobSnapshot("4711", "train", "dana", "RUNNING", ("gpu-001",), 1)
    slurm.listed = [
        node("gpu-001", "ALLOCATED"),
        node("gpu-002", "DOWN", reason="Not responding"),
        node("gpu-003", "IDLE"),
    ]
    slurm.jobs = {"gpu-001": [train], "gpu-002": [replace(train, job_id="4712", nodes=("gpu-002",))]}
    watcher = watch(store, slurm, clock)
    await watcher.poll()
    assert slurm.job_reads == Counter({"gpu-001": 1})  # the busy node in service, nothing else

    # Slurm sets gpu-001 DOWN itself and requeues the job: it is no longer on the node.
    slurm.listed[0] = node("gpu-001", "IDLE", "DOWN", reason=NHC)
    slurm.jobs["gpu-001"] = []
    clock.now += timedelta(seconds=3)
    await watcher.poll()
    assert slurm.job_reads == Counter({"gpu-001": 1})
    named = {}
    for incident_id, _, _ in await store.active():
        [alert] = await store.alerts_of(incident_id)
        named[alert.node] = alert.annotations.get("slurm_jobs")
    assert named == {"gpu-001": "4711@1", "gpu-002": None}  # gpu-002 was out before the first look


async def test_a_look_that_raced_the_outage_does_not_forget_the_jobs_seen_before(store: SqliteStore) -> None:
    """The listing said busy; by the time the node's jobs were read Slurm had set it DOWN and ended
    its job (``NODE_FAIL``): that look found no running job, and must not erase the one the look
    before saw (a CI run's outage named no job, and the lost job was never reported)."""
    slurm, clock = FakeSlurm(), Clock()
    train = JobSnapshot("4711", "train", "dana", "RUNNING", ("gpu-001",), 0)
    slurm.listed = [node("gpu-001", "ALLOCATED")]
    slurm.jobs = {"gpu-001": [train]}
    watcher = watch(store, slurm, clock)
    await watcher.poll()

    slurm.jobs["gpu-001"] = [replace(train, state="NODE_FAIL")]  # listed busy a moment before
    clock.now += timedelta(seconds=3)
    await watcher.poll()
    slurm.listed[0] = node("gpu-001", "IDLE", "DOWN", reason=NHC)
    clock.now += timedelta(seconds=3)
    await watcher.poll()
    [(incident_id, _, _)] = await store.active()
    [alert] = await store.alerts_of(incident_id)
    assert alert.annotations.get("slurm_jobs") == "4711@0"


async def test_a_node_taken_out_during_a_restart_still_names_its_jobs(tmp_path: Path) -> None:
    slurm, clock = FakeSlurm(), Clock()
    train = JobSnapshot("4711", "train", "dana", "RUNNING", ("gpu-001",), 2)
    other = replace(train, job_id="4712", nodes=("gpu-002",), restarts=0)
    slurm.listed = [node("gpu-001", "ALLOCATED"), node("gpu-002", "MIXED"), node("gpu-003", "ALLOCATED")]
    slurm.jobs = {"gpu-001": [train], "gpu-002": [other], "gpu-003": [replace(other, job_id="4713")]}
    first = SqliteStore(tmp_path / "p.db", synchronous="off")
    await first.open()
    await watch(first, slurm, clock).poll()
    await first.close()  # pitcrew stops (or dies: each look's memory is written before its alerts)

    # Meanwhile a health check takes gpu-001 out and Slurm requeues its job; gpu-002 goes idle;
    # gpu-003 leaves the cluster.
    slurm.listed = [node("gpu-001", "IDLE", "DOWN", reason=NHC), node("gpu-002", "IDLE")]
    slurm.jobs = {}
    clock.now += timedelta(minutes=5)
    second = SqliteStore(tmp_path / "p.db", synchronous="off")
    await second.open()
    try:
        await watch(second, slurm, clock).poll()
        [(incident_id, _, _)] = await second.active()
        [alert] = await second.alerts_of(incident_id)
        assert (alert.node, alert.annotations.get("slurm_jobs")) == ("gpu-001", "4711@2")
        assert set(await second.memory("pitcrew-slurm-watch")) == {"gpu-001"}  # held while it is out

        slurm.listed = [node("gpu-001", "IDLE"), node("gpu-002", "IDLE")]  # returned by a person
        clock.now += timedelta(seconds=3)
        await watch(second, slurm, clock).poll()
        assert await second.memory("pitcrew-slurm-watch") == {}
    finally:
        await second.close()
