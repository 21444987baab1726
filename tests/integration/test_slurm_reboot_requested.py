"""A busy node waiting for a site's own ``scontrol reboot`` is in service, on every backend.

``scontrol reboot NODE`` (no ASAP) leaves a busy node to its jobs and reboots it once idle
(scontrol.shtml): slurmctld flags it REBOOT_REQUESTED and, when the request gives no reason, sets
the reason "reboot requested" (``proc_req.c`` ``_slurm_rpc_reboot_nodes``), with no DOWN and no
DRAIN. 22.05's slurmrestd (v0.0.38) shows a busy node DOWN only as "mixed"/"allocated", so
``RestScheduler.nodes`` reads a reason on a busy node as DOWN; a reboot request's reason is no
such DOWN. Read as one, the Slurm watch opened an incident (follow-slurm: cordon, wait for the
jobs to resume) and the breaker counted the node out, for the site's own planned reboot, while the
scontrol backend read it in service.

Cases, on the real cluster (``RebootProgram=/bin/true``, which ``scontrol reboot`` requires), for
both backends: a job on the last node, ``scontrol reboot`` of that node (cancelled after): the node and the node list read it busy, in service, no outage. Failed
before on 22.05 with REST: the list read it DOWN, an outage by an administrator.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import pytest

from bot.domain.jobs import SlurmNodeState
from bot.domain.outages import slurm_outage
from bot.domain.slurm_watch import out_by_others
from proving_ground.proc import eventually, wait_until
from proving_ground.slurm import SlurmCluster
from tests.harness.slurm import BACKENDS, Sched, backend

pytestmark = pytest.mark.slow


@pytest.fixture
def reboot_requested(slurm: SlurmCluster) -> Iterator[str]:
    """A job on the last node and a reboot requested for it; yields the node."""
    node = slurm.nodes[-1]
    before = slurm.conf.read_text()
    slurm.conf.write_text(before + "RebootProgram=/bin/true\n")  # scontrol reboot refuses without one
    slurm.run("scontrol", "reconfigure")
    try:
        slurm.submit(f"--nodelist={node}", "--wrap=sleep 120")
        wait_until(lambda: slurm.node(node).busy, timeout=20, what=f"a job on {node}")
        slurm.run("scontrol", "reboot", node)
        yield node
    finally:
        slurm.run("scontrol", "cancel_reboot", node, check=False)
        slurm.run("scancel", "--full", "--user=root", check=False)
        slurm.conf.write_text(before)
        slurm.run("scontrol", "reconfigure")


@pytest.fixture(params=BACKENDS)
async def scheduler(
    request: pytest.FixtureRequest, slurm: SlurmCluster, reboot_requested: str
) -> AsyncIterator[Sched]:
    async with backend(slurm, request.param) as sched:
        yield sched


async def test_a_busy_node_waiting_for_a_reboot_is_in_service(
    slurm: SlurmCluster, scheduler: Sched, reboot_requested: str
) -> None:
    node = reboot_requested
    one = await scheduler.node(node)
    assert {"REBOOT_REQUESTED"} <= one.states and one.reason, one  # Slurm's shape
    assert one.busy and one.in_service and not one.taken_out, one.states

    async def listed() -> SlurmNodeState | None:
        return next((n for n in await scheduler.nodes() if n.name == node), None)

    found = await eventually(listed, timeout=10, what=f"{node} listed")
    assert found.busy and found.in_service and not found.taken_out, (found.states, found.reason)
    assert slurm_outage(node, found.states, found.reason, found.reason_user) is None
    assert not out_by_others(found)
