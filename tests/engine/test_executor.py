"""The step executor: retries, attempt budgets, deadlines and escalation, against a far side
that fails (or takes its time) on demand — in virtual time.

Cases (one table row each): transient failures are retried and the step succeeds; a
transient failure that outlasts the attempts fails the step and escalates to humans; the
playbook's attempt budget overrides the step's own; a permanent error fails at once; a
defect inside a step (an unexpected exception) escalates instead of killing the worker; a
PodDisruptionBudget refusal (429) is retried; a ``Wait`` answer is polled until the step is
done; a step still waiting at its deadline fails "did not finish within its budget"; a slow
far side within the budget is waited for; the notifier is retried like any port; a far side's
``retry_after`` is waited for before the next attempt; retries stop when the next would begin
past the step's deadline (a ``retry_after`` past it is not slept through), the escalation saying
what failed.

Restarts: a restart in the middle of an attempt resumes that attempt (a step with a
budget of one attempt still completes, its destructive call made once); a restart does not
reset the step's deadline, but a step whose deadline passed while no pitcrew ran it is asked
once more (a node Ready by now completes it; one still waiting fails saying what it waited for),
once per run of the step, the run named by its start (not by a clock): a crash during that last
try ends the step; and a restart with little of the deadline left
does not cut the first call short (it may take the step's whole timeout). A far-side call slower
than the step's budget is cut off at the deadline, on the engine's timer (so in virtual time too).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from bot.engine.errors import Reason, TransientError
from bot.store import codec
from bot.store.base import NewEvent
from tests.engine.harness import Answer, EngineHarness, Fail, Slow, permanent, transient

Setup = Callable[[EngineHarness], None]
REPLACE_NODE = [
    "notify",
    "slurm_down",
    "cordon",
    "drain",
    "replace",
    "wait_ready",
    "slurm_resume",
    "confirm_resumed",
    "close",
]


def _playbook(**budgets: dict[str, Any]) -> dict[str, Any]:
    """replace-node with some steps' budgets changed."""
    steps = [{"step": s, **budgets[s]} if s in budgets else s for s in REPLACE_NODE]
    return {"playbooks": {"replace-node": {"steps": steps}}}


def _not_ready_for(seconds: float | None) -> Setup:
    """The Kubernetes node reports NotReady for its first ``seconds`` of virtual time (None: always)."""

    def setup(h: EngineHarness) -> None:
        def change(node: Any) -> Any:
            late = seconds is not None and h.time.elapsed >= seconds
            return node if node is None or late else replace(node, ready=False)

        for call in ("node", "successor"):  # the same node, or the node that replaced it
            h.cluster.always(call, Answer(change))

    return setup


def _script(port: str, call: str, *effects: Any) -> Setup:
    def setup(h: EngineHarness) -> None:
        getattr(h, port).script(call, *effects)

    return setup


@dataclass(frozen=True)
class StepCase:
    setup: Setup
    step: str
    status: str
    #: Attempts recorded for the step.
    attempts: int
    #: ``step_retry`` events (transient failures retried).
    retries: int
    #: Words in the step's final event.
    detail: str
    harness: dict[str, Any] = field(default_factory=dict)
    #: Virtual seconds the incident must at least have taken.
    took: float = 0.0


STEPS = {
    "transient-then-ok": StepCase(
        _script("scheduler", "down", *transient(2)), "slurm_down", "ok", 3, 2, "DOWN gpu-node-02"
    ),
    "retries-exhausted": StepCase(
        _script("scheduler", "down", *transient(5)),
        "slurm_down",
        "failed",
        5,
        4,
        "slurm_down failed 5 times, last: far side unavailable (unavailable)",
    ),
    "playbook-attempt-budget": StepCase(
        _script("scheduler", "down", *transient(2)),
        "slurm_down",
        "failed",
        2,
        1,
        "slurm_down failed 2 times",
        _playbook(slurm_down={"attempts": 2}),
    ),
    "permanent-error-fails-at-once": StepCase(
        _script("cluster", "cordon", *permanent()),
        "cordon",
        "failed",
        1,
        0,
        "cordon cannot succeed: far side refused the call (refused)",
    ),
    "defect-in-a-step-escalates": StepCase(
        _script("cluster", "replace", Fail(RuntimeError("boom"))),
        "replace",
        "failed",
        1,
        0,
        "replace hit an internal error: RuntimeError('boom')",
    ),
    "pdb-429-retried": StepCase(
        _script("cluster", "evict", *transient(2, reason=Reason.PDB)), "drain", "ok", 3, 2, "1 pod(s) evicted"
    ),
    "wait-polled-until-done": StepCase(
        _not_ready_for(30), "wait_ready", "ok", 1, 0, "node gpu-node-02 is Ready", took=30
    ),
    "deadline-while-waiting": StepCase(
        _not_ready_for(None),
        "wait_ready",
        "failed",
        1,
        0,
        "wait_ready did not finish within its budget: node gpu-node-02 not Ready yet",
        _playbook(wait_ready={"timeout": "60s"}),
        took=60,
    ),
    "slow-far-side-within-budget": StepCase(
        _script("cluster", "replace", Slow(120)),
        "replace",
        "ok",
        1,
        0,
        "replacement of gpu-node-02",
        took=120,
    ),
    "notifier-retried": StepCase(
        _script("notifier", "post", *transient(1)), "notify", "ok", 2, 1, "humans notified"
    ),
}


@pytest.mark.parametrize("case", STEPS.values(), ids=STEPS.keys())
async def test_step(case: StepCase, tmp_path: Path) -> None:
    async with EngineHarness(tmp_path, **case.harness) as h:
        case.setup(h)
        incident = await h.alert("gpu-node-02")
        done = await h.until_ended(incident)
        record = (await h.steps(incident))[case.step]
        assert (record.status, record.attempts) == (case.status, case.attempts)
        assert len(await h.events(incident, "step_retry", case.step)) == case.retries
        finished = (await h.events(incident, "step_finished", case.step))[-1]
        assert case.detail in finished.detail
        assert h.sample("pitcrew_steps_total", step=case.step, outcome=case.status) == 1
        assert h.sample("pitcrew_steps_total", step=case.step, outcome="retried") == case.retries
        assert done.closed_at is not None
        assert (done.closed_at - done.opened_at).total_seconds() >= case.took
        escalations = h.notices("escalation", incident)
        if case.status == "ok":
            assert done.state.value == "resolved" and not escalations
            assert h.calls()[("replace", "gpu-node-02")] == 1  # the playbook went on to its end
        else:
            assert done.state.value == "failed"
            assert done.outcome == f"{case.step} failed: {finished.detail}"
            assert len(escalations) == 1 and escalations[0]["severity"] == "critical"
            assert escalations[0]["actions"] == ["rollback"]
            assert h.sample("pitcrew_steps_total", step=case.step, outcome="escalated") == 1
            later = REPLACE_NODE[REPLACE_NODE.index(case.step) + 1 :]
            ran = await h.steps(incident)
            assert not [s for s in later if s in ran and s != "confirm_resumed"]  # the job track is apart


async def test_a_far_sides_retry_after_is_waited_for_before_the_next_attempt(tmp_path: Path) -> None:
    """The executor's retry uses the one backoff policy (``bot.engine.backoff``): a far side that
    said "in 40 s" is tried again after 40 s (plus at most half the harness' 1 s backoff), not
    after the 1-2 s of a first doubling."""
    slow_down = TransientError("Slurm said slow down", reason=Reason.RATE_LIMITED, retry_after=40)
    async with EngineHarness(tmp_path) as h:
        h.scheduler.script("down", Fail(slow_down))
        incident = await h.alert("gpu-node-02")
        assert (await h.until_ended(incident)).state.value == "resolved"
        [retry] = await h.events(incident, "step_retry", "slurm_down")
        _first, second = await h.events(incident, "step_started", "slurm_down")
        assert retry.data["reason"] == "rate_limited"
        assert 40.0 <= (second.at - retry.at).total_seconds() <= 40.5
        assert h.sample("pitcrew_integration_errors_total", system="scheduler", reason="rate_limited") == 1


async def test_retries_stop_at_the_deadline_saying_what_failed(tmp_path: Path) -> None:
    """A far side failing for longer than the step's budget, with attempts to spare: the retries
    stop when the next would begin past the deadline, and the escalation says what failed. They
    went on until the attempts ran out (cordon with 100 of them: 558 s of a 60 s budget), and in
    real time a try after the deadline was cut off at once, "a call to the far side was still
    running"."""
    unavailable = TransientError("API server answered 503", reason=Reason.UNAVAILABLE)
    async with EngineHarness(tmp_path, **_playbook(cordon={"attempts": 100})) as h:
        h.cluster.always("cordon", Fail(unavailable))
        incident = await h.alert("gpu-node-02")
        done = await h.until_ended(incident)
        [started, *_] = await h.events(incident, "step_started", "cordon")
        [ended] = await h.events(incident, "step_finished", "cordon")
        tries = len(await h.events(incident, "step_retry", "cordon")) + 1
        assert done.state.value == "failed"
        assert (
            f"cordon did not finish within its budget: failed {tries} times, last: API server answered 503"
            in done.outcome
        )
        assert 5 < tries < 100 and (ended.at - started.at).total_seconds() < 60


async def test_a_retry_after_past_the_deadline_is_not_slept_through(tmp_path: Path) -> None:
    slow_down = TransientError("Slurm said slow down", reason=Reason.RATE_LIMITED, retry_after=120)
    async with EngineHarness(tmp_path) as h:  # slurm_down's budget: 60 s
        h.scheduler.script("down", Fail(slow_down))
        incident = await h.alert("gpu-node-02")
        done = await h.until_ended(incident)
        [ended] = await h.events(incident, "step_finished", "slurm_down")
        assert done.state.value == "failed"
        assert "slurm_down did not finish within its budget: failed 1 times, last: Slurm said slow down" in (
            done.outcome
        )
        assert (ended.at - done.opened_at).total_seconds() < 1  # escalated at once, not after 120 s
        assert not await h.events(incident, "step_retry", "slurm_down")


# --------------------------------------------------------------------- restarts
async def test_a_restart_mid_attempt_resumes_the_same_attempt(tmp_path: Path) -> None:
    async with EngineHarness(tmp_path, **_playbook(replace={"attempts": 1})) as h:
        h.cluster.script("replace", Slow(30))  # the call is on its way when pitcrew stops
        incident = await h.alert("gpu-node-02")
        await h.run_until(lambda: h.cluster.calls["replace"] > 0)
        before = (await h.steps(incident))["replace"]
        assert (before.status, before.attempts, before.result["issuing"]) == ("running", 1, True)
        await h.restart()
        done = await h.until_ended(incident)
        after = (await h.steps(incident))["replace"]
        assert done.state.value == "resolved"
        assert (after.status, after.attempts, after.started_at) == ("ok", 1, before.started_at)
        assert len(await h.events(incident, "step_started", "replace")) == 2
        assert len(await h.events(incident, "not_issued", "replace")) == 1
        assert h.calls()[("replace", "gpu-node-02")] == 1


async def test_a_restart_does_not_reset_the_deadline(tmp_path: Path) -> None:
    async with EngineHarness(tmp_path, **_playbook(wait_ready={"timeout": "60s"})) as h:
        _not_ready_for(None)(h)
        incident = await h.alert("gpu-node-02")
        await h.until_event(incident, "step_waiting")
        await h.time.advance(40)
        await h.restart()
        done = await h.until_ended(incident)
        record = (await h.steps(incident))["wait_ready"]
        assert done.state.value == "failed" and record.attempts == 1
        assert record.started_at is not None and record.ended_at is not None
        assert 60 <= (record.ended_at - record.started_at).total_seconds() < 70


async def _down_past_the_deadline(h: EngineHarness, incident: str, seconds: float) -> None:
    """pitcrew stops while wait_ready waits, and no pitcrew runs for ``seconds`` of virtual time."""
    await h.until_event(incident, "step_waiting")
    await h.engine.stop()
    await h.time.advance(seconds)


async def test_a_step_whose_budget_ran_out_while_pitcrew_was_down_is_asked_once_more(tmp_path: Path) -> None:
    async with EngineHarness(tmp_path, **_playbook(wait_ready={"timeout": "60s"})) as h:
        _not_ready_for(100)(h)  # Ready while no pitcrew ran: failing it untried would fail a good repair
        incident = await h.alert("gpu-node-02")
        await _down_past_the_deadline(h, incident, 120)
        await h.restart(new_process=True)
        done = await h.until_ended(incident)
        record = (await h.steps(incident))["wait_ready"]
        [late] = await h.events(incident, "step_resumed_late", "wait_ready")
        assert done.state.value == "resolved", done.outcome
        assert (record.status, record.attempts) == ("ok", 1)  # the same attempt, resumed
        assert late.detail == "its budget (1m) ran out while no pitcrew ran it: one last try"
        assert h.calls()[("slurm_resume", "gpu-node-02")] == 1


async def test_its_one_last_try_says_what_it_waited_for(tmp_path: Path) -> None:
    async with EngineHarness(tmp_path, **_playbook(wait_ready={"timeout": "60s"})) as h:
        _not_ready_for(None)(h)
        incident = await h.alert("gpu-node-02")
        await _down_past_the_deadline(h, incident, 120)
        asked = h.cluster.calls["node"] + h.cluster.calls["successor"]
        await h.restart(new_process=True)
        done = await h.until_ended(incident)
        assert done.state.value == "failed"
        assert "wait_ready did not finish within its budget: node gpu-node-02 not Ready yet" in done.outcome
        assert 0 < h.cluster.calls["node"] + h.cluster.calls["successor"] - asked <= 2  # one check, no polls
        assert len(await h.events(incident, "step_resumed_late")) == 1


async def test_a_crash_during_the_last_try_ends_the_step(tmp_path: Path) -> None:
    async with EngineHarness(tmp_path, **_playbook(wait_ready={"timeout": "60s"})) as h:
        _not_ready_for(None)(h)
        incident = await h.alert("gpu-node-02")
        await _down_past_the_deadline(h, incident, 120)
        h.cluster.script("node", Slow(30))  # the last try is on its way when pitcrew stops again
        h.cluster.script("successor", Slow(30))
        await h.restart(settle=False)
        await h.until_event(incident, "step_resumed_late")
        await h.engine.stop()
        await h.time.advance(5)
        asked = h.cluster.calls["node"] + h.cluster.calls["successor"]
        await h.restart()
        done = await h.until_ended(incident)
        assert done.state.value == "failed"
        assert (
            "wait_ready did not finish within its budget: timed out, its last chance after a restart "
            "taken already" in done.outcome
        )
        assert h.cluster.calls["node"] + h.cluster.calls["successor"] == asked  # not asked again


async def test_a_last_chance_of_an_earlier_run_is_not_this_run_s(tmp_path: Path) -> None:
    """The chance is once per run of the step, the run named by its start. The store holds one
    given to an earlier run of wait_ready, written after this run began by the clock this run's
    start was read from: the run after a pause was started by a replica whose clock runs behind
    the one that gave it. This run, outliving its deadline while no pitcrew ran, is asked all the
    same (a chance matched by when it was written failed it, untried)."""
    async with EngineHarness(tmp_path, **_playbook(wait_ready={"timeout": "60s"})) as h:
        _not_ready_for(100)(h)
        incident = await h.alert("gpu-node-02")
        await _down_past_the_deadline(h, incident, 120)
        started = (await h.steps(incident))["wait_ready"].started_at
        assert started is not None
        earlier = NewEvent(
            "step_resumed_late",
            step="wait_ready",
            detail="its budget (1m) ran out while no pitcrew ran it: one last try",
            data={"run": codec.ts(started - timedelta(minutes=10))},
        )
        await h.store.record(incident, earlier, h.time.now())
        await h.restart(new_process=True)
        done = await h.until_ended(incident)
        assert done.state.value == "resolved", done.outcome
        given = await h.events(incident, "step_resumed_late", "wait_ready")
        assert [e.data["run"] for e in given][1:] == [codec.ts(started)]


async def test_a_last_try_that_fails_is_not_retried_past_the_deadline(tmp_path: Path) -> None:
    async with EngineHarness(tmp_path, **_playbook(wait_ready={"timeout": "60s"})) as h:
        _not_ready_for(None)(h)
        incident = await h.alert("gpu-node-02")
        await _down_past_the_deadline(h, incident, 120)
        h.cluster.script("node", *transient(1))
        h.cluster.script("successor", *transient(1))
        await h.restart(new_process=True)
        done = await h.until_ended(incident)
        assert done.state.value == "failed"
        assert "wait_ready did not finish within its budget: failed 1 times, last: far side unavailable" in (
            done.outcome
        )
        assert not await h.events(incident, "step_retry", "wait_ready")


async def test_a_restart_late_in_the_budget_does_not_cut_the_first_call_short(tmp_path: Path) -> None:
    async with EngineHarness(tmp_path) as h:
        h.cluster.script("cordon", Slow(50), Slow(20))  # cordon's budget: 60 s
        incident = await h.alert("gpu-node-02")
        await h.run_until(lambda: h.cluster.calls["cordon"] > 0)
        await h.time.advance(45)  # the call still on its way, 15 s of the budget left
        await h.restart(new_process=True)  # the far side answers the next call in 20 s
        done = await h.until_ended(incident)
        assert done.state.value == "resolved", done.outcome
        assert h.cluster.calls["cordon"] == 2
        assert h.calls()[("cordon", "gpu-node-02")] == 1
        assert not await h.events(incident, "step_resumed_late")


async def test_a_far_side_slower_than_the_budget_fails_the_step(tmp_path: Path) -> None:
    async with EngineHarness(tmp_path) as h:
        h.cluster.script("cordon", Slow(600))  # cordon's budget: 60 s
        incident = await h.alert("gpu-node-02")
        done = await h.until_ended(incident)
        assert done.state.value == "failed"
        assert (
            "cordon did not finish within its budget: a call to the far side was still running"
            in done.outcome
        )
