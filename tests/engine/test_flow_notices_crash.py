"""The flow's own notices survive a crash: an escalation, an expired approval, a guard's refusal, a
rollback, the breaker opening.

These notices are told by the flow, not inside a step's run, about a change that ends the incident.
Each case lets one write of the way to the end commit and then never answer (pitcrew dies there,
as SIGKILL would leave it), restarts pitcrew on the same store and lets it finish. At every such
boundary the notice is in the timeline once, in the outbox once and in the log once, the incident
ends as it would have, and no far side was asked anything twice.

Told after the incident's end commits (as before), a crash between the two lost the notice: the
restarted pitcrew found the incident ended and had nothing more to do, so humans never heard that
pitcrew gave up, or what a rollback undid. Told first and once per run of the step it is about, the
restarted pitcrew comes back to the same place, finds the notice told, and ends the incident.
A step that failed is not run again after the restart either: the far side that refused it is
not asked again.

Boundaries, in the order the writes commit: the cause (the step failed, the approval expired, the
rollback undid), the notice, the end. The breaker's notice names no incident (one word for the
whole storm): it is told before the breaker opens, keyed to the incident that trips it, so a crash
right after the telling finds it told when the incident's admission trips the breaker again.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from bot.domain.incident import State
from tests.engine.harness import DiesAfter, EngineHarness, Write, fleet, permanent
from tests.engine.test_flow import CONFIRM_WITHIN_5M, JOB, _job_pending_until_node_returns
from tests.harness.scenarios import fault_delivery, gpu_node

NODE = "gpu-node-02"


def step_ended(step: str, status: str) -> Write:
    return "step_finished", lambda a: a[1] == step and a[2] == status


def told(kind: str) -> Write:
    return "enqueue", lambda a: a[2] == kind


def ended(state: State) -> Write:
    return "transition", lambda a: a[1] is state


async def _drive_to_end(h: EngineHarness) -> str:
    return await h.alert(NODE)


async def _cordoned_then_rolled_back(h: EngineHarness) -> str:
    incident = await h.opens(
        fault_delivery("health-fail", alertname="GpuHealthFail", node=NODE, starts=h.time.now())
    )
    assert (await h.until_ended(incident)).state.value == "resolved"
    # The command's own task: it hangs with the engine's write and is dropped with the process.
    h.command = asyncio.ensure_future(h.commands.rollback(incident, "alice"))  # type: ignore[attr-defined]
    return incident


@dataclass(frozen=True)
class Case:
    kind: str
    state: str
    outcome: str
    boundaries: dict[str, Write]
    drive: Callable[[EngineHarness], Awaitable[str]] = _drive_to_end
    setup: Callable[[EngineHarness], None] = lambda h: None
    harness: dict[str, Any] = field(default_factory=dict)


CASES = {
    "escalation": Case(
        "escalation",
        "failed",
        "cordon failed: cordon cannot succeed",
        {
            "step-failed": step_ended("cordon", "failed"),
            "told": told("escalation"),
            "ended": ended(State.FAILED),
        },
        setup=lambda h: h.cluster.script("cordon", *permanent()),
        harness={"mode": "auto"},
    ),
    "job-track-escalation": Case(
        "escalation",
        "failed",
        "confirm_resumed failed: confirm_resumed did not finish within its budget",
        {
            "step-failed": step_ended("confirm_resumed", "failed"),
            "told": told("escalation"),
            "ended": ended(State.FAILED),
        },
        setup=lambda h: _job_pending_until_node_returns(h, ever=False),
        harness={"mode": "auto", "inventory": fleet(jobs=(JOB,)), **CONFIRM_WITHIN_5M},
    ),
    "approval-expired": Case(
        "approval_expired",
        "suppressed",
        "approval timed out: nothing was done",
        {
            "decided": ("decide_approval", lambda a: a[1] == "expired"),
            "told": told("approval_expired"),
            "ended": ended(State.SUPPRESSED),
        },
        harness={"mode": "approve"},
    ),
    "suppressed": Case(
        "suppressed",
        "suppressed",
        "node gpu-node-02 carries pitcrew.dev/opt-out=true",
        {"told": told("suppressed"), "ended": ended(State.SUPPRESSED)},
        harness={
            "mode": "auto",
            "inventory": fleet(
                ("gpu-node-01",), extra={NODE: gpu_node(labels={"pitcrew.dev/opt-out": "true"})}
            ),
        },
    ),
    "rollback": Case(
        "rollback",
        "rolled_back",
        "rolled back by alice",
        {
            "undone": step_ended("rollback", "ok"),
            "told": told("rollback"),
            "ended": ended(State.ROLLED_BACK),
        },
        drive=_cordoned_then_rolled_back,
        harness={"mode": "auto"},
    ),
}
PARAMS = [
    pytest.param(case, boundary, id=f"{name}-{boundary}")
    for name, case in CASES.items()
    for boundary in case.boundaries
]


@pytest.mark.parametrize(("case", "boundary"), PARAMS)
async def test_a_crash_on_the_way_to_the_end_tells_humans_once(
    case: Case, boundary: str, tmp_path: Path
) -> None:
    dies = DiesAfter(case.boundaries[boundary])

    harness = EngineHarness(tmp_path, outbox=["slack"], store=dies.wrap, **case.harness)
    async with harness as h:
        case.setup(h)
        incident = await case.drive(h)
        await h.run_until(lambda: dies.cut, about=incident)
        await h.restart()  # pitcrew dies right after that write committed
        command = getattr(h, "command", None)
        if command is not None:
            command.cancel()  # the process that ran it is gone
        done = await h.until_ended(incident)
        if case.kind == "rollback":  # its run ended with the incident; the rest of the rollback
            await h.time.advance(60)  # is the restarted worker's (it finds the request in the store)
            done = await h.incident(incident)
        assert (done.state.value, done.outcome.startswith(case.outcome)) == (case.state, True), done.outcome
        await h.told_once(incident, case.kind)
        assert not [call for call, n in h.calls().items() if n > 1], h.calls()


OUT_BY_OTHERS = fleet(
    ("gpu-node-04",),
    extra={
        "gpu-node-01": gpu_node(slurm_state="DRAIN", slurm_reason="admin: bios update"),
        NODE: gpu_node(slurm_state="DRAIN", slurm_reason="admin: bios update"),
        "gpu-node-03": gpu_node(slurm_state="DRAIN", slurm_reason="NHC: check_gpu failed"),
    },
)


@pytest.mark.parametrize(
    "write",
    [told("breaker"), ("set_switch", lambda a: a[0] == "breaker")],
    ids=["told", "opened"],
)
async def test_a_crash_as_the_breaker_opens_tells_it_once(write: Write, tmp_path: Path) -> None:
    """The breaker's notice is the storm's one word (the incidents it stops stay quiet): it is told
    before the breaker opens. A crash right after it opened finds it told; a crash right after it
    was told trips the breaker again on the incident's next admission, which finds it told too."""
    dies = DiesAfter(write)

    harness = EngineHarness(
        tmp_path, inventory=OUT_BY_OTHERS, breaker={"max_nodes": 3}, outbox=["slack"], store=dies.wrap
    )
    async with harness as h:
        incident = await h.alert("gpu-node-04")
        await h.run_until(lambda: dies.cut, about=incident)
        await h.restart()
        done = await h.until_ended(incident)
        assert done.state.value == "suppressed" and not h.calls()
        assert (await h.commands.status())["breaker"]["open"]
        assert len(h.notices("breaker")) == 1, await h.timeline(incident)
        outbox = [i for i in await h.store.outbox_pending("slack") if i.kind == "breaker"]
        assert len(outbox) == 1, await h.timeline(incident)
