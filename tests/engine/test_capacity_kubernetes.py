"""``capacity`` and ``give_back`` with Kubernetes pools (label selectors), in the engine, in virtual time.

The far side is this file's own: the simulated cluster plus a few GPU nodes that carry pool
labels (``LendingCluster``: relabels, cordons and evicts as one merge patch would, and a
budget that refuses evictions for a while), and Slurm that places gang jobs only on nodes
its NodeSet selects (``NodeSetSlurm``: a node joins the partition when it carries the
NodeSet's label, as a Slinky NodeSet starts its slurmd there).

Cases: a spare by selector joins the partition and the stalled job runs there long before
the (slow) replacement, and the repaired node refills the pool; a lender's inference pods are
evicted through their budget before the node joins, and when the repair is done the
inference pool has its size again; a budget held past ``evict_grace`` hands the node back
untouched and the job waits; with ``give_back: return`` the lent inference node goes back to
its pool as it was (labels, cordon, marks) once the job has left it and the repaired node joins
training, and a job still on the lent node after ``return_wait`` has the repaired node refill
the inference pool instead (the incident never fails waiting for a days-long job); ``min_idle``
with no lender takes nothing and says why; a crash
at every boundary of the take and the give-back leaves no node in two places, none cordoned
or marked, and the pool whole; a rollback before the job started there restores the node, one
while the job runs there keeps it lent, and one asked again after the job restores it.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import pytest

from bot.domain.ownership import LENT_ANNOTATION, lent_marks, lent_prior, lent_to
from bot.engine.errors import PermanentError, Reason, TransientError
from bot.engine.ports import ClusterNode, Lend, PodRef
from tests.engine.harness import DiesAfter, EngineHarness, Slow, fleet
from tests.engine.test_capacity import GangSlurm, ThenStop, _Job
from tests.simulator.cluster import SimulatedCluster
from tests.simulator.world import SimulatedWorld

NODESET = {"slinky.slurm.net/nodeset": "gpu"}
SPARE = {"pitcrew.dev/pool": "spare"}
INFERENCE = {"pitcrew.dev/pool": "inference", "workload": "vllm"}
SPARES = {
    "name": "spares",
    "kind": "spare",
    "selector": "pitcrew.dev/pool=spare",
    "join_labels": NODESET,
}
LENDERS = {
    "name": "inference",
    "kind": "lender",
    "selector": "pitcrew.dev/pool=inference",
    "join_labels": NODESET,
    "leave_labels": ["workload"],
    "evict_grace": "10m",
}


@dataclass
class _PoolNode:
    labels: dict[str, str]
    annotations: dict[str, str] = field(default_factory=dict)
    unschedulable: bool = False
    pods: list[str] = field(default_factory=list)
    #: A node of the simulated fleet (its cordon and repair are the simulated world's).
    inventory: bool = False


@dataclass
class Fleet:
    """The Kubernetes nodes outside the simulated fleet: the pools' members (and, after a refill, the repaired node)."""

    nodes: dict[str, _PoolNode]
    #: Evictions the inference budget refuses before it lets one through (its replicas elsewhere not ready).
    budget_refusals: int = 0
    evicted: list[str] = field(default_factory=list)
    patches: int = 0
    #: Pool commands run, in order: (node, argv).
    commands: list[tuple[str, list[str]]] = field(default_factory=list)

    def members(self, labels: dict[str, str]) -> list[str]:
        return sorted(n for n, node in self.nodes.items() if labels.items() <= node.labels.items())


class NodeSetSlurm(GangSlurm):
    """Slurm whose partition is the NodeSet: a node is a schedulable member while it carries ``NODESET``."""

    def __init__(self, kube: Fleet, states: dict[str, str]) -> None:
        super().__init__(states, {})
        self.kube = kube

    def outside(self) -> list[str]:
        """Nodes the NodeSet does not select, or cordoned: no slurmd runs there, Slurm does not know
        them (slurm-operator runs no NodeSet pod on a cordoned node, and drains the Slurm node of one)."""
        return [
            n
            for n, node in self.kube.nodes.items()
            if not NODESET.items() <= node.labels.items() or node.unschedulable
        ]

    def _schedule(self) -> None:
        self.reservations = {"(outside the NodeSet)": self.outside()}  # never given to a job
        super()._schedule()

    async def node(self, name: str) -> Any:
        if name in self.outside():
            raise PermanentError(f"Slurm node {name} not found", reason=Reason.UNKNOWN_NODE)
        return await super().node(name)

    def whereabouts(self) -> dict[str, int]:
        """Places holding each node (a pool, a running job): never more than one."""
        count = dict.fromkeys(self.states, 0)
        for name in self.kube.members(SPARE) + self.kube.members({"pitcrew.dev/pool": "inference"}):
            count[name] += 1
        for job in self.jobs.values():
            if job.state == "RUNNING":
                for n in job.nodes:
                    count[n] += 1
        return count


def lending_cluster(kube: Fleet) -> Any:
    class LendingCluster(SimulatedCluster):
        def __init__(self, world: SimulatedWorld) -> None:
            super().__init__(world)

        async def node(self, name: str) -> ClusterNode | None:
            n = kube.nodes.get(name)
            if n is None:
                return await super().node(name)
            if n.inventory:  # a simulated fleet node that joined a pool: the simulated node, relabelled
                node = await super().node(name)
                return None if node is None else replace(node, labels=dict(n.labels))
            return ClusterNode(
                name, n.unschedulable, labels=dict(n.labels), annotations=dict(n.annotations), gpus=8
            )

        async def pool_nodes(self, selector: str) -> list[ClusterNode]:
            key, _, value = selector.partition("=")
            found = [await self.node(name) for name in kube.members({key: value})]
            return [n for n in found if n is not None]

        async def lend(self, name: str, lend: Lend) -> bool:
            n = kube.nodes[name]
            owner = lent_to(n.annotations)
            if owner == lend.incident_id:
                return False
            if owner is not None:
                raise PermanentError(f"{name} lent to {owner}", reason=Reason.CONFLICT)
            from bot.domain.ownership import LentPrior

            keys = dict.fromkeys([*lend.leave, *lend.join])
            prior = LentPrior(
                {k: n.labels.get(k) for k in keys}, n.unschedulable if lend.cordon else None, lend.cordon
            )
            n.annotations.update(lent_marks(lend.incident_id, prior))
            for key in lend.leave:
                n.labels.pop(key, None)
            n.unschedulable = n.unschedulable or lend.cordon
            kube.patches += 1
            return True

        async def join(self, name: str, labels: Any, *, incident_id: str) -> bool:
            n = kube.nodes[name]
            if lent_to(n.annotations) != incident_id:
                return False
            prior = lent_prior(n.annotations)
            self._label(n, labels)
            if prior is not None and prior.cordoned:
                n.unschedulable = False
            kube.patches += 1
            return True

        async def lend_back(self, name: str, *, incident_id: str) -> bool:
            return self._end(name, incident_id, restore=True)

        async def keep_lent(self, name: str, *, incident_id: str) -> bool:
            return self._end(name, incident_id, restore=False)

        def _end(self, name: str, incident_id: str, *, restore: bool) -> bool:
            n = kube.nodes[name]
            if lent_to(n.annotations) != incident_id:
                return False
            prior = lent_prior(n.annotations)
            assert prior is not None
            if restore:
                self._label(n, prior.labels)
            if prior.cordoned:
                n.unschedulable = bool(prior.unschedulable)
            n.annotations = {k: v for k, v in n.annotations.items() if not k.startswith("pitcrew.dev/lent")}
            kube.patches += 1
            return True

        async def set_labels(self, name: str, labels: Any) -> None:
            node = kube.nodes.setdefault(name, _PoolNode(dict(NODESET), inventory=True))
            self._label(node, labels)
            kube.patches += 1

        @staticmethod
        def _label(n: _PoolNode, labels: Any) -> None:
            for key, value in labels.items():
                if value is None:
                    n.labels.pop(key, None)
                else:
                    n.labels[key] = value

        async def pool_command(self, name: str, argv: Any, *, incident_id: str, limit: float) -> str:
            """The site's join script registers the node with Slurm (here: the NodeSet's label, as
            its slurmd starting there would), its leave script takes it out again."""
            kube.commands.append((name, list(argv)))
            if argv[0].endswith("join"):
                self._label(kube.nodes[name], NODESET)
                return f"slurm node {name} registered\n"
            self._label(kube.nodes[name], dict.fromkeys(NODESET))
            return f"slurm node {name} gone\n"

        async def pods_on_node(self, name: str) -> list[PodRef]:
            if name not in kube.nodes:
                return await super().pods_on_node(name)
            return [PodRef("inference", pod, owner_kind="ReplicaSet") for pod in kube.nodes[name].pods]

        async def evict(self, pod: PodRef) -> None:
            owner = next((n for n, node in kube.nodes.items() if pod.name in node.pods), None)
            if owner is None:
                return await super().evict(pod)
            if kube.budget_refusals > 0:
                kube.budget_refusals -= 1
                raise TransientError(
                    f"eviction of pod {pod.ref} refused by its PodDisruptionBudget", reason=Reason.PDB
                )
            kube.nodes[owner].pods.remove(pod.name)
            kube.evicted.append(pod.ref)

    return LendingCluster


def world(spares: int = 2, lenders: int = 0) -> tuple[Fleet, NodeSetSlurm]:
    """A two-node gang job on gpu-node-01/02 (NodeSet members), ``spares`` spare and ``lenders`` inference nodes."""
    kube = Fleet({})
    for n in range(spares):
        kube.nodes[f"gpu-spare-0{n + 1}"] = _PoolNode(dict(SPARE))
    for n in range(lenders):
        kube.nodes[f"gpu-infer-0{n + 1}"] = _PoolNode(dict(INFERENCE), pods=[f"vllm-{n}-a", f"vllm-{n}-b"])
    slurm = NodeSetSlurm(kube, dict.fromkeys(["gpu-node-01", "gpu-node-02", *kube.nodes], "IDLE"))
    slurm.jobs["100"] = _Job("100", 2, ("gpu-node-01", "gpu-node-02"))
    return kube, slurm


def harness(
    tmp_path: Path,
    kube: Fleet,
    slurm: NodeSetSlurm,
    pools: list[dict[str, Any]],
    engine: dict[str, Any] | None = None,
    **kw: Any,
) -> EngineHarness:
    """``engine``: more of ``EngineHarness``'s arguments; ``kw``: more ``capacity`` settings."""
    inventory = fleet(("gpu-node-01", "gpu-node-02"))
    capacity = {"pools": pools, **kw}
    return EngineHarness(
        tmp_path,
        inventory=inventory,
        slurm=slurm,
        capacity=capacity,
        cluster=lending_cluster(kube),
        **(engine or {}),
    )


def clean(kube: Fleet) -> None:
    """No node left cordoned or carrying a lending mark."""
    for name, node in kube.nodes.items():
        assert LENT_ANNOTATION not in node.annotations, name
        assert not node.unschedulable, name


async def test_a_spare_by_selector_joins_the_partition_and_the_repaired_node_refills_the_pool(
    tmp_path: Path,
) -> None:
    kube, slurm = world()
    async with harness(tmp_path, kube, slurm, [SPARES]) as h:
        h.cluster.script("successor", Slow(600))  # a replacement that takes ten minutes
        incident = await h.alert("gpu-node-01")
        running = await h.until_event(incident, "job_running")
        assert running.data["seconds"] < 60
        assert slurm.jobs["100"].nodes == ("gpu-node-02", "gpu-spare-01")
        assert kube.members(SPARE) == ["gpu-spare-02"]
        assert h.sample("pitcrew_capacity_lent_nodes", pool="spares") == 1
        done = await h.until_ended(incident)
        assert done.state.value == "resolved", await h.timeline(incident)
        assert kube.members(SPARE) == [
            "gpu-node-01",
            "gpu-spare-02",
        ]  # the repaired node took the spare's place
        assert "slinky.slurm.net/nodeset" not in kube.nodes["gpu-node-01"].labels
        assert kube.nodes["gpu-spare-01"].labels == NODESET  # the lent node stays with the jobs
        clean(kube)
        assert set(slurm.whereabouts().values()) == {1}
        actions = [e.data["action"] for e in await h.events(incident, "action")]
        assert actions.count("capacity_take") == 1 and actions.count("capacity_give_back") == 1
        assert h.sample("pitcrew_capacity_lent_nodes", pool="spares") == 0
        await h.time.advance(60)  # capacity.read_every: the pools read again, whole
        assert h.sample("pitcrew_capacity_idle_nodes", pool="spares") == 2
        # gpu-spare-02's 8 GPUs: the simulated fleet's gpu-node-01 reports no GPU count.
        assert h.sample("pitcrew_capacity_idle_gpus", pool="spares") == 8
        # The two-node job's 16 GPUs ran on the spare for the ten minutes the replacement took.
        saved = h.sample("pitcrew_capacity_job_gpu_hours_saved_total", pool="spares")
        assert saved == pytest.approx(16 * 600 / 3600, rel=0.01)
        [notice] = h.notices("capacity", incident)
        assert "gpu-spare-01" in notice["title"]


async def test_a_lender_is_evicted_through_its_budget_and_the_inference_pool_is_whole_again(
    tmp_path: Path,
) -> None:
    kube, slurm = world(spares=0, lenders=2)
    kube.budget_refusals = 3
    async with harness(tmp_path, kube, slurm, [LENDERS]) as h:
        h.cluster.script("successor", Slow(600))
        incident = await h.alert("gpu-node-01")
        await h.until_event(incident, "job_running")
        assert slurm.jobs["100"].nodes == ("gpu-infer-01", "gpu-node-02")
        assert sorted(kube.evicted) == ["inference/vllm-0-a", "inference/vllm-0-b"]
        steps = await h.steps(incident)
        assert steps["capacity"].result["evicted_at"] is not None
        done = await h.until_ended(incident)
        assert done.state.value == "resolved"
        assert kube.members({"pitcrew.dev/pool": "inference"}) == ["gpu-infer-02", "gpu-node-01"]
        assert kube.nodes["gpu-node-01"].labels == INFERENCE  # inference pods can schedule there now
        clean(kube)
        assert set(slurm.whereabouts().values()) == {1}


async def test_return_gives_the_lent_node_back_to_inference_once_the_job_left_it(tmp_path: Path) -> None:
    kube, slurm = world(spares=0, lenders=2)
    async with harness(tmp_path, kube, slurm, [LENDERS], give_back="return") as h:
        h.cluster.script("successor", Slow(600))
        incident = await h.alert("gpu-node-01")
        await h.until_event(incident, "job_running")
        assert slurm.jobs["100"].nodes == ("gpu-infer-01", "gpu-node-02")
        waiting = await h.until_event(incident, "step_waiting")
        await h.run_until(lambda: _waits_for_the_job(h, incident))
        assert kube.members({"pitcrew.dev/pool": "inference"}) == ["gpu-infer-02"]  # still lent
        slurm.jobs["100"].state = "COMPLETED"  # the job ends: nothing runs on the lent node any more
        done = await h.until_ended(incident)
        assert done.state.value == "resolved", await h.timeline(incident)
        assert kube.members({"pitcrew.dev/pool": "inference"}) == ["gpu-infer-01", "gpu-infer-02"]
        assert kube.nodes["gpu-infer-01"].labels == INFERENCE  # its inference pods can schedule again
        clean(kube)
        assert "gpu-node-01" not in kube.nodes  # the repaired node joined no pool: it trains
        assert (await slurm.node("gpu-node-01")).states == {"IDLE"}
        give_back = (await h.steps(incident))["give_back"].result
        assert give_back["node"] == "gpu-infer-01" and not give_back.get("refilled_instead")
        assert waiting is not None


async def _waits_for_the_job(h: EngineHarness, incident: str) -> bool:
    return any("still runs a job" in e.detail for e in await h.events(incident, "step_waiting", "give_back"))


async def test_return_refills_with_the_repaired_node_when_the_job_stays_past_return_wait(
    tmp_path: Path,
) -> None:
    kube, slurm = world(spares=0, lenders=2)
    async with harness(tmp_path, kube, slurm, [LENDERS], give_back="return", return_wait="5m") as h:
        h.cluster.script("successor", Slow(600))
        incident = await h.alert("gpu-node-01")
        await h.run_until(lambda: _waits_for_the_job(h, incident))
        done = await h.until_ended(incident)  # the job runs on, for days
        assert done.state.value == "resolved", await h.timeline(incident)
        [gave_up] = await h.events(incident, "return_refilled")
        assert "gpu-infer-01 still runs a job after 5m" in gave_up.detail, gave_up.detail
        # The inference pool has its size again, with the repaired node in the lent node's place.
        assert kube.members({"pitcrew.dev/pool": "inference"}) == ["gpu-infer-02", "gpu-node-01"]
        assert kube.nodes["gpu-node-01"].labels == INFERENCE
        assert kube.nodes["gpu-infer-01"].labels == NODESET  # stays with the job, unmarked
        clean(kube)
        assert slurm.jobs["100"].state == "RUNNING" and "gpu-infer-01" in slurm.jobs["100"].nodes
        give_back = (await h.steps(incident))["give_back"].result
        assert give_back["node"] == "gpu-node-01" and give_back["refilled_instead"] is True
        assert set(slurm.whereabouts().values()) == {1}


#: A spare pool joined by the site's own script instead of the NodeSet's labels.
BY_COMMAND = {
    "name": "spares",
    "kind": "spare",
    "selector": "pitcrew.dev/pool=spare",
    "join_command": ["/opt/site/slurm-join", "{node}", "--for={incident}", "--pool={pool}"],
    "leave_command": ["/opt/site/slurm-leave", "{node}"],
}


async def test_a_pool_command_joins_the_node_instead_of_the_labels(tmp_path: Path) -> None:
    kube, slurm = world()
    async with harness(tmp_path, kube, slurm, [BY_COMMAND], give_back="return") as h:
        h.cluster.script("successor", Slow(600))
        incident = await h.alert("gpu-node-01")
        await h.until_event(incident, "job_running")
        assert slurm.jobs["100"].nodes == ("gpu-node-02", "gpu-spare-01")
        assert kube.commands == [
            ("gpu-spare-01", ["/opt/site/slurm-join", "gpu-spare-01", f"--for={incident}", "--pool=spares"])
        ]
        [joined] = [
            e for e in await h.events(incident, "action") if e.data["action"] == "capacity_join_command"
        ]
        assert (
            joined.detail == "gpu-spare-01 joined by /opt/site/slurm-join: slurm node gpu-spare-01 registered"
        )
        assert joined.data["output"] == "slurm node gpu-spare-01 registered\n"
        assert h.sample("pitcrew_actions_total", action="capacity_join_command") == 1
        await h.run_until(lambda: _waits_for_the_job(h, incident))
        slurm.jobs["100"].state = "COMPLETED"
        done = await h.until_ended(incident)
        assert done.state.value == "resolved", await h.timeline(incident)
        # Given back: the leave script ran on it (owned: still lent to this incident), then the labels.
        assert kube.commands[1:] == [("gpu-spare-01", ["/opt/site/slurm-leave", "gpu-spare-01"])]
        assert kube.members(SPARE) == ["gpu-spare-01", "gpu-spare-02"]
        assert kube.nodes["gpu-spare-01"].labels == SPARE
        clean(kube)
        actions = [e.data["action"] for e in await h.events(incident, "action")]
        assert actions.count("capacity_leave_command") == 1


async def test_a_rollback_runs_the_pool_leave_command_before_the_node_goes_back(tmp_path: Path) -> None:
    kube, slurm = world()
    slurm.states["gpu-node-02"] = "DOWN"  # the job cannot start on the spare alone
    async with harness(tmp_path, kube, slurm, [BY_COMMAND]) as h:
        h.cluster.always("successor", Slow(600))
        incident = await h.alert("gpu-node-01")
        await h.run_until(lambda: len(kube.commands) == 1)
        await h.until_event(incident, "step_waiting")
        answer = await h.commands.rollback(incident, "alice")
        assert answer.ok, answer
        assert (
            "capacity: gpu-spare-01 left the partition: slurm node gpu-spare-01 gone; back in pool spares"
            in answer.data["report"]  # type: ignore[index]
        ), answer
        assert kube.commands[1:] == [("gpu-spare-01", ["/opt/site/slurm-leave", "gpu-spare-01"])]
        assert kube.nodes["gpu-spare-01"].labels == SPARE
        clean(kube)


async def test_a_budget_held_past_the_grace_hands_the_node_back_untouched(tmp_path: Path) -> None:
    kube, slurm = world(spares=0, lenders=1)
    kube.budget_refusals = 10_000
    async with harness(tmp_path, kube, slurm, [LENDERS]) as h:
        h.cluster.script("successor", Slow(1200))
        incident = await h.alert("gpu-node-01")
        said = await h.until_event(incident, "action")
        # Out of its pool while the take waits for the budget (a take under way counts), then back.
        await h.run_until(lambda: h.sample("pitcrew_capacity_lent_nodes", pool="inference") == 1)

        async def handed_back() -> bool:
            return any(e.data["action"] == "capacity_return" for e in await h.events(incident, "action"))

        await h.run_until(handed_back)
        assert h.sample("pitcrew_capacity_lent_nodes", pool="inference") == 0
        done = await h.until_ended(incident)
        assert done.state.value == "resolved"
        actions = [e.data["action"] for e in await h.events(incident, "action")]
        assert "capacity_return" in actions, actions
        assert kube.nodes["gpu-infer-01"].labels == INFERENCE and kube.nodes["gpu-infer-01"].pods
        clean(kube)
        assert "gpu-node-01" in slurm.jobs["100"].nodes  # it waited for its own node
        assert said is not None


async def test_min_idle_with_no_lender_takes_nothing_and_says_why(tmp_path: Path) -> None:
    kube, slurm = world(spares=1)
    async with harness(tmp_path, kube, slurm, [{**SPARES, "min_idle": 1}]) as h:
        incident = await h.alert("gpu-node-01")
        await h.until_ended(incident)
        steps = await h.steps(incident)
        assert "min_idle" in str(steps["capacity"].result["waiting"])
        [notice] = h.notices("capacity", incident)  # said once, in the incident's thread
        assert "no node to lend" in notice["title"] and "min_idle" in notice["lines"][0]
        assert kube.members(SPARE) == ["gpu-spare-01"] and kube.patches == 0


BOUNDARIES = [
    ("lend", ThenStop()),
    ("lend", Slow(3600)),
    ("keep_lent", ThenStop()),
    ("keep_lent", Slow(3600)),
    ("set_labels", ThenStop()),
    ("set_labels", Slow(3600)),
]


@pytest.mark.parametrize(
    ("method", "effect"),
    BOUNDARIES,
    ids=[f"{m}-{'after' if isinstance(e, ThenStop) else 'before'}" for m, e in BOUNDARIES],
)
async def test_a_crash_at_every_boundary_leaves_each_node_in_one_place(
    tmp_path: Path, method: str, effect: Any
) -> None:
    kube, slurm = world()
    async with harness(tmp_path, kube, slurm, [SPARES]) as h:
        h.cluster.script(method, effect)
        incident = await h.alert("gpu-node-01")
        await h.run_until(lambda: h.cluster.calls[method] == 1)
        await h.restart()
        done = await h.until_ended(incident)
        assert done.state.value == "resolved"
        assert kube.members(SPARE) == ["gpu-node-01", "gpu-spare-02"]
        assert slurm.jobs["100"].nodes == ("gpu-node-02", "gpu-spare-01")
        clean(kube)
        assert set(slurm.whereabouts().values()) == {1}
        actions = [e.data["action"] for e in await h.events(incident, "action")]
        assert actions.count("capacity_give_back") == 1
        assert h.sample("pitcrew_capacity_lent_nodes", pool="spares") == 0


async def test_rollback_before_the_job_started_restores_the_node(tmp_path: Path) -> None:
    kube, slurm = world()
    slurm.states["gpu-node-02"] = "DOWN"  # the job cannot start on the spare alone
    async with harness(tmp_path, kube, slurm, [SPARES]) as h:
        h.cluster.always("successor", Slow(600))
        incident = await h.alert("gpu-node-01")
        await h.run_until(lambda: NODESET.items() <= kube.nodes["gpu-spare-01"].labels.items())
        assert h.sample("pitcrew_capacity_lent_nodes", pool="spares") == 1
        answer = await h.commands.rollback(incident, "alice")
        assert answer.ok and "gpu-spare-01 back in pool spares" in str(answer.data), answer
        assert h.sample("pitcrew_capacity_lent_nodes", pool="spares") == 0
        assert kube.nodes["gpu-spare-01"].labels == SPARE
        clean(kube)


async def test_a_rollback_while_the_job_runs_on_the_lent_node_keeps_it_until_asked_again(
    tmp_path: Path,
) -> None:
    kube, slurm = world()
    async with harness(tmp_path, kube, slurm, [SPARES]) as h:
        h.cluster.always("successor", Slow(600))
        incident = await h.alert("gpu-node-01")
        await h.until_event(incident, "job_running")
        assert "gpu-spare-01" in slurm.jobs["100"].nodes
        first = await h.commands.rollback(incident, "alice")
        kept = "capacity: gpu-spare-01 left with the jobs: job 100 runs there"
        assert first.ok and first.data is not None and kept in first.data["report"], first
        assert NODESET.items() <= kube.nodes["gpu-spare-01"].labels.items()  # still lent, the job on it
        assert (await h.steps(incident))["capacity"].status == "ok"
        slurm.jobs["100"].state = "COMPLETED"
        back = await h.commands.rollback(incident, "alice")
        assert back.ok and back.data == {"report": ["capacity: gpu-spare-01 back in pool spares"]}, back
        assert kube.nodes["gpu-spare-01"].labels == SPARE
        clean(kube)
        assert (await h.steps(incident))["capacity"].status == "undone"


async def test_a_pause_set_while_the_take_looks_at_the_pool_holds_the_lend(tmp_path: Path) -> None:
    """Taking a node is a change like any other: a pause set while the step reads the pool holds
    the lend itself (nothing marked, cordoned or evicted), and after resume the take goes on once."""
    kube, slurm = world(spares=0, lenders=1)
    async with harness(tmp_path, kube, slurm, [LENDERS]) as h:
        h.cluster.script("pool_nodes", Slow(20))
        incident = await h.alert("gpu-node-01")
        await h.run_until(lambda: h.cluster.calls["pool_nodes"] > 0)
        await h.commands.pause("oncall", "maintenance")
        held = await h.until_event(incident, "held")
        assert held.step == "capacity" and "lend held until resume" in held.detail, held
        assert kube.evicted == [] and kube.patches == 0
        clean(kube)
        await h.commands.resume("oncall")
        await h.until_event(incident, "job_running")
        assert sorted(kube.evicted) == ["inference/vllm-0-a", "inference/vllm-0-b"]
        done = await h.until_ended(incident)
        assert done.state.value == "resolved", await h.timeline(incident)
        clean(kube)


async def test_a_crash_after_the_node_joined_and_before_the_notice_tells_it_once(tmp_path: Path) -> None:
    """pitcrew dies right after it recorded that the lent node joined the partition: the notice
    is told after the restart, once (before, the restarted step found the join and ended silent)."""
    kube, slurm = world()
    dies = DiesAfter(("step_progress", lambda a: bool(a[2].get("joined_at"))))

    engine = {"outbox": ["slack"], "store": dies.wrap}
    async with harness(tmp_path, kube, slurm, [SPARES], engine=engine) as h:
        incident = await h.alert("gpu-node-01")
        await h.run_until(lambda: dies.cut, about=incident)
        await h.restart()
        done = await h.until_ended(incident)
        assert done.state.value == "resolved", await h.timeline(incident)
        await h.told_once(incident, "capacity")
        [notice] = h.notices("capacity", incident)
        assert "gpu-spare-01" in notice["title"] and "joined the job's partition" in notice["lines"][1]
        clean(kube)
