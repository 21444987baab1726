"""One actor per store, in virtual time: two pitcrew processes on one store, one lease.

Each process (``EngineHarness.process``) has its own store connections, fence, engine, commands
and leadership, over one SQLite file, one simulated far side and one fake clock (the store's
lease clock too). Cases: the first leads and keeps leading by renewing, the second stands by
and says who leads and since when; a leader that dies (SIGKILL: nothing released) is replaced
once its lease lapses, within TTL + one look of the standby, and the incident it left finishes
with every destructive call made once; a leader whose renewals stop reaching the store while
it believes it still leads (its clock frozen) is deposed by the store — its next write raises
``Deposed``, it steps down (its scan's gauges back to 0), and it makes no call to a far side
after its last one in flight; a leader deposed while it reads the node it is about to RESUME has
its intent to RESUME refused by the store, and never sends the RESUME (the new leader's is the one);
a standby never calls a far side, yet takes webhooks, an approval and a rollback, which the
leader carries out once (a rollback sent to both at once too); a graceful stop releases the
lease and the standby takes over at its next look; a rollback given to a standby while nobody
leads is answered ``accepted`` after 20 s and carried out once by whoever leads next.
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from dataclasses import replace
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from bot.domain.incident import State
from tests.engine.harness import Answer, EngineHarness, Process, Slow
from tests.harness.scenarios import delivery, fault_delivery

TTL = timedelta(seconds=15)
LOOK = TTL / 3  # the standby's look, the leader's renewal
FAST = {"poll_interval": timedelta(seconds=2)}


def _role(process: Process) -> str:
    role: str = process.leadership.describe()["role"]
    return role


def _leader(process: Process) -> float:
    return process.metrics.registry.get_sample_value("pitcrew_leader") or 0.0


async def test_the_first_leads_and_renews_the_second_stands_by_and_says_who(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="pitcrew.engine.leadership")
    async with EngineHarness(tmp_path, lease=TTL) as h:
        a = await h.process("a")
        b = await h.process("b")
        assert (_role(a), _role(b)) == ("leader", "standby")
        assert (_leader(a), _leader(b)) == (1.0, 0.0)
        [standing] = [r for r in caplog.records if r.getMessage().startswith("standing by")]
        assert standing.__dict__["leader"] == "a" and standing.__dict__["since"] == h.time.start.isoformat(
            timespec="seconds"
        )
        await h.run_until(lambda: h.time.elapsed >= 3600, 3700)
        lease = await h.store.lease()
        assert lease is not None and (lease.holder, lease.epoch) == ("a", 1) and not lease.expired
        assert (_role(a), _role(b)) == ("leader", "standby")
        assert b.leadership.describe()["leader"] == "a"
        assert len([r for r in caplog.records if r.getMessage().startswith("standing by")]) == 1


async def test_a_dead_leader_is_replaced_within_the_ttl_and_nothing_repeats(tmp_path: Path) -> None:
    async with EngineHarness(tmp_path, lease=TTL, engine=FAST) as h:
        a = await h.process("a")
        b = await h.process("b")
        incident = await h.alert("gpu-node-02")
        await h.until_call("cordon", "gpu-node-02")
        await a.crash()
        by_a = Counter(a.calls)
        took = await h.run_until(lambda: _role(b) == "leader", 120)
        assert took <= (TTL + LOOK).total_seconds()
        assert (await h.until_ended(incident)).state is State.RESOLVED
        assert a.calls == by_a  # nothing more from the dead one
        calls = h.calls()
        assert {c: n for c, n in calls.items() if n > 1} == {}
        for op in ("slurm_down", "cordon", "replace", "slurm_resume"):
            assert calls[(op, "gpu-node-02")] == 1, (op, calls)
        assert b.leadership.describe()["epoch"] == 2


async def test_a_deposed_leader_writes_nothing_more_and_calls_nothing(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="pitcrew.engine.leadership")
    async with EngineHarness(tmp_path, lease=TTL, engine=FAST) as h:
        a = await h.process("a")
        b = await h.process("b")
        hold = [True]  # the replacement is not Ready until the test says so
        for read in ("node", "successor"):
            h.cluster.always(
                read, Answer(lambda n: replace(n, ready=False) if n is not None and hold[0] else n)
            )
        incident = await h.alert("gpu-node-02")
        await h.until_event(incident, "step_waiting")  # a polls wait_ready
        # a's next read of the replacement hangs for a minute, its renewals stop reaching the
        # store, and its clock says its lease is still good: only the store can stop it.
        for read in ("node", "successor"):
            a.cluster.always(read, Slow(60))
        a.cut_off()
        hold[0] = False
        before = Counter(a.calls)
        await h.run_until(lambda: _role(b) == "leader", 120)
        assert a.fence.leading  # a still believes it leads
        assert (await h.until_ended(incident)).state is State.RESOLVED
        await h.run_until(lambda: a.fence.epoch is None, 120)  # stepped down at its next write
        assert _leader(a) == 0.0 and _leader(b) == 1.0
        # What a's scans exported is not a's to say any more (dashboards sum over processes).
        assert a.metrics.registry.get_sample_value("pitcrew_incidents_active", {"state": "verifying"}) == 0
        assert a.metrics.registry.get_sample_value("pitcrew_nodes_under_remediation") == 0
        made = a.calls - before
        # Only the reads of the poll that was in flight when it was cut off: no change to anything.
        assert set(made) <= {"node", "termination_held", "successor"}, made
        calls = h.calls()
        assert {c: n for c, n in calls.items() if n > 1} == {}
        for op in ("slurm_down", "cordon", "replace", "slurm_resume"):
            assert calls[(op, "gpu-node-02")] == 1, (op, calls)

        def stepped_down() -> list[logging.LogRecord]:
            return [
                r
                for r in caplog.records
                if r.getMessage() == "stepped down: standing by" and r.__dict__["holder"] == "a"
            ]

        # The fence is revoked first; the line is written once a's workers have stopped.
        await h.run_until(lambda: bool(stepped_down()), 120)
        [down] = stepped_down()
        assert "another process took over" in down.__dict__["why"]
        finished = [e.step for e in await h.events(incident, "step_finished")]
        assert len(finished) == len(set(finished)), finished  # each step finished once, by b


async def test_a_deposed_leaders_intent_write_is_refused_before_its_destructive_call(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="pitcrew.engine.leadership")
    async with EngineHarness(tmp_path, lease=TTL, engine=FAST) as h:
        a = await h.process("a")
        await h.process("b")
        incident = ""

        class CutOffInSlurmResume:
            """a's first read of the Slurm node in slurm_resume: a is cut off and the read takes a
            minute; b's RESUME, once b leads (within 20 s), takes 70 s more: the node is still DOWN
            when a's read comes back, and a goes on to persist its intent to RESUME."""

            async def __call__(self, time: Any, call: Any) -> Any:
                steps = await h.steps(incident)
                if not a.cut and "wait_ready" in steps and steps["wait_ready"].status == "ok":
                    a.cut_off()
                    h.scheduler.always("resume", Slow(70))
                    await time.sleep(60)
                return await call()

        a.scheduler.always("node", CutOffInSlurmResume())
        incident = await h.alert("gpu-node-02")
        await h.run_until(lambda: a.cut, 600)
        before = Counter(a.calls)
        assert (await h.until_ended(incident)).state is State.RESOLVED
        await h.run_until(lambda: a.fence.epoch is None, 120)
        # Its read (in flight at the cut) came back with the node still DOWN and pitcrew's; the
        # only thing between that read and the RESUME is the intent write, which the store refused.
        assert a.calls - before == Counter() and a.calls["resume"] == 0, a.calls
        [down] = [r for r in caplog.records if r.getMessage() == "stepped down: standing by"]
        assert "another process took over" in down.__dict__["why"], down.__dict__["why"]
        assert h.calls()[("slurm_resume", "gpu-node-02")] == 1  # b's
        assert {c: n for c, n in h.calls().items() if n > 1} == {}
        [resume] = [s for s in (await h.steps(incident)).values() if s.step == "slurm_resume"]
        assert resume.status == "ok"


async def test_a_standby_takes_webhooks_and_commands_and_never_acts(tmp_path: Path) -> None:
    async with EngineHarness(tmp_path, mode="approve", lease=TTL, engine=FAST) as h:
        a = await h.process("a")
        b = await h.process("b")
        # The webhook lands on the standby; the leader acts on it.
        outcome = await b.intake.accept(delivery(node="gpu-node-02", starts=h.time.now()), h.time.now())
        [incident] = outcome.opened
        await h.until_state(incident, "awaiting_approval")
        assert (await b.commands.approve(incident, "alice")).ok
        assert (await h.until_ended(incident)).state is State.RESOLVED
        calls = h.calls()
        assert calls[("slurm_down", "gpu-node-02")] == 1 and calls[("replace", "gpu-node-02")] == 1
        assert b.calls == Counter()  # the standby never called a far side
        assert a.calls

        # A rollback sent to both at once: recorded once, carried out once, by the leader.
        other = await h.opens(
            fault_delivery("health-fail", alertname="GpuHealthFail", node="gpu-node-04", starts=h.time.now())
        )
        await h.until_state(other, "awaiting_approval")
        assert (await b.commands.approve(other, "alice")).ok
        await h.until_ended(other)
        before = h.calls()
        both = [asyncio.create_task(p.commands.rollback(other, f"op-{p.name}")) for p in (a, b)]
        await h.run_until(lambda: all(t.done() for t in both), 300)
        results = [t.result() for t in both]
        assert {r.status for r in results} <= {"ok", "conflict"}, results
        assert any(r.ok for r in results), results
        assert (await h.incident(other)).state is State.ROLLED_BACK
        undone = h.calls() - before
        assert undone == Counter({("uncordon", "gpu-node-04"): 1, ("slurm_resume", "gpu-node-04"): 1}), undone
        assert len(await h.events(other, "rollback_done")) == 1
        assert b.calls == Counter()


async def test_a_rollback_given_to_the_standby_alone_is_carried_out_by_the_leader(tmp_path: Path) -> None:
    async with EngineHarness(tmp_path, lease=TTL, engine=FAST) as h:
        a = await h.process("a")
        b = await h.process("b")
        incident = await h.opens(
            fault_delivery("health-fail", alertname="GpuHealthFail", node="gpu-node-04", starts=h.time.now())
        )
        await h.until_ended(incident)
        asked = asyncio.create_task(b.commands.rollback(incident, "bob"))
        await h.run_until(asked.done, 300)
        result = asked.result()
        assert result.ok and result.message == f"{incident} rolled back by bob"
        assert result.data is not None and any("uncordoned" in line for line in result.data["report"]), result
        assert (await h.incident(incident)).outcome == "rolled back by bob"
        assert b.calls == Counter() and a.calls["uncordon"] == 1


async def test_a_graceful_stop_releases_the_lease_and_the_standby_takes_over_at_its_next_look(
    tmp_path: Path,
) -> None:
    async with EngineHarness(tmp_path, lease=TTL) as h:
        a = await h.process("a")
        b = await h.process("b")
        await a.leadership.stop()
        took = await h.run_until(lambda: _role(b) == "leader", 60)
        assert took <= LOOK.total_seconds()
        lease = await h.store.lease()
        assert lease is not None and (lease.holder, lease.epoch) == ("b", 2)


async def test_a_rollback_recorded_while_nobody_leads_is_carried_out_by_the_next_leader(
    tmp_path: Path,
) -> None:
    # A minute's lease: the standby stops waiting for a report (20 s) long before it lapses.
    async with EngineHarness(tmp_path, lease=timedelta(minutes=1), engine=FAST) as h:
        a = await h.process("a")
        b = await h.process("b")
        incident = await h.opens(
            fault_delivery("health-fail", alertname="GpuHealthFail", node="gpu-node-04", starts=h.time.now())
        )
        await h.until_ended(incident)
        await a.crash()  # its lease lingers for up to a TTL: nobody leads
        asked = asyncio.create_task(b.commands.rollback(incident, "bob"))
        await h.run_until(asked.done, 300)
        assert asked.result().status == "accepted", asked.result()
        assert [e.actor for e in await h.events(incident, "rollback_requested")] == ["bob"]
        assert (await h.incident(incident)).state is State.RESOLVED  # recorded, not yet carried out
        await h.run_until(lambda: _role(b) == "leader", 120)
        done = await h.until_state(incident, "rolled_back")
        assert done.outcome == "rolled back by bob"
        assert h.calls()[("uncordon", "gpu-node-04")] == 1 and b.calls["uncordon"] == 1
        assert len(await h.events(incident, "rollback_done")) == 1


def _gauge(process: Process, name: str) -> float:
    return process.metrics.registry.get_sample_value(name) or 0.0


async def test_the_breaker_and_the_kill_switch_are_shown_by_whoever_leads_as_the_store_holds_them(
    tmp_path: Path,
) -> None:
    """``pitcrew_paused`` and ``pitcrew_breaker_open`` were set by whichever process took the
    command or tripped the breaker: a pause given to the standby and lifted on the leader left the
    standby saying "paused" for good (dashboards and alerts take the max over replicas), and the
    replica that took over from the one that tripped the breaker said it closed, so
    ``PitcrewBreakerOpen`` resolved while it was open (a restarted pod too). Now the leader's
    scan shows both as the store holds them, and no other process shows either."""
    async with EngineHarness(tmp_path, lease=TTL, engine=FAST, breaker={"max_nodes": 1}) as h:
        a = await h.process("a")
        b = await h.process("b")
        assert (await b.commands.pause("oncall")).ok  # on the standby
        await h.run_until(lambda: _gauge(a, "pitcrew_paused") == 1.0, 30)
        assert _gauge(b, "pitcrew_paused") == 0.0
        assert (await a.commands.resume("oncall")).ok  # on the leader
        await h.run_until(lambda: _gauge(a, "pitcrew_paused") == 0.0, 30)
        assert _gauge(b, "pitcrew_paused") == 0.0

        await h.alert("gpu-node-01")
        await h.alert("gpu-node-02")  # two nodes at once: the breaker opens
        await h.run_until(lambda: _gauge(a, "pitcrew_breaker_open") == 1.0, 60)
        assert _gauge(b, "pitcrew_breaker_open") == 0.0
        await a.crash()
        await h.run_until(lambda: _role(b) == "leader", 120)
        await h.run_until(lambda: _gauge(b, "pitcrew_breaker_open") == 1.0, 30)  # still open
        assert (await b.commands.reset_breaker("oncall")).ok
        await h.run_until(lambda: _gauge(b, "pitcrew_breaker_open") == 0.0, 30)
