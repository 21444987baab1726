"""The ``capacity`` and ``give_back`` steps in the engine, in virtual time, against a small Slurm
far side of this file's own (``GangSlurm``: gang jobs that need N free nodes outside any
reservation, reservations that Slurm 22.05 rewrites whole and refuses to empty).

Cases: a stalled gang job gets a spare from the reservation and runs at once, long before
the replacement (slow here) is Ready, and the repaired node refills the reservation (the training
loss clocked to the restart's start time, as Slurm reports it), under the Slurm node name its
replacement registers (a Slinky DaemonSet-mode NodeSet), not the record left behind; a job
Slurm restarts by itself takes nothing; no pool, or a guard (``min_idle``), takes nothing and
the timeline says why; a storm of incidents never lends more than ``max_lend`` and two
incidents never take the same node; a crash at every boundary of taking and giving back
(before and after the reservation change) leaves each node in one place and the pool whole
at the end; a rollback before the job started there returns the node to the reservation.
Between incidents the engine reads the pools once per ``capacity.read_every`` (read only): the
idle gauges follow the reservation, and the spare GPU-hours held idle grow by the GPUs idle at
each read times the time to the next; a read that fails counts nothing for its interval.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, cast

import pytest

from bot.domain.incident import State
from bot.domain.jobs import JobSnapshot, SlurmNodeState
from bot.domain.nodemap import SLINKY_HOSTNAME_OVERRIDE
from bot.engine.commands import CommandResult
from bot.engine.errors import PermanentError, Reason
from bot.engine.ports import PartitionNodes
from bot.engine.steps.capacity import HELD, Claimant, lent_out
from bot.store.base import StepRecord
from tests.engine.harness import (
    Call,
    DaemonSetNodeSet,
    DiesAfter,
    EngineHarness,
    FakeTime,
    Slow,
    Write,
    fleet,
)
from tests.simulator.world import SimulatedWorld

SPARES = {"pools": [{"name": "spares", "kind": "spare", "reservation": "spares"}]}


@dataclass
class _Job:
    job_id: str
    width: int
    nodes: tuple[str, ...]
    state: str = "RUNNING"
    restarts: int = 0
    reason: str = ""
    #: Reads of the job left before Slurm requeues it after its node went DOWN (``None``: not dying).
    dying: int | None = None
    #: When its current run started (Slurm's ``StartTime``), by the harness's clock.
    started: datetime | None = None


@dataclass
class GangSlurm:
    """Nodes, gang jobs and reservations; a pending job starts once ``width`` nodes are free."""

    states: dict[str, str]
    reservations: dict[str, list[str]]
    jobs: dict[str, _Job] = field(default_factory=dict)
    reasons: dict[str, str] = field(default_factory=dict)
    #: Each reservation's first size, and the most nodes it was ever short of it.
    size: dict[str, int] = field(default_factory=dict)
    shortfall: int = 0
    #: The reason a job pending for lack of nodes shows (``None``: ReqNodeNotAvail naming the DOWN nodes).
    pending_reason: str | None = None
    #: As real Slurm: a job whose node is set DOWN still reads RUNNING, on its old nodes with its old
    #: restart count, for a moment (Slurm is killing it) before it is requeued; this many reads (0:
    #: requeued at once). Tests whose replacement is one slow call (``Slow`` on ``successor``) keep
    #: 0: a call that blocks the incident for ten minutes would hold the job track's next look too.
    kill_reads: int = 0
    #: The clock a run's start time is read from (the harness's virtual time).
    clock: Callable[[], datetime] | None = None

    def _schedule(self) -> None:
        for job in self.jobs.values():
            if job.dying is not None:
                if job.dying > 0:
                    job.dying -= 1
                    continue
                job.state, job.nodes, job.restarts, job.dying = "PENDING", (), job.restarts + 1, None
            if job.state != "PENDING":
                continue
            reserved = {n for held in self.reservations.values() for n in held}
            busy = {n for j in self.jobs.values() if j.state == "RUNNING" for n in j.nodes}
            free = [n for n, s in sorted(self.states.items()) if s == "IDLE" and n not in reserved | busy]
            if len(free) >= job.width:
                job.nodes, job.state, job.reason = tuple(free[: job.width]), "RUNNING", ""
                job.started = self.clock() if self.clock else None
            else:
                job.reason = self.pending_reason or "ReqNodeNotAvail, UnavailableNodes:" + ",".join(
                    n for n, s in self.states.items() if s == "DOWN"
                )

    async def nodes(self) -> list[SlurmNodeState]:
        return [await self.node(name) for name in sorted(self.states)]

    def on(self, name: str) -> list[_Job]:
        return [j for j in self.jobs.values() if j.state == "RUNNING" and name in j.nodes]

    # Scheduler
    async def node(self, name: str) -> SlurmNodeState:
        self._schedule()
        if name not in self.states:
            raise PermanentError(f"Slurm node {name} not found", reason=Reason.UNKNOWN_NODE)
        state = self.states[name]
        if state == "IDLE" and self.on(name):
            state = "ALLOCATED"
        return SlurmNodeState(name, frozenset({state}), reason=self.reasons.get(name, ""), gpus=8)

    async def jobs_on_node(self, name: str) -> list[JobSnapshot]:
        self._schedule()
        return [self._snapshot(j) for j in self.on(name)]

    async def job(self, job_id: str) -> JobSnapshot | None:
        self._schedule()
        job = self.jobs.get(job_id)
        return self._snapshot(job) if job else None

    @staticmethod
    def _snapshot(job: _Job) -> JobSnapshot:
        return JobSnapshot(
            job.job_id,
            "train",
            "ml",
            job.state,
            job.nodes,
            job.restarts,
            True,
            job.reason,
            job.started,
            8 * job.width,
        )

    async def partition_nodes(self, name: str) -> PartitionNodes | None:
        return PartitionNodes(len(self.states), ("gpu",))

    async def down(self, name: str, reason: str) -> None:
        self.states[name], self.reasons[name] = "DOWN", reason
        for job in self.on(name):
            if job.dying is None:
                job.dying = self.kill_reads
        self._schedule()

    async def drain(self, name: str, reason: str) -> None:
        await self.down(name, reason)

    async def resume(self, name: str) -> None:
        self.states[name], self.reasons[name] = "IDLE", ""

    async def requeue(self, job_id: str) -> None:
        pass

    # Reservations
    async def reservation(self, name: str) -> tuple[str, ...] | None:
        held = self.reservations.get(name)
        return tuple(held) if held is not None else None

    async def set_reservation_nodes(self, name: str, nodes: Sequence[str]) -> None:
        if not nodes:
            raise PermanentError("Slurm cannot empty a reservation", reason=Reason.REFUSED)
        self.size.setdefault(name, len(self.reservations[name]))
        self.reservations[name] = list(nodes)
        self.shortfall = max(self.shortfall, self.size[name] - len(nodes))

    def whereabouts(self) -> dict[str, int]:
        """How many places (reservation, running job) hold each node: never more than one."""
        count = dict.fromkeys(self.states, 0)
        for held in self.reservations.values():
            for n in held:
                count[n] += 1
        for job in self.jobs.values():
            if job.state == "RUNNING":
                for n in job.nodes:
                    count[n] += 1
        return count


def gang(jobs: int = 1, spares: int = 2, width: int = 2) -> GangSlurm:
    """``jobs`` jobs of ``width`` nodes on gpu-node-01.. and ``spares`` nodes after them in the reservation."""
    names = [f"gpu-node-{n:02d}" for n in range(1, width * jobs + spares + 1)]
    slurm = GangSlurm(dict.fromkeys(names, "IDLE"), {"spares": names[width * jobs :]})
    for j in range(jobs):
        slurm.jobs[str(100 + j)] = _Job(str(100 + j), width, tuple(names[width * j : width * (j + 1)]))
    return slurm


def harness(
    tmp_path: Path, slurm: GangSlurm, capacity: dict[str, Any] | None = SPARES, **kw: Any
) -> EngineHarness:
    names = tuple(slurm.states)
    built = EngineHarness(tmp_path, inventory=fleet(names), slurm=slurm, capacity=capacity, **kw)
    slurm.clock = built.time.now
    return built


@dataclass(frozen=True)
class ThenStop:
    """The call reaches the far side, then pitcrew is stopped before it hears back."""

    seconds: float = 3600

    async def __call__(self, time: FakeTime, call: Call) -> Any:
        await call()
        await time.sleep(self.seconds)


@dataclass
class NotReadyFor:
    """A replacement that boots for ``seconds`` of virtual time from its first look (each look
    answers at once, unlike ``Slow``, so the incident's other track goes on meanwhile)."""

    seconds: float
    since: float | None = None

    async def __call__(self, time: FakeTime, call: Call) -> Any:
        node = await call()
        self.since = time.elapsed if self.since is None else self.since
        if node is not None and time.elapsed - self.since < self.seconds:
            return dataclasses.replace(node, ready=False)
        return node


class _Registers(DaemonSetNodeSet):
    """The replacement's slurmd registers its new Slurm node in ``GangSlurm``, idle."""

    def __init__(self, world: SimulatedWorld, slurm: GangSlurm) -> None:
        super().__init__(world, annotated=True)
        self.slurm = slurm

    async def replace(
        self,
        name: str,
        *,
        strategy: str,
        incident_id: str,
        slurm_nodes: Sequence[str] = (),
        nodeset_pods: Sequence[str] = (),
    ) -> str:
        handle = await super().replace(
            name,
            strategy=strategy,
            incident_id=incident_id,
            slurm_nodes=slurm_nodes,
            nodeset_pods=nodeset_pods,
        )
        for new in self.successors.values():
            self.slurm.states.setdefault(new, "IDLE")
        return handle


async def test_a_replacement_under_a_new_name_refills_the_pool_under_that_name(tmp_path: Path) -> None:
    slurm = gang()
    mapping = {"node_mapping": "annotation", "node_mapping_key": SLINKY_HOSTNAME_OVERRIDE}
    async with harness(tmp_path, slurm, cluster=lambda world: _Registers(world, slurm), mapping=mapping) as h:
        incident = await h.alert("gpu-node-01")
        done = await h.until_ended(incident)
        assert done.state.value == "resolved", await h.timeline(incident)
        assert slurm.reservations["spares"] == ["gpu-node-04", "gpu-node-01-x7b2n"]
        assert slurm.states["gpu-node-01"] == "DOWN"  # the record left behind, never resumed
        assert (await h.steps(incident))["give_back"].result["node"] == "gpu-node-01-x7b2n"


async def test_a_spare_runs_the_stalled_job_before_the_replacement_and_the_repair_refills_the_pool(
    tmp_path: Path,
) -> None:
    slurm = gang()
    async with harness(tmp_path, slurm) as h:
        h.world.replace_seconds = 0
        h.cluster.script("successor", Slow(600))  # a replacement that takes ten minutes
        incident = await h.alert("gpu-node-01")
        running = await h.until_event(incident, "job_running")
        assert slurm.jobs["100"].nodes == ("gpu-node-02", "gpu-node-03")
        assert slurm.reservations["spares"] == ["gpu-node-04"]
        assert running.data["seconds"] < 60  # the job is back in seconds, not the replacement's ten minutes
        assert h.sample("pitcrew_capacity_lent_nodes", pool="spares") == 1
        done = await h.until_ended(incident)
        assert done.state.value == "resolved"
        assert slurm.reservations["spares"] == ["gpu-node-04", "gpu-node-01"]
        steps = await h.steps(incident)
        assert steps["capacity"].result["node"] == "gpu-node-03"
        assert steps["give_back"].result["node"] == "gpu-node-01"
        actions = [e.data["action"] for e in await h.events(incident, "action")]
        assert actions.count("capacity_take") == 1 and actions.count("capacity_give_back") == 1
        assert h.sample("pitcrew_capacity_lent_nodes", pool="spares") == 0
        assert h.sample("pitcrew_capacity_away_seconds_count", pool="spares") == 1
        assert set(slurm.whereabouts().values()) == {1}
        [notice] = h.notices("capacity", incident)
        assert "gpu-node-03" in notice["title"]
        # The training loss is clocked to the restart Slurm reports, seconds after the fault.
        [job] = cast(list[dict[str, Any]], steps["confirm_resumed"].result["jobs"])
        assert isinstance(job, dict) and 0 <= job["seconds_to_restart"] < 60, job
        [summary] = h.notices("summary", incident)
        [lost] = [line for line in summary["lines"] if line.startswith("job 100 training lost:")]
        assert "counted of" not in lost and "to running again; resumed" in lost, lost


async def test_between_incidents_the_pools_are_read_and_their_idle_gpu_hours_counted(tmp_path: Path) -> None:
    slurm = gang(jobs=1, spares=2)  # 8 GPUs a node
    async with harness(tmp_path, slurm, capacity={**SPARES, "read_every": "10m"}) as h:
        watch = h.engine.pool_watch
        assert watch is not None
        await h.time.advance(3600)  # an hour without an incident: one read per ten minutes
        assert 5 <= watch.reads <= 6
        assert h.sample("pitcrew_capacity_idle_nodes", pool="spares") == 2
        assert h.sample("pitcrew_capacity_idle_gpus", pool="spares") == 16
        held = h.sample("pitcrew_capacity_idle_gpu_hours_total", pool="spares")
        # Reads fall on the engine's scans, a poll (seconds) past each ten minutes at most.
        assert held == pytest.approx(16 * (watch.reads - 1) * 10 / 60, rel=0.01)
        slurm.reservations["spares"] = ["gpu-node-04"]  # one spare handed elsewhere
        reads = watch.reads
        await h.time.advance(1200)
        assert watch.reads == reads + 2
        assert h.sample("pitcrew_capacity_idle_nodes", pool="spares") == 1
        # The read just after the change still counts the 16 GPUs held until then; then 8.
        assert h.sample("pitcrew_capacity_idle_gpu_hours_total", pool="spares") == pytest.approx(
            held + 16 * 10 / 60 + 8 * 10 / 60, rel=0.01
        )
        assert slurm.reservations["spares"] == ["gpu-node-04"]  # read only
        del slurm.reservations["spares"]  # the reservation is gone: reads fail, nothing counted
        held = h.sample("pitcrew_capacity_idle_gpu_hours_total", pool="spares")
        await h.time.advance(1200)
        assert h.sample("pitcrew_capacity_idle_gpu_hours_total", pool="spares") == held


@pytest.mark.parametrize(
    "reason",
    [
        "Resources",
        "Nodes_required_for_job_are_DOWN,_DRAINED_or_reserved_for_jobs_in_higher_priority_partitions",
        "Nodes required for job are DOWN, DRAINED or reserved for jobs in higher priority partitions",
    ],
    ids=["resources", "scontrol-down-drained", "squeue-down-drained"],
)
async def test_each_way_slurm_says_lack_of_nodes_takes_a_spare(tmp_path: Path, reason: str) -> None:
    slurm = gang()
    slurm.pending_reason = reason
    async with harness(tmp_path, slurm) as h:
        h.cluster.script("successor", Slow(600))
        incident = await h.alert("gpu-node-01")
        await h.until_event(incident, "job_running")
        assert slurm.jobs["100"].nodes == ("gpu-node-02", "gpu-node-03")


async def test_a_job_still_running_on_its_downed_node_is_not_taken_for_restarted(tmp_path: Path) -> None:
    """Right after DOWN, Slurm still shows the interrupted run RUNNING on the node it is killing,
    with its old restart count: that is not Slurm restarting it, and the spare is still taken."""
    slurm = gang()
    slurm.kill_reads = 3
    async with harness(tmp_path, slurm) as h:
        h.cluster.script("successor", NotReadyFor(600))  # the replacement takes ten minutes
        incident = await h.alert("gpu-node-01")
        running = await h.until_event(incident, "job_running")
        assert running.data["seconds"] < 60
        assert slurm.jobs["100"].nodes == ("gpu-node-02", "gpu-node-03")
        steps = await h.steps(incident)
        assert steps["capacity"].result["node"] == "gpu-node-03"
        done = await h.until_ended(incident)
        assert done.state.value == "resolved", await h.timeline(incident)
        assert slurm.reservations["spares"] == ["gpu-node-04", "gpu-node-01"]


async def test_a_job_slurm_restarts_by_itself_takes_nothing(tmp_path: Path) -> None:
    slurm = gang(spares=2)
    slurm.states["gpu-node-05"] = "IDLE"  # a free node outside the reservation
    async with harness(tmp_path, slurm) as h:
        incident = await h.alert("gpu-node-01")
        await h.until_ended(incident)
        steps = await h.steps(incident)
        assert steps["capacity"].result.get("node") is None
        assert slurm.reservations["spares"] == ["gpu-node-03", "gpu-node-04"]
        assert steps["give_back"].result.get("given_back_at") is None


@pytest.mark.parametrize(
    ("capacity", "says"),
    [(None, "no pool is configured"), ({"pools": [{**SPARES["pools"][0], "min_idle": 2}]}, "min_idle")],
    ids=["no-pool", "min-idle"],
)
async def test_nothing_taken_says_why_and_the_job_waits_for_the_repair(
    tmp_path: Path, capacity: dict[str, Any] | None, says: str
) -> None:
    slurm = gang()
    async with harness(tmp_path, slurm, capacity=capacity) as h:
        incident = await h.alert("gpu-node-01")
        done = await h.until_ended(incident)
        assert done.state.value == "resolved"
        steps = await h.steps(incident)
        assert says in cast(str, steps["capacity"].result["waiting"])
        assert slurm.reservations["spares"] == ["gpu-node-03", "gpu-node-04"]
        assert "gpu-node-01" in slurm.jobs["100"].nodes  # it waited for its node to come back


async def test_a_storm_never_lends_more_than_max_lend_nor_one_node_twice(tmp_path: Path) -> None:
    slurm = gang(jobs=3, spares=4, width=1)  # one-node jobs: none can fit into another's nodes
    pools = {"pools": [{**SPARES["pools"][0], "max_lend": 2}]}
    async with harness(tmp_path, slurm, capacity=pools) as h:
        h.cluster.always("successor", Slow(600))
        incidents = [await h.alert(f"gpu-node-0{n}") for n in (1, 2, 3)]
        for incident in incidents:
            await h.until_ended(incident)
        takes = [
            e for i in incidents for e in await h.events(i, "action") if e.data["action"] == "capacity_take"
        ]
        # The third waited (max_lend). All three repairs end at the same instant, so whether it then
        # takes the spare a give-back just freed, or sees its own repair first, is a matter of order:
        # either way no more than two are out at once (``shortfall``) and no node is taken twice.
        taken = [(await h.steps(i))["capacity"].result.get("node") for i in incidents]
        assert len(takes) == sum(n is not None for n in taken) >= 2
        assert taken[0] and taken[1] and len({n for n in taken if n}) == len(takes)
        said = [e.detail for i in incidents for e in await h.events(i, "capacity_none")]
        assert said and all("max_lend" in d for d in said), said
        assert slurm.shortfall == 2  # at most two spares were ever out of the pool at once
        assert max(slurm.whereabouts().values()) == 1
        assert len(slurm.reservations["spares"]) == 4  # whole again
        assert all(j.state == "RUNNING" for j in slurm.jobs.values())


async def test_the_lent_gauge_is_what_the_store_holds_in_each_process_that_leads(tmp_path: Path) -> None:
    """``pitcrew_capacity_lent_nodes`` was counted up at a take and down at a give-back in the
    process that made them: a process started between the two (a restarted pod, the replica that
    took over) said 0 while a node was out, then -1 for good once it came back, and a process that
    stopped leading went on saying 1 beside the new leader (dashboards sum the replicas)."""
    slurm = gang()
    async with harness(tmp_path, slurm) as h:
        h.world.replace_seconds = 0
        h.cluster.script("successor", Slow(600))
        incident = await h.alert("gpu-node-01")
        await h.until_event(incident, "job_running")
        assert h.sample("pitcrew_capacity_lent_nodes", pool="spares") == 1
        await h.engine.stop()  # no longer leads
        assert h.sample("pitcrew_capacity_lent_nodes", pool="spares") == 0
        await h.restart(new_process=True, settle=False)  # the node still out, the repair under way
        assert h.sample("pitcrew_capacity_lent_nodes", pool="spares") == 1
        done = await h.until_ended(incident)
        assert done.state.value == "resolved"
        assert slurm.reservations["spares"] == ["gpu-node-04", "gpu-node-01"]
        assert h.sample("pitcrew_capacity_lent_nodes", pool="spares") == 0


async def test_a_pool_read_under_way_never_shows_a_give_back_undone(tmp_path: Path) -> None:
    """A pool read took the store's snapshot, then waited on Slurm while the give-back finished
    and counted itself down: the read then set the gauge from its older snapshot, saying 1 until
    the next read. Now the gauge is set only from the store, after each change is saved, one read
    and set at a time."""
    slurm = gang()
    async with harness(tmp_path, slurm, capacity={**SPARES, "read_every": "1m"}) as h:
        h.world.replace_seconds = 0
        h.cluster.script("successor", Slow(600))
        incident = await h.alert("gpu-node-01")
        await h.until_event(incident, "job_running")
        watch = h.engine.pool_watch
        assert watch is not None
        await h.run_until(lambda: not watch.reading)
        reads = watch.reads
        h.scheduler.script("reservation", Slow(1800))  # the next pool read waits past the give-back
        await h.run_until(lambda: watch.reads == reads + 1)
        done = await h.until_ended(incident)
        assert done.state.value == "resolved" and watch.reading
        assert slurm.reservations["spares"] == ["gpu-node-04", "gpu-node-01"]
        assert h.sample("pitcrew_capacity_lent_nodes", pool="spares") == 0
        await h.run_until(lambda: not watch.reading)
        assert watch.reads == reads + 1  # the slow read has ended; no other has begun
        assert h.sample("pitcrew_capacity_lent_nodes", pool="spares") == 0


AT = datetime(2026, 12, 5, 9, 0, tzinfo=UTC)


def _record(step: str, status: str, **result: Any) -> StepRecord:
    return StepRecord("inc-1", step, cast(Any, status), 1, AT, None, result)


def _opened(*records: StepRecord) -> Claimant:
    return Claimant("inc-1", "gpu-node-01", {r.step: r for r in records})


TAKEN = {"node": "gpu-node-03", "pool": "spares", "reservation": "spares", "taken_at": AT.isoformat()}


@pytest.mark.parametrize(
    ("records", "out"),
    [
        ((), 0),
        ((_record("capacity", "running", node="gpu-node-03", pool="spares"),), 0),  # intent only
        ((_record("capacity", "running", **TAKEN),), 1),  # out of the pool; the step not finished
        ((_record("capacity", "ok", **TAKEN),), 1),
        ((_record("capacity", "failed", **TAKEN),), 1),  # the node is out all the same
        ((_record("capacity", "ok", **TAKEN), _record("give_back", "running", node="gpu-node-01")), 1),
        (
            (
                _record("capacity", "ok", **TAKEN),
                _record("give_back", "running", node="gpu-node-01", given_back_at=AT.isoformat()),
            ),
            0,  # given back; the step not finished
        ),
        ((_record("capacity", "undone", **TAKEN, undo="capacity: gpu-node-03 back"),), 0),
        ((_record("capacity", "superseded", **TAKEN),), 0),
        ((_record("capacity", "running", passed_over=["gpu-node-03"], waiting="gave up"),), 0),
    ],
    ids=[
        "no-take",
        "intended",
        "taken-under-way",
        "taken",
        "taken-then-failed",
        "give-back-under-way",
        "given-back-under-way",
        "undone",
        "superseded",
        "given-up",
    ],
)
def test_the_lent_count_is_read_from_the_saved_progress(records: tuple[StepRecord, ...], out: int) -> None:
    assert lent_out([_opened(*records)])["spares"] == out


BOUNDARIES = [
    ("take", 0),  # intent stored, the reservation not yet changed
    ("take", 1),  # the reservation changed, pitcrew stopped before it recorded the take
    ("give", 0),
    ("give", 1),
]


@pytest.mark.parametrize(
    ("phase", "after"), BOUNDARIES, ids=[f"{p}-{'after' if a else 'before'}" for p, a in BOUNDARIES]
)
async def test_a_crash_at_every_boundary_leaves_each_node_in_one_place_and_the_pool_whole(
    tmp_path: Path, phase: str, after: int
) -> None:
    slurm = gang()
    async with harness(tmp_path, slurm) as h:
        effect = ThenStop() if after else Slow(3600)
        if phase == "take":
            h.scheduler.script("set_reservation_nodes", effect)
        else:
            h.scheduler.script("set_reservation_nodes", Slow(0), effect)
        incident = await h.alert("gpu-node-01")
        await h.run_until(lambda: h.scheduler.calls["set_reservation_nodes"] == (1 if phase == "take" else 2))
        await h.restart()
        done = await h.until_ended(incident)
        assert done.state.value == "resolved"
        assert slurm.reservations["spares"] == ["gpu-node-04", "gpu-node-01"]
        assert slurm.jobs["100"].nodes == ("gpu-node-02", "gpu-node-03")
        assert set(slurm.whereabouts().values()) == {1}
        assert all(state == "IDLE" for state in slurm.states.values())  # nothing left DOWN
        assert h.sample("pitcrew_capacity_lent_nodes", pool="spares") in (0, -0.0)


async def test_rollback_before_the_job_started_returns_the_node(tmp_path: Path) -> None:
    slurm = gang()
    slurm.states["gpu-node-02"] = "DOWN"  # the job cannot start on the spare: it needs two nodes
    async with harness(tmp_path, slurm) as h:
        h.cluster.always("successor", Slow(600))
        incident = await h.alert("gpu-node-01")
        await h.run_until(lambda: slurm.reservations["spares"] == ["gpu-node-04"])
        assert h.sample("pitcrew_capacity_lent_nodes", pool="spares") == 1
        answer = await h.commands.rollback(incident, "alice")
        assert answer.ok and "gpu-node-03 back in reservation spares" in str(answer.data), answer
        assert slurm.reservations["spares"] == ["gpu-node-04", "gpu-node-03"]
        assert h.sample("pitcrew_capacity_lent_nodes", pool="spares") == 0


async def test_a_rollback_held_after_the_node_went_back_shows_it_back(tmp_path: Path) -> None:
    """A pause comes right after the rollback put the node back: the rest of the rollback waits
    for resume, the incident stays open, and the gauge says the node is back already."""
    slurm = gang()
    slurm.states["gpu-node-02"] = "DOWN"  # the job cannot start on the spare: it needs two nodes
    async with harness(tmp_path, slurm) as h:
        h.cluster.always("successor", Slow(600))

        async def then_pause(time: FakeTime, call: Call) -> Any:
            done = await call()
            await h.commands.pause("oncall", "maintenance")
            return done

        h.scheduler.script("set_reservation_nodes", Slow(0), then_pause)  # the take, then its undo
        incident = await h.alert("gpu-node-01")
        await h.run_until(lambda: slurm.reservations["spares"] == ["gpu-node-04"])
        assert h.sample("pitcrew_capacity_lent_nodes", pool="spares") == 1
        await h.commands.rollback(incident, "alice")
        assert slurm.reservations["spares"] == ["gpu-node-04", "gpu-node-03"]
        assert await h.events(incident, "rollback_held")
        assert not (await h.incident(incident)).state.terminal
        assert h.sample("pitcrew_capacity_lent_nodes", pool="spares") == 0


async def _fails_holding_a_node(h: EngineHarness, *, shown: bool = True) -> str:
    """The repair fails after gpu-node-03 was taken for job 100: its replacement never comes up.
    ``shown``: the harness's own engine leads, and its lent gauge counts the node meanwhile."""
    h.world.replace_seconds = 0
    h.cluster.always("successor", Slow(3 * 3600))
    incident = await h.alert("gpu-node-01")
    await h.until_event(incident, "job_running")
    assert not shown or h.sample("pitcrew_capacity_lent_nodes", pool="spares") == 1
    assert (await h.until_ended(incident, within=4 * 3600)).state.value == "failed"
    return incident


async def test_an_incident_that_fails_holding_a_node_says_so_and_keeps_counting_it(tmp_path: Path) -> None:
    """The repair fails after a spare was taken: the job keeps running on the spare, which stays
    out of its pool. The escalation says so, the lent gauge goes on counting it after the incident
    has ended (it dropped to 0 as the incident ended, while the node was still out), and a rollback
    cannot put it back while the job runs there."""
    slurm = gang()
    async with harness(tmp_path, slurm) as h:
        incident = await _fails_holding_a_node(h)
        [escalation] = h.notices("escalation", incident)
        [said] = [line for line in escalation["lines"] if "gpu-node-03" in line]
        assert said.startswith("gpu-node-03, taken from pool spares for the stalled job, stays out of it"), (
            said
        )
        assert "count it until it is back" in said, said
        assert slurm.reservations["spares"] == ["gpu-node-04"]
        assert h.sample("pitcrew_capacity_lent_nodes", pool="spares") == 1
        answer = await h.commands.rollback(incident, "alice")
        assert "gpu-node-03 left in the partition: job 100 runs there" in str(answer.data), answer
        assert h.sample("pitcrew_capacity_lent_nodes", pool="spares") == 1


@pytest.mark.parametrize(
    "write",
    [
        ("remember", lambda a: a[0] == HELD and any(v is not None for v in a[1].values())),
        ("transition", lambda a: a[1] is State.FAILED),
    ],
    ids=["indexed", "ended"],
)
async def test_a_crash_as_an_incident_ends_holding_a_node_keeps_it_counted(
    tmp_path: Path, write: Write
) -> None:
    """pitcrew dies right after the index names the failing incident (it is still open), or right
    after the incident has ended, before the gauge is shown again: the process that leads next
    still counts the node out."""
    slurm = gang()
    dies = DiesAfter(write)
    async with harness(tmp_path, slurm, store=dies.wrap) as h:
        h.world.replace_seconds = 0
        h.cluster.always("successor", Slow(3 * 3600))
        incident = await h.alert("gpu-node-01")
        await h.run_until(lambda: dies.cut, 4 * 3600, about=incident)
        await h.restart(new_process=True)
        assert (await h.until_ended(incident, within=4 * 3600)).state is State.FAILED
        assert set(await h.store.memory(HELD)) == {incident}
        assert h.sample("pitcrew_capacity_lent_nodes", pool="spares") == 1
        assert slurm.reservations["spares"] == ["gpu-node-04"]


async def test_a_node_an_ended_incident_holds_counts_against_max_lend_until_a_rollback_returns_it(
    tmp_path: Path,
) -> None:
    """A failed incident keeps gpu-node-03 with its job, out of a pool that lends at most one node.
    Across a restart, the gauge still counts it and the next stalled job is refused for
    ``max_lend`` (before, the pools counted open incidents' takes only, and lent a second node);
    once a rollback has put it back, the index forgets the incident and the gauge drops."""
    slurm = gang(jobs=2, spares=3, width=1)  # jobs on gpu-node-01 and -02; spares -03, -04, -05
    pools = {"pools": [{**SPARES["pools"][0], "max_lend": 1}]}
    async with harness(tmp_path, slurm, capacity=pools) as h:
        first = await _fails_holding_a_node(h)
        assert slurm.jobs["100"].nodes == ("gpu-node-03",)
        assert set(await h.store.memory(HELD)) == {first}
        await h.restart(new_process=True, settle=False)
        assert h.sample("pitcrew_capacity_lent_nodes", pool="spares") == 1

        second = await h.alert("gpu-node-02")
        said = await h.until_event(second, "capacity_none")
        assert "max_lend" in said.detail and "1 of 3 already lent" in said.detail, said.detail
        assert slurm.reservations["spares"] == ["gpu-node-04", "gpu-node-05"]
        assert slurm.jobs["101"].state == "PENDING"

        slurm.jobs["101"].state = "CANCELLED"  # so that Slurm starts nothing on the node freed next
        slurm.jobs["100"].state = "COMPLETED"
        back = _report(await h.commands.rollback(first, "alice"))
        assert "capacity: gpu-node-03 back in reservation spares" in back, back
        assert slurm.reservations["spares"] == ["gpu-node-04", "gpu-node-05", "gpu-node-03"]
        await h.run_until(lambda: h.sample("pitcrew_capacity_lent_nodes", pool="spares") == 0)
        assert await h.store.memory(HELD) == {}
        assert max(slurm.whereabouts().values()) == 1


def _report(answer: CommandResult) -> list[str]:
    assert answer.ok and answer.data is not None, answer
    return list(answer.data["report"])


async def test_a_rollback_keeps_the_node_a_job_runs_on_and_returns_it_when_asked_again(
    tmp_path: Path,
) -> None:
    """The take's undo keeps the node while the job runs there (``Kept``): the incident ends
    rolled back with everything else undone, the take stays as it was, and the answer says to ask
    again. Asked again while the job still runs, it keeps it again; once the job has ended, it
    puts the node back and undoes nothing else; then there is nothing left to roll back."""
    slurm = gang()
    async with harness(tmp_path, slurm) as h:
        incident = await _fails_holding_a_node(h)
        again = f"Roll back again to undo what was kept: `pitcrew rollback {incident}`"

        kept = "capacity: gpu-node-03 left in the partition: job 100 runs there"
        first = _report(await h.commands.rollback(incident, "alice"))
        assert kept in first and first[-1] == again, first
        assert (await h.incident(incident)).state.value == "rolled_back"
        assert (await h.steps(incident))["capacity"].status == "ok"  # kept: not undone
        assert [e.detail for e in await h.events(incident, "step_kept")] == [kept]
        undone = {e.step for e in await h.events(incident, "step_undone")}
        assert "capacity" not in undone and "slurm_down" in undone
        assert slurm.reservations["spares"] == ["gpu-node-04"]

        calls = h.calls()
        still = _report(await h.commands.rollback(incident, "bob"))  # the job runs there yet: kept again
        assert still == [kept, again], still
        assert h.calls() == calls
        assert slurm.reservations["spares"] == ["gpu-node-04"]

        slurm.jobs["100"].state = "COMPLETED"
        back = _report(await h.commands.rollback(incident, "carol"))
        assert back == ["capacity: gpu-node-03 back in reservation spares"], back
        assert h.calls() == calls  # nothing else reached the far side again
        assert slurm.reservations["spares"] == ["gpu-node-04", "gpu-node-03"]
        steps = await h.steps(incident)
        assert steps["capacity"].status == "undone"
        assert steps["rollback"].result["kept"] == []
        told = h.notices("rollback", incident)
        assert [(n["lines"], n["actions"]) for n in told] == [
            (first, ["rollback"]),  # kept: it offers to roll back again
            (still, ["rollback"]),
            (back, []),
        ]
        assert (await h.incident(incident)).outcome == "rolled back by alice"
        assert h.sample("pitcrew_incidents_closed_total", state="rolled_back", playbook="replace-node") == 1

        refused = await h.commands.rollback(incident, "dave")
        assert refused.status == "conflict" and "nothing to roll back" in refused.message, refused


async def test_a_kept_node_asked_again_through_a_standby_is_returned_by_the_leader(tmp_path: Path) -> None:
    slurm = gang()
    fast = {"poll_interval": timedelta(seconds=2)}
    async with harness(tmp_path, slurm, lease=timedelta(seconds=15), engine=fast) as h:
        a = await h.process("a")
        b = await h.process("b")
        incident = await _fails_holding_a_node(h, shown=False)
        kept = "capacity: gpu-node-03 left in the partition: job 100 runs there"
        for expected in ([kept], ["capacity: gpu-node-03 back in reservation spares"]):
            asked = asyncio.create_task(b.commands.rollback(incident, "bob"))
            await h.run_until(asked.done, 300)
            assert set(expected) <= set(_report(asked.result()))
            slurm.jobs["100"].state = "COMPLETED"
        assert slurm.reservations["spares"] == ["gpu-node-04", "gpu-node-03"]
        assert b.calls == Counter() and a.calls
        assert len(await h.events(incident, "rollback_done")) == 2


def _taken(args: tuple[Any, ...]) -> bool:
    return bool(args[1] == "capacity" and args[2].get("taken_at"))


def _waiting_saved(args: tuple[Any, ...]) -> bool:
    return bool(args[1] == "capacity" and args[2].get("waiting"))


MIN_IDLE = {"pools": [{**SPARES["pools"][0], "min_idle": 2}]}


@pytest.mark.parametrize(
    ("capacity", "write", "says"),
    [
        (SPARES, ("step_progress", _taken), "lent gpu-node-03"),
        (MIN_IDLE, ("enqueue", lambda a: a[2] == "capacity"), "no node to lend"),
        (MIN_IDLE, ("step_progress", _waiting_saved), "no node to lend"),
    ],
    ids=["lent-recorded", "waiting-told", "waiting-recorded"],
)
async def test_a_crash_beside_a_capacity_notice_tells_it_once(
    tmp_path: Path, capacity: dict[str, Any], write: Write, says: str
) -> None:
    """pitcrew dies right after the take (or the reason it waits) is recorded, or right after it
    is told: the notice is told once all the same (before, recorded first and told after, a crash
    between lost it)."""
    slurm = gang()
    dies = DiesAfter(write)

    async with harness(tmp_path, slurm, capacity=capacity, outbox=["slack"], store=dies.wrap) as h:
        incident = await h.alert("gpu-node-01")
        await h.run_until(lambda: dies.cut, about=incident)
        await h.restart()
        done = await h.until_ended(incident)
        assert done.state.value == "resolved"
        told = await h.told_once(incident, "capacity")
        assert says in told.detail
        assert set(slurm.whereabouts().values()) == {1}
