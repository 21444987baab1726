"""A ``State=CLOUD`` node pitcrew took out stays readable once power saving powered it down.

22.05's slurmctld leaves a powered-down CLOUD node out of every full node list unless
``PrivateData=cloud`` (``node_mgr.c`` ``_is_cloud_hidden`` in ``pack_all_node``), and ``scontrol show
node NAME`` reads the full list (``scontrol_load_nodes``): "Node gpu-003 not found". A single-node
read is not hidden (``pack_one_node``): slurmrestd's ``/node/{name}`` and ``sinfo -n NAME``
(``slurm_load_node_single``). Power saving suspends a DOWN node too (``power_save.c``
``_do_power_work``), so each node pitcrew took out of a cloud cluster vanished from the scontrol
backend's reads after ``SuspendTime``: its return to service (``slurm_resume``), a rollback's undo
and the wait for someone else's node failed as if the node had left Slurm.

Cases, on the real cluster with its last node ``State=CLOUD`` and power saving on for it
(``cloud_node`` in ``tests.harness.slurm``; put back after), for both backends: pitcrew's DOWN; the node powered
down; pitcrew reads it, still DOWN+DRAIN with its reason, and its RESUME returns it to service.
Failed before on 22.05 with scontrol: ``UNKNOWN_NODE``.

The breaker's fleet (``bot.engine.fleet``) reads the list (``Scheduler.nodes``), so it must not lose
such a node either: someone else's DOWN of the cloud node, powered down, counts in its snapshot of
nodes out of service, by an administrator, on both backends (24.11 lists the node itself: SchedMD's
"Change cloud nodes to show by default", 23.02). Failed before on 22.05 with both backends: the
snapshot counted no node out. The Slurm watch reads the same list, and finds the outage someone
else's (``out_by_others``).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta

import pytest

from bot.domain.outages import Outage, Taker
from bot.domain.ownership import owns_slurm_reason, slurm_reason
from bot.domain.slurm_watch import out_by_others
from bot.engine.context import Ports
from bot.engine.fleet import FleetView
from bot.integrations.journal import LogNotifier
from proving_ground.proc import eventually
from proving_ground.slurm import SlurmCluster
from tests.harness.slurm import BACKENDS, Sched, backend, powered_down

pytestmark = pytest.mark.slow


@pytest.fixture(params=BACKENDS)
async def scheduler(
    request: pytest.FixtureRequest, slurm: SlurmCluster, cloud_node: str
) -> AsyncIterator[Sched]:
    async with backend(slurm, request.param) as sched:
        yield sched


async def test_pitcrews_cloud_node_powered_down_is_read_and_resumed(
    slurm: SlurmCluster, scheduler: Sched, cloud_node: str
) -> None:
    node = cloud_node
    await scheduler.down(node, slurm_reason("pc-00042", "XID 79 gpu3"))

    async def asleep() -> bool:
        return powered_down(slurm, node)

    await eventually(asleep, timeout=60, what=f"{node} powered down")
    out = await scheduler.node(node)
    assert {"DOWN", "DRAIN", "CLOUD", "POWERED_DOWN"} <= out.states, out.states
    assert owns_slurm_reason(out.reason, "pc-00042"), out.reason

    await scheduler.resume(node)
    back = await scheduler.node(node)
    assert not back.taken_out and back.in_service, back.states


async def test_someone_elses_cloud_node_powered_down_counts_in_the_breakers_fleet(
    slurm: SlurmCluster, scheduler: Sched, cloud_node: str
) -> None:
    node = cloud_node
    slurm.run("scontrol", "update", f"NodeName={node}", "State=DOWN", "Reason=admin: psu swap")

    async def asleep() -> bool:
        return powered_down(slurm, node)

    await eventually(asleep, timeout=60, what=f"{node} powered down")
    fleet = FleetView(
        Ports(scheduler=scheduler, cluster=None, notifier=LogNotifier()),
        lambda: datetime.now(UTC),
        timedelta(seconds=5),
    )
    out = (await fleet.snapshot()).out_of_service
    assert out.unread is None, out.unread
    assert out.outages == (Outage(node, Taker.ADMIN, "admin: psu swap"),), out.outages
    # The Slurm watch reads the same list: the outage is someone else's, for it to file.
    listed = {n.name: n for n in await scheduler.nodes()}
    assert out_by_others(listed[node]), listed[node]
