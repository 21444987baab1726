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
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from bot.domain.ownership import owns_slurm_reason, slurm_reason
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
