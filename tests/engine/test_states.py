"""The incident state machine, as the engine drives it: the states an incident goes through.

Cases (one table row each, by playbook and mode): replace-node, reset-gpu, reboot-node and
cordon-and-ask in auto mode; a hands-off playbook (notify-only) that closes when its alert
resolves; approve mode approved, rejected and expired; observe mode for two playbooks; a
step that fails; a plan a guard stops; a rollback after the end; a replan mid-way. Every
move the engine makes must be one ``bot.domain.incident`` allows, every incident ends in a
terminal state, and the close is counted once under that state and playbook.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from itertools import pairwise
from pathlib import Path
from typing import Any

import pytest

from bot.domain.incident import State, can_move
from tests.engine.harness import EngineHarness, Slow, permanent
from tests.harness.scenarios import delivery, fault_delivery

Driver = Callable[[EngineHarness], Awaitable[str]]

AUTO = ["open", "guarded", "running", "verifying", "resolved"]


def _alert(fixture: str = "xid79-firing.json") -> Driver:
    async def drive(h: EngineHarness) -> str:
        return await h.alert("gpu-node-02", fixture)

    return drive


async def _health_fail(h: EngineHarness) -> str:
    return await h.opens(
        fault_delivery("health-fail", alertname="GpuHealthFail", node="gpu-node-02", starts=h.time.now())
    )


async def _frozen_readings(h: EngineHarness) -> str:
    """One GPU's readings frozen (``DcgmExporterFrozen``): an ``exporter-down`` alert on a GPU."""
    return await h.opens(
        fault_delivery(
            "exporter-down", alertname="DcgmExporterFrozen", node="gpu-node-02", starts=h.time.now()
        )
    )


def _then_resolved(first: Driver) -> Driver:
    async def drive(h: EngineHarness) -> str:
        incident = await first(h)
        await h.until_event(incident, "watching")
        await h.time.advance(300)
        await h.resolve(incident)
        return incident

    return drive


def _decided(verb: str | None) -> Driver:
    async def drive(h: EngineHarness) -> str:
        incident = await h.alert("gpu-node-02")
        await h.until_state(incident, "awaiting_approval")
        if verb is not None:
            result = await h.commands.decide(incident, "alice", approve=verb == "approve")
            assert result.ok, result
        return incident

    return drive


async def _refused(h: EngineHarness) -> str:
    h.cluster.script("cordon", *permanent())
    return await h.alert("gpu-node-02")


async def _paused(h: EngineHarness) -> str:
    await h.commands.pause("oncall")
    return await h.alert("gpu-node-02")


async def _rolled_back(h: EngineHarness) -> str:
    incident = await _health_fail(h)
    await h.until_ended(incident)
    assert (await h.commands.rollback(incident, "alice")).ok
    return incident


async def _replanned(h: EngineHarness) -> str:
    h.cluster.script("evict", Slow(30))
    incident = await h.alert("gpu-node-02", "xid48-then-xid154-1-after-xid48.json")
    await h.run_until(lambda: h.cluster.calls["evict"] > 0)
    await h.deliver(delivery(node="gpu-node-02", starts=h.time.now()))
    return incident


@dataclass(frozen=True)
class Journey:
    drive: Driver
    playbook: str
    states: list[str]
    harness: dict[str, Any] = field(default_factory=dict)
    #: Moves the engine makes that ``bot.domain.incident`` forbids: none.
    illegal: frozenset[tuple[str, str]] = frozenset()
    #: Counted once in pitcrew_incidents_closed_total, under its first terminal state.
    counted: bool = True


JOURNEYS = {
    "replace-node/auto": Journey(_alert(), "replace-node", AUTO),
    "reset-gpu/auto": Journey(_alert("xid48-then-xid154-1-after-xid48.json"), "reset-gpu", AUTO),
    "reboot-node/auto": Journey(
        _alert(), "reboot-node", AUTO, {"catalog": {"79": {"playbook": "reboot-node"}}}
    ),
    "cordon-and-ask/auto": Journey(_health_fail, "cordon-and-ask", AUTO),
    "notify-only/auto": Journey(
        _then_resolved(_alert("exporter-down-firing.json")),
        "notify-only",
        ["open", "guarded", "verifying", "resolved"],
    ),
    "notify-only/frozen-readings": Journey(
        _then_resolved(_frozen_readings), "notify-only", ["open", "guarded", "verifying", "resolved"]
    ),
    "replace-node/approve/approved": Journey(
        _decided("approve"),
        "replace-node",
        ["open", "guarded", "awaiting_approval", "running", "verifying", "resolved"],
        {"mode": "approve"},
    ),
    "replace-node/approve/rejected": Journey(
        _decided("reject"),
        "replace-node",
        ["open", "guarded", "awaiting_approval", "suppressed"],
        {"mode": "approve"},
    ),
    "replace-node/approve/expired": Journey(
        _decided(None),
        "replace-node",
        ["open", "guarded", "awaiting_approval", "suppressed"],
        {"mode": "approve"},
    ),
    "replace-node/observe": Journey(
        _then_resolved(_alert()),
        "replace-node",
        ["open", "guarded", "suppressed"],
        {"mode": "observe"},
    ),
    "cordon-and-ask/observe": Journey(
        _then_resolved(_health_fail),
        "cordon-and-ask",
        ["open", "guarded", "suppressed"],
        {"mode": "observe"},
    ),
    "replace-node/step-fails": Journey(_refused, "replace-node", ["open", "guarded", "running", "failed"]),
    "replace-node/guard-stops": Journey(_paused, "replace-node", ["open", "suppressed"]),
    "cordon-and-ask/rolled-back": Journey(_rolled_back, "cordon-and-ask", [*AUTO, "rolled_back"]),
    "reset-gpu→replace-node/replanned": Journey(_replanned, "replace-node", AUTO),
}


@pytest.mark.parametrize("journey", JOURNEYS.values(), ids=JOURNEYS.keys())
async def test_states_visited(journey: Journey, tmp_path: Path) -> None:
    async with EngineHarness(tmp_path, **journey.harness) as h:
        incident = await journey.drive(h)
        record = await h.until_state(incident, journey.states[-1])
        await h.time.advance(120)  # nothing moves an incident that has ended
        visited = await h.states(incident)
        assert visited == journey.states
        assert (await h.incident(incident)).state is record.state and record.state.terminal
        assert record.playbook == journey.playbook
        assert _illegal(visited) == journey.illegal
        first_end = next(s for s in visited if State(s).terminal)
        closed = h.sample("pitcrew_incidents_closed_total", state=first_end, playbook=journey.playbook)
        assert closed == (1 if journey.counted else 0)


def _illegal(states: list[str]) -> set[tuple[str, str]]:
    return {(a, b) for a, b in pairwise(states) if not can_move(State(a), State(b))}


async def test_observe_mode_moves_only_as_the_state_machine_allows(tmp_path: Path) -> None:
    async with EngineHarness(tmp_path, mode="observe") as h:
        incident = await _then_resolved(_alert())(h)
        await h.until_ended(incident)
        assert not _illegal(await h.states(incident))


async def test_a_suppression_by_a_guard_is_counted_as_closed(tmp_path: Path) -> None:
    async with EngineHarness(tmp_path) as h:
        incident = await _paused(h)
        assert (await h.until_ended(incident)).state is State.SUPPRESSED
        assert h.sample("pitcrew_incidents_closed_total", state="suppressed", playbook="replace-node") == 1
