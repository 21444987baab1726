"""Commands on one incident, in process: serialised with each other and with the engine's work.

Cases: a rollback of an incident still ``open`` (not yet planned) ends it ``rolled_back``
with nothing to undo, once — no loop re-running it, no stream of notices, and a later fault
on the node opens a new incident that is remediated; ten rollbacks at once, at many moments
of a playbook, bring exactly one undo of each owned change to the far side and nine
conflicts; approve, reject and rollback together on an incident awaiting approval: exactly
one is carried out, the others are conflicts; a rollback while pitcrew is paused is held
(conflict, nothing undone) unless forced, and a forced one is audited; the reject audit
event is spelled ``rejected``; a pause reason above 500 characters is refused (``invalid``) and
pauses nothing, whichever channel sent it.
"""

from __future__ import annotations

import asyncio
import random
from collections import Counter
from pathlib import Path

import pytest

from bot.engine.commands import CommandResult
from tests.engine.harness import EngineHarness, Slow, fleet
from tests.harness.scenarios import delivery, gpu_node

NODE = "gpu-node-01"
INVENTORY = fleet(("gpu-node-02", "gpu-node-03"), extra={NODE: gpu_node("ml-train/a", "ml-train/b")})


async def test_rolling_back_an_open_incident_ends_it_once(tmp_path: Path) -> None:
    async with EngineHarness(tmp_path, inventory=INVENTORY) as h:
        await h.engine.stop()  # nothing plans the incident: it stays open until the rollback
        outcome = await h.deliver(delivery(node=NODE, starts=h.time.now()))
        [incident] = outcome.opened
        assert (await h.incident(incident)).state.value == "open"
        result = await h.commands.rollback(incident, "alice")
        assert result.ok, result
        assert result.data == {"report": []}
        await h.engine.start()
        await h.time.advance(600)  # many engine polls: nothing runs the rollback again
        record = await h.incident(incident)
        assert record.state.value == "rolled_back" and record.outcome == "rolled back by alice"
        assert len(await h.events(incident, "rollback_done")) == 1
        assert len(h.notices("rollback", incident)) == 1
        assert not h.calls()  # nothing was ever done, nothing undone

        later = await h.alert(NODE, starts=h.time.now())  # a new fault is a new incident
        assert later != incident
        assert (await h.until_ended(later)).state.value == "resolved"


@pytest.mark.parametrize("seed", range(8))
async def test_ten_rollbacks_at_once_undo_once(seed: int, tmp_path: Path) -> None:
    """At a random moment of the playbook (after cordon reached the far side), ten at once."""
    rng = random.Random(seed)
    async with EngineHarness(tmp_path, inventory=INVENTORY) as h:
        h.cluster.always("evict", Slow(rng.uniform(5, 20)))  # the drain takes a while
        incident = await h.alert(NODE)
        await h.until_call("cordon", NODE)
        await h.time.advance(rng.uniform(0, 8))  # somewhere in the drain, maybe mid-eviction
        assert (await h.incident(incident)).state.value == "running"
        before = h.calls()
        results = await asyncio.gather(*(h.commands.rollback(incident, f"user{i}") for i in range(10)))
        await h.time.advance(600)
        assert Counter(r.status for r in results) == {"ok": 1, "conflict": 9}, results
        undone = h.calls() - before
        assert undone[("uncordon", NODE)] == 1 and undone[("slurm_resume", NODE)] == 1
        assert all(count == 1 for op, count in undone.items() if op[0] in {"uncordon", "slurm_resume"})
        assert len(h.notices("rollback", incident)) == 1
        assert (await h.incident(incident)).state.value == "rolled_back"


@pytest.mark.parametrize("order", ["approve-first", "reject-first", "rollback-first"])
async def test_approve_reject_and_rollback_together_carry_out_one(order: str, tmp_path: Path) -> None:
    async with EngineHarness(tmp_path, inventory=INVENTORY, mode="approve") as h:
        incident = await h.alert(NODE)
        await h.until_state(incident, "awaiting_approval")
        commands = {
            "approve": lambda: h.commands.approve(incident, "alice"),
            "reject": lambda: h.commands.reject(incident, "alice"),
            "rollback": lambda: h.commands.rollback(incident, "alice"),
        }
        first = order.split("-")[0]
        names = [first, *(n for n in commands if n != first)]
        results: list[CommandResult] = await asyncio.gather(*(commands[n]() for n in names))
        by_name = dict(zip(names, results, strict=True))
        assert [n for n, r in by_name.items() if r.ok] == [first], by_name
        assert all(r.status == "conflict" for n, r in by_name.items() if n != first)
        await h.time.advance(3600)
        end = {"approve": "resolved", "reject": "suppressed", "rollback": "rolled_back"}[first]
        assert (await h.incident(incident)).state.value == end
        if first != "approve":
            assert not h.calls()


async def test_rollback_while_paused_is_held_unless_forced(tmp_path: Path) -> None:
    async with EngineHarness(tmp_path, inventory=INVENTORY) as h:
        h.cluster.always("evict", Slow(30))
        incident = await h.alert(NODE)
        await h.until_call("cordon", NODE)
        assert (await h.commands.pause("ops", "maintenance")).ok
        await h.time.advance(120)  # the drain is held by the pause
        before = h.calls()
        held = await h.commands.rollback(incident, "alice")
        assert held.status == "conflict" and "paused" in held.message
        assert h.calls() == before
        forced = await h.commands.rollback(incident, "alice", force=True)
        assert forced.ok
        undone = h.calls() - before
        assert undone[("uncordon", NODE)] == 1
        [audit] = await h.events(incident, "rollback_forced")
        assert audit.actor == "alice" and "paused" in audit.detail


async def test_the_reject_audit_event_is_spelled_rejected(tmp_path: Path) -> None:
    async with EngineHarness(tmp_path, inventory=INVENTORY, mode="approve") as h:
        incident = await h.alert(NODE)
        await h.until_state(incident, "awaiting_approval")
        assert (await h.commands.reject(incident, "alice")).ok
        [event] = await h.events(incident, "rejected")
        assert event.detail == "replace-node rejected by alice"
        assert not await h.events(incident, "rejectd")


async def test_a_pause_reason_is_bounded_whatever_the_channel(tmp_path: Path) -> None:
    """Slack's ``/pitcrew pause <reason>`` reaches the engine without the HTTP API's checks."""
    async with EngineHarness(tmp_path, inventory=INVENTORY) as h:
        refused = await h.commands.pause("slack:U0OPS", "x" * 501)
        assert refused.status == "invalid" and "at most 500" in refused.message
        assert (await h.commands.status())["paused"] is False
        assert (await h.commands.pause("slack:U0OPS", "x" * 500)).ok
        assert (await h.commands.status())["paused"] is True
