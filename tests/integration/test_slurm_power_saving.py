"""Power saving: a node Slurm powered down, or is powering up, is in service while Slurm does not hear it.

GPU clouds run Slurm with power saving (``SuspendProgram``/``ResumeProgram``, ``SuspendTime``;
power_save.shtml). slurmctld pings no node that is powered down or powering up or down
(``ping_nodes.c`` ``ping_nodes``), sets ``NOT_RESPONDING`` itself when it wakes one for a job
(``power_save.c`` ``_do_power_work``: ``POWERING_UP`` with ``NOT_RESPONDING`` until its slurmd
registers) and when it RESUMEs a DOWN one (``node_mgr.c`` ``update_node`` → ``_require_node_reg``),
a flag no ping clears while the node sleeps; and schedules such a node all the same
(``make_node_avail`` for a ``POWERED_DOWN`` node "not responding"). A DOWN (or DRAIN) node is
suspended too (``_do_power_work``; 24.11 ``_node_state_suspendable``, unless ``SuspendExcStates``).

Cases, on the real cluster with power saving switched on for its last node (``power_saving`` in
``tests.harness.slurm``: ``SuspendProgram`` and ``ResumeProgram`` that exit 0, ``SuspendTime=2``,
the others in ``SuspendExcNodes``; slurm.conf put back after), for both backends:
* a node someone else set DOWN is powered down while out, and still out with its reason;
  their RESUME leaves it ``IDLE+POWERED_DOWN+NOT_RESPONDING``: in service for pitcrew (its
  ``slurm_returned`` waits for that) and no outage for the breaker; Slurm gives it the next job
  (the job given the node while it sleeps, then ``POWERING_UP``), still in service and no outage
  while it wakes. Failed before: pitcrew read the
  resumed node, and the booting one, as out of service and as an outage by a health check.
* pitcrew's own DOWN is powered down too and stays pitcrew's (DOWN+DRAIN, its reason);
  pitcrew's RESUME returns it to service.
* under ``SlurmctldParameters=idle_on_node_suspend`` Slurm hands pitcrew's node back as it
  suspends it: read by either backend, it is in service and no longer held out by the incident
  (what ``wait_ready`` tells humans about, ``tests/engine/test_returned_before_the_repair.py``).
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from bot.domain.outages import slurm_outage
from bot.domain.ownership import owns_slurm_reason, slurm_reason
from bot.engine.steps.slurm import held_out
from proving_ground.proc import eventually
from proving_ground.slurm import SlurmCluster
from tests.harness.slurm import BACKENDS, Sched, backend

pytestmark = pytest.mark.slow


@pytest.fixture(params=BACKENDS)
async def scheduler(
    request: pytest.FixtureRequest, slurm: SlurmCluster, power_saving: str
) -> AsyncIterator[Sched]:
    async with backend(slurm, request.param) as sched:
        yield sched


async def _powered_down(scheduler: Sched, node: str) -> None:
    async def asleep() -> bool:
        return "POWERED_DOWN" in (await scheduler.node(node)).states

    await eventually(asleep, timeout=60, what=f"{node} powered down")


async def test_a_node_resumed_while_powered_down_is_in_service_and_no_outage(
    slurm: SlurmCluster, scheduler: Sched, power_saving: str
) -> None:
    node = power_saving
    slurm.run("scontrol", "update", f"NodeName={node}", "State=DOWN", "Reason=ops: RMA")
    await _powered_down(scheduler, node)
    out = await scheduler.node(node)
    assert out.taken_out and not out.in_service and out.reason == "ops: RMA", out
    assert slurm_outage(node, out.states, out.reason, out.reason_user) is not None

    slurm.run("scontrol", "update", f"NodeName={node}", "State=RESUME")
    back = await scheduler.node(node)
    assert {"IDLE", "POWERED_DOWN", "NOT_RESPONDING"} <= back.states, back.states  # Slurm's shape
    assert back.in_service, back.states
    assert slurm_outage(node, back.states, back.reason, back.reason_user) is None

    job = slurm.submit("-w", node, "--wrap=sleep 60")  # Slurm's view: in service, it wakes the node

    async def booting() -> bool:
        snapshot = slurm.job(job)
        return snapshot is not None and snapshot.nodes == (node,)

    await eventually(booting, timeout=30, what=f"job {job} given {node}")
    given = await scheduler.node(node)  # allocated, not yet woken: MIXED+NOT_RESPONDING+POWERED_DOWN
    assert given.in_service and given.busy, given.states
    assert slurm_outage(node, given.states, given.reason, given.reason_user) is None

    async def waking() -> bool:
        return "POWERING_UP" in (await scheduler.node(node)).states

    await eventually(waking, timeout=30, what=f"{node} powering up")
    woken = await scheduler.node(node)
    assert "NOT_RESPONDING" in woken.states, woken.states
    assert woken.in_service and woken.busy, woken.states
    assert slurm_outage(node, woken.states, woken.reason, woken.reason_user) is None


async def test_pitcrews_down_is_powered_down_and_stays_pitcrews_until_its_resume(
    slurm: SlurmCluster, scheduler: Sched, power_saving: str
) -> None:
    node = power_saving
    await scheduler.down(node, slurm_reason("pc-00042", "XID 79 gpu3"))
    await _powered_down(scheduler, node)
    out = await scheduler.node(node)
    assert out.down and out.drained and owns_slurm_reason(out.reason, "pc-00042"), out

    await scheduler.resume(node)
    back = await scheduler.node(node)
    assert not back.taken_out and back.in_service, back.states


async def test_idle_on_node_suspend_puts_pitcrews_node_back_in_service(
    slurm: SlurmCluster, idle_on_node_suspend: str
) -> None:
    """Slurm itself hands pitcrew's node back: suspending it, it clears DOWN, DRAIN and the reason
    (``power_save.c``, ``idle_on_node_suspend``). The rule every step waiting on the node looks
    with (``held_out``, in ``put_back_meanwhile``) sees it put back, as it sees a person's RESUME
    (``returned_early``)."""
    node = idle_on_node_suspend
    async with backend(slurm, "scontrol") as scheduler:
        await scheduler.down(node, slurm_reason("pc-00042", "XID 79 gpu3"))
        assert held_out(await scheduler.node(node), "pc-00042")
        await _powered_down(scheduler, node)
        for name in BACKENDS:
            async with backend(slurm, name) as reader:
                back = await reader.node(node)
                assert not held_out(back, "pc-00042") and back.in_service, (name, back)
