"""A node pitcrew took out stays out when its slurmd registers again, whatever ReturnToService says.

``ReturnToService=2`` (common: the setting that spares admins a RESUME after every reboot) returns
a DOWN node to service as soon as its slurmd registers with a valid configuration, "set DOWN for
any reason" (slurm.conf(5); ``node_mgr.c`` ``validate_node_specs``): after the reboot or
replacement pitcrew asked for, before pitcrew validated the node, so the jobs it requeued could
land straight back on the faulty GPU. The DRAIN flag survives that registration (the node's flags
are kept), so pitcrew's DOWN carries DRAIN too, and only pitcrew's RESUME gives the node back.

Cases, on the real cluster switched to ``ReturnToService=2`` (its slurm.conf edited and
``scontrol reconfigure``; put back after), for both backends: a node downed with pitcrew's reason;
its slurmd restarted, as a repair does (it registers again): the node is still out of service,
with pitcrew's reason; pitcrew's RESUME returns it to service. Failed before: the node was IDLE
once its slurmd registered.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import pytest

from bot.domain.ownership import owns_slurm_reason, slurm_reason
from proving_ground.proc import eventually
from proving_ground.slurm import SlurmCluster
from tests.harness.slurm import BACKENDS, Sched, backend

pytestmark = pytest.mark.slow


@pytest.fixture
def return_to_service_2(slurm: SlurmCluster) -> Iterator[None]:
    before = slurm.conf.read_text()
    assert "ReturnToService=1\n" in before
    slurm.conf.write_text(before.replace("ReturnToService=1\n", "ReturnToService=2\n"))
    slurm.run("scontrol", "reconfigure")
    try:
        assert "ReturnToService         = 2" in slurm.run("scontrol", "show", "config").stdout
        yield
    finally:
        slurm.conf.write_text(before)
        slurm.run("scontrol", "reconfigure")


@pytest.fixture(params=BACKENDS)
async def scheduler(
    request: pytest.FixtureRequest, slurm: SlurmCluster, return_to_service_2: None
) -> AsyncIterator[Sched]:
    async with backend(slurm, request.param) as sched:
        yield sched


async def test_a_node_pitcrew_took_out_stays_out_when_its_slurmd_registers_again(
    slurm: SlurmCluster, scheduler: Sched
) -> None:
    node = slurm.nodes[-1]
    reason = slurm_reason("pc-00042", "XID 79 gpu3")
    since = slurm.controller_log.stat().st_size
    await scheduler.down(node, reason)
    # Both updates reached slurmctld. The DOWN shows only until slurmctld's next ping of the live
    # slurmd (every SlurmdTimeout/3): ReturnToService=2 returns a DOWN node to service on any answer
    # (node_mgr.c _node_did_resp, RETURN_TO_SERVICE_ALL), its flags kept, so from then on the node
    # reads IDLE+DRAIN. What holds either way, and keeps it out, is the DRAIN with pitcrew's reason.
    assert [s for n, s in slurm.states_set(since) if n == node] == ["DOWN", "DRAINED"]
    taken = await scheduler.node(node)
    assert taken.drained and owns_slurm_reason(taken.reason, "pc-00042"), taken

    slurm.restart_slurmd(node)  # the reboot or replacement: slurmd registers again
    again = await scheduler.node(node)
    assert again.taken_out and not again.in_service, again.states
    assert owns_slurm_reason(again.reason, "pc-00042"), again.reason

    await scheduler.resume(node)

    async def back() -> bool:
        return (await scheduler.node(node)).in_service

    await eventually(back, timeout=10, what=f"{node} in service")
