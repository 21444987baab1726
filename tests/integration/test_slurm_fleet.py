"""The breaker's fleet from a real Slurm: the partitions a node is in, through both backends.

Cases (scontrol and slurmrestd v0.0.38, against the harness cluster gpu-001..003 in partition
gpu):
* a node in one partition: its partition and the partition's node count;
* a node in two partitions (one created at run time, ``scontrol create``): both named, the
  nodes they share counted once; a hidden partition counts too (scontrol ``--all``;
  slurmrestd lists it);
* a node Slurm does not know is in no partition (``None``), not an error;
* admission on a Slurm-only site (no Kubernetes): ``node_facts`` reads the fleet from Slurm
  and the breaker's decision says "fleet of 3 nodes from Slurm partitions gpu"; a second
  node joining one under remediation trips the breaker (share limit 1 node of 3);
* every node in one list (``Scheduler.nodes``, the breaker's snapshot of nodes out of service):
  a node drained by hand is an administrator's, one drained with an ``NHC:`` reason Slurm's
  health check's, an idle one is in service.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime

import pytest

from bot.config import load_catalog, load_playbooks
from bot.domain.faults import classify
from bot.domain.guards import World, evaluate
from bot.domain.labels import Subject
from bot.domain.outages import Taker, slurm_outage
from bot.domain.planner import plan
from bot.domain.policy import Mode, Policy
from bot.engine.admission import node_facts
from bot.engine.context import Ports
from bot.engine.ports import PartitionNodes
from bot.engine.steps import REGISTRY
from bot.integrations.journal import LogNotifier
from bot.integrations.slurm import SlurmSettings, build_scheduler
from proving_ground.slurm import SlurmCluster

pytestmark = pytest.mark.slow
BACKENDS = ["scontrol", "rest"]


@pytest.fixture
def extra_partitions(slurm: SlurmCluster) -> Iterator[SlurmCluster]:
    """Partition debug (gpu-002, gpu-003) and a hidden one (gpu-001), removed afterwards."""
    slurm.run("scontrol", "create", "PartitionName=debug", "Nodes=gpu-002,gpu-003", "State=UP")
    slurm.run("scontrol", "create", "PartitionName=secret", "Nodes=gpu-001", "Hidden=YES", "State=UP")
    try:
        yield slurm
    finally:
        for name in ("debug", "secret"):
            slurm.run("scontrol", "delete", f"PartitionName={name}", check=False)


@pytest.mark.parametrize("backend", BACKENDS)
async def test_partition_nodes(slurm: SlurmCluster, backend: str) -> None:
    sched = build_scheduler(SlurmSettings.model_validate(slurm.settings(backend)))
    try:
        assert await sched.partition_nodes("gpu-002") == PartitionNodes(3, ("gpu",))
        assert await sched.partition_nodes("gpu-999") is None
    finally:
        await sched.aclose()


@pytest.mark.parametrize("backend", BACKENDS)
async def test_partition_nodes_across_partitions(extra_partitions: SlurmCluster, backend: str) -> None:
    sched = build_scheduler(SlurmSettings.model_validate(extra_partitions.settings(backend)))
    try:
        assert await sched.partition_nodes("gpu-003") == PartitionNodes(3, ("gpu", "debug"))
        assert await sched.partition_nodes("gpu-001") == PartitionNodes(3, ("gpu", "secret"))
    finally:
        await sched.aclose()


@pytest.mark.parametrize("backend", BACKENDS)
async def test_slurm_only_admission_reads_the_fleet_from_slurm(slurm: SlurmCluster, backend: str) -> None:
    sched = build_scheduler(SlurmSettings.model_validate(slurm.settings(backend)))
    policy, now = Policy(mode=Mode.AUTO), datetime.now(UTC)
    xid79 = classify(Subject("gpu-002", "3", None, None, 79, "79", None, ""), load_catalog())
    assert xid79 is not None
    acting = plan("gpu-002", [xid79], [], policy, load_playbooks(), now, REGISTRY)
    try:
        facts = await node_facts(Ports(scheduler=sched, cluster=None, notifier=LogNotifier()), "gpu-002")
    finally:
        await sched.aclose()
    fleet = facts.fleet(None)
    assert fleet.words == "fleet of 3 nodes from Slurm partitions gpu"
    alone = evaluate(acting, World(fleet=fleet, node_labels={}), policy, now)
    assert alone.allowed
    second = evaluate(
        acting, World(fleet=fleet, node_labels={}, nodes_in_remediation=frozenset({"gpu-001"})), policy, now
    )
    assert not second.allowed
    assert second.trip_breaker is not None
    assert "fleet of 3 nodes from Slurm partitions gpu" in second.trip_breaker


@pytest.mark.parametrize("backend", BACKENDS)
async def test_nodes_out_of_service_and_who_took_them_out(slurm: SlurmCluster, backend: str) -> None:
    """One list of every node (``Scheduler.nodes``) says which are out and by whom: a drain by hand
    (``admin: bios update``), a simulated health check's (``NHC: …``), one left in service."""
    slurm.run("scontrol", "update", "NodeName=gpu-001", "State=DRAIN", "Reason=admin: bios update")
    slurm.run("scontrol", "update", "NodeName=gpu-002", "State=DRAIN", "Reason=NHC: check_gpu failed")
    sched = build_scheduler(SlurmSettings.model_validate(slurm.settings(backend)))
    try:
        listed = {n.name: n for n in await sched.nodes()}
    finally:
        await sched.aclose()
        slurm.reset()
    assert set(listed) == {"gpu-001", "gpu-002", "gpu-003"}
    found = {
        name: (o.by, o.why) if (o := slurm_outage(n.name, n.states, n.reason, n.reason_user)) else None
        for name, n in listed.items()
    }
    assert found == {
        "gpu-001": (Taker.ADMIN, "admin: bios update"),
        "gpu-002": (Taker.HEALTH_CHECK, "NHC: check_gpu failed"),
        "gpu-003": None,
    }
