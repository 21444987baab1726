"""An incident's way through its playbook: replanning, resolution, hands-off watching, the job
track beside the node track, and approvals — in process, in virtual time.

Cases (one table row each):

- replan: a more severe fault mid-playbook moves to the new playbook and keeps the steps
  already done (nothing destructive twice); a less severe one attaches and changes nothing;
  a more severe one after the node was returned starts over (the node must go out again).
- resolution mid-playbook (while running, while verifying): recorded, but the playbook
  runs to its end and nothing is undone.
- hands-off (notify-only, ask-human): the incident stays open while its alert fires and
  closes when it resolves; it closes at ``watch_max`` if the alert never resolves; a repeat
  alert attaches to it.
- job track: the job runs again elsewhere while the node track still waits for the
  replacement (``job_running`` arrives first); with no free node the job waits for the
  repaired node and both tracks end; a job that cannot requeue is reported lost; a job that
  never comes back fails the incident after the node track, with humans told.
- approvals: approved (by name or by Slack id), a stranger refused, rejected, expired, and
  approved after a restart.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field, replace
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from bot.domain.jobs import JobSnapshot
from bot.engine.registry import Track
from bot.engine.steps import REGISTRY
from tests.engine.harness import Answer, EngineHarness, Slow, Through, fleet
from tests.engine.test_executor import _playbook
from tests.harness.scenarios import delivery, fault_delivery

NODE = "gpu-node-02"
JOB = {"job_id": "101", "name": "llm-pretrain", "user": "dana", "node": NODE}


# ------------------------------------------------------------------------ replan
@dataclass(frozen=True)
class Replan:
    #: The fixture that opens the incident.
    first: str
    #: The delivery that brings the second fault.
    second: Callable[[EngineHarness], bytes]
    #: When it arrives: "drain" (mid-way) or "close" (after the node was returned).
    during: str
    playbook: str
    #: Far-side calls on the node by the end, by op.
    calls: dict[str, int]
    #: The timeline event that says what became of the new fault (kind, words).
    event: tuple[str, str]
    incident_notices: int


def _xid79(h: EngineHarness) -> bytes:
    return delivery(node=NODE, starts=h.time.now())


def _ecc(h: EngineHarness) -> bytes:
    return fault_delivery("ecc-dbe", alertname="GpuEccDoubleBitVolatile", node=NODE, starts=h.time.now())


REPLANS = {
    "more-severe-keeps-done-steps": Replan(
        "xid48-then-xid154-1-after-xid48.json",
        _xid79,
        "drain",
        "replace-node",
        {"slurm_down": 1, "cordon": 1, "reset_gpu": 0, "replace": 1, "slurm_resume": 1},
        ("replanned", "reset-gpu → replace-node: a more severe fault arrived"),
        2,
    ),
    "less-severe-attaches": Replan(
        "xid79-firing.json",
        _ecc,
        "drain",
        "replace-node",
        {"slurm_down": 1, "cordon": 1, "reset_gpu": 0, "replace": 1, "slurm_resume": 1},
        ("fault_attached", "new fault on the node; replace-node already covers it"),
        1,
    ),
    "more-severe-after-return-starts-over": Replan(
        "xid48-then-xid154-1-after-xid48.json",
        _xid79,
        "close",
        "replace-node",
        {"slurm_down": 2, "cordon": 2, "reset_gpu": 1, "replace": 1, "slurm_resume": 2},
        ("replanned", "reset-gpu → replace-node: a more severe fault arrived"),
        2,
    ),
}


class _Cursor:
    """The store, with the node track's cursor moves noted: ``(step ended, or None, cursor)``."""

    def __init__(self, store: Any, time: Any) -> None:
        self._store = store
        self.moves: list[tuple[str | None, int]] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)

    async def step_finished(self, incident_id: str, step: str, *args: Any, **kwargs: Any) -> None:
        await self._store.step_finished(incident_id, step, *args, **kwargs)
        if kwargs.get("step_index") is not None:
            self.moves.append((step, kwargs["step_index"]))

    async def advance(self, incident_id: str, step_index: int, now: Any) -> None:
        await self._store.advance(incident_id, step_index, now)
        self.moves.append((None, step_index))


async def test_a_step_s_end_moves_the_cursor_in_the_same_write(tmp_path: Path) -> None:
    """Each node-track step that ends ``ok`` moves the cursor in the write that ends it (there is no
    moment between the two for a restart to resume in); only the steps the node track passes (the
    job track's) move it on their own."""
    stores: list[_Cursor] = []

    def noted(store: Any, time: Any) -> Any:
        stores.append(_Cursor(store, time))
        return stores[0]

    async with EngineHarness(tmp_path, store=noted) as h:
        incident = await h.alert(NODE)
        done = await h.until_ended(incident)
        assert done.state.value == "resolved" and done.plan is not None
        order = done.plan.steps
        expected = [
            (step if REGISTRY[step].track is Track.NODE else None, index + 1)
            for index, step in enumerate(order[:-1])  # close ends the incident instead
        ]
        assert stores[0].moves[: len(expected)] == expected, stores[0].moves


@pytest.mark.parametrize("case", REPLANS.values(), ids=REPLANS.keys())
async def test_replan(case: Replan, tmp_path: Path) -> None:
    async with EngineHarness(tmp_path) as h:
        if case.during == "drain":
            port, call, made = h.cluster, "evict", 0
            port.script(call, Slow(30))
        else:  # the summary is on its way (within close's 30 s budget): every step before close is done
            port, call, made = h.notifier, "post", 1
            port.script(call, Through(), Slow(20))
        incident = await h.alert(NODE, case.first)
        await h.run_until(lambda: port.calls[call] > made)
        outcome = await h.deliver(case.second(h))
        assert set(outcome.attached) == {incident} and not outcome.opened
        done = await h.until_ended(incident)
        assert done.state.value == "resolved" and done.playbook == case.playbook
        calls = h.calls()
        assert {op: calls[(op, NODE)] for op in case.calls} == case.calls
        kind, words = case.event
        assert [e.detail for e in await h.events(incident, kind)] == [words]
        assert len(h.notices("incident", incident)) == case.incident_notices


# ------------------------------------------------------------- resolved mid-way
def _not_ready_until(h: EngineHarness, seconds: float) -> None:
    def change(node: Any) -> Any:
        return node if node is None or h.time.elapsed >= seconds else replace(node, ready=False)

    for call in ("node", "successor"):  # the same node, or the node that replaced it
        h.cluster.always(call, Answer(change))


RESOLVED_DURING = {
    "while-running": ("running", lambda h: h.cluster.script("evict", Slow(60))),
    "while-verifying": ("verifying", lambda h: _not_ready_until(h, 120)),
}


@pytest.mark.parametrize(("state", "setup"), RESOLVED_DURING.values(), ids=RESOLVED_DURING.keys())
async def test_a_resolved_alert_mid_playbook_changes_nothing(
    state: str, setup: Callable[[EngineHarness], None], tmp_path: Path
) -> None:
    async with EngineHarness(tmp_path) as h:
        setup(h)
        incident = await h.alert(NODE)
        await h.until_state(incident, state)
        await h.time.advance(10)
        outcome = await h.resolve(incident)
        assert outcome.resolved == 3 and set(outcome.resolved_in) == {incident}
        assert (await h.incident(incident)).state.value == state  # not aborted
        done = await h.until_ended(incident)
        assert done.state.value == "resolved" and done.outcome == "resolved"
        assert len(await h.events(incident, "alert_resolved")) == 3
        assert {a.status for a in await h.store.alerts_of(incident)} == {"resolved"}
        calls = h.calls()
        assert calls[("replace", NODE)] == 1 and calls[("slurm_resume", NODE)] == 1
        assert ("uncordon", NODE) not in calls  # nothing undone because of the resolution
        assert all(r.status == "ok" for n, r in (await h.steps(incident)).items())


# -------------------------------------------------------------------- hands-off
@dataclass(frozen=True)
class HandsOff:
    body: Callable[[EngineHarness], bytes]
    playbook: str
    #: Virtual seconds of firing before it resolves (None: it never does).
    fires_for: float | None
    harness: dict[str, Any] = field(default_factory=dict)
    repeat: bool = False


def _exporter_down(h: EngineHarness) -> bytes:
    return delivery("exporter-down-firing.json", node=NODE, starts=h.time.now())


def _unknown_fault(h: EngineHarness) -> bytes:
    return fault_delivery("fan-whine", alertname="GpuFanWhine", node=NODE, starts=h.time.now())


HANDS_OFF = {
    "notify-only-until-resolved": HandsOff(_exporter_down, "notify-only", 3600),
    "ask-human-until-resolved": HandsOff(_unknown_fault, "ask-human", 1800),
    "closes-at-watch-max": HandsOff(
        _exporter_down, "notify-only", None, {"engine": {"watch_max": timedelta(minutes=10)}}
    ),
    "a-repeat-attaches": HandsOff(_exporter_down, "notify-only", 900, repeat=True),
}


@pytest.mark.parametrize("case", HANDS_OFF.values(), ids=HANDS_OFF.keys())
async def test_hands_off_incident_stays_open_while_firing(case: HandsOff, tmp_path: Path) -> None:
    async with EngineHarness(tmp_path, **case.harness) as h:
        incident = await h.opens(case.body(h))
        await h.until_event(incident, "watching")
        if case.repeat:
            await h.time.advance(300)
            again = await h.deliver(case.body(h))  # the same alert, a new occurrence
            assert set(again.attached) == {incident} and not again.opened
        if case.fires_for is None:
            done = await h.until_ended(incident)
            took = (done.updated_at - done.opened_at).total_seconds()
            assert 600 <= took < 700  # watch_max, while the alert still fires
            assert [a.status for a in await h.store.alerts_of(incident)] == ["firing"]
        else:
            await h.time.advance(case.fires_for - h.time.elapsed)
            record = await h.incident(incident)
            assert not record.state.terminal and record.playbook == case.playbook
            await h.resolve(incident)
            done = await h.until_ended(incident, within=120)
            assert (done.updated_at - done.opened_at).total_seconds() >= case.fires_for
        assert done.state.value == "resolved" and done.playbook == case.playbook
        assert len(h.notices("incident", incident)) == 1 and len(h.notices("summary", incident)) == 1
        assert not h.calls()


# -------------------------------------------------------------------- job track
def _job_pending_until_node_returns(h: EngineHarness, *, ever: bool = True) -> None:
    """No free node: the requeued job pends until the repaired node is back (``ever``: at all)."""

    def change(job: JobSnapshot | None) -> JobSnapshot | None:
        if job is None or job.restarts == 0:
            return job
        if ever and h.calls()[("slurm_resume", NODE)]:
            return replace(job, state="RUNNING", nodes=(NODE,))
        return replace(job, state="PENDING", nodes=(), reason="Resources")

    h.scheduler.always("job", Answer(change))


#: replace-node whose job track gives up on the job after five minutes.
CONFIRM_WITHIN_5M = _playbook(confirm_resumed={"timeout": "5m"})


@dataclass(frozen=True)
class JobCase:
    setup: Callable[[EngineHarness], None]
    job: dict[str, Any]
    state: str
    #: The confirm_resumed step's final words.
    confirmed: str
    notices: dict[str, int]
    #: Whether the job was back before the node (job_running while the node track still waited).
    job_first: bool | None
    harness: dict[str, Any] = field(default_factory=dict)


JOBS = {
    "job-back-before-the-node": JobCase(
        lambda h: _not_ready_until(h, 1200),
        JOB,
        "resolved",
        "1 of 1 job(s) running again elsewhere",
        {"job_running": 1, "job_lost": 0, "escalation": 0},
        job_first=True,
    ),
    "no-free-node-job-waits-for-the-node": JobCase(
        _job_pending_until_node_returns,
        JOB,
        "resolved",
        "1 of 1 job(s) running again elsewhere",
        {"job_running": 1, "job_lost": 0, "escalation": 0},
        job_first=False,
    ),
    "job-cannot-requeue-is-lost": JobCase(
        lambda h: None,
        {**JOB, "requeue": False},
        "resolved",
        "0 of 1 job(s) running again elsewhere",
        {"job_running": 0, "job_lost": 1, "escalation": 0},
        job_first=None,
    ),
    "job-never-back-fails-after-node-track": JobCase(
        lambda h: _job_pending_until_node_returns(h, ever=False),
        JOB,
        "failed",
        "confirm_resumed did not finish within its budget",
        {"job_running": 0, "job_lost": 0, "escalation": 1},
        job_first=None,
        harness=CONFIRM_WITHIN_5M,
    ),
}


@pytest.mark.parametrize("case", JOBS.values(), ids=JOBS.keys())
async def test_job_track(case: JobCase, tmp_path: Path) -> None:
    async with EngineHarness(tmp_path, inventory=fleet(jobs=(case.job,)), **case.harness) as h:
        case.setup(h)
        incident = await h.alert(NODE)
        if case.job_first is not None:
            await h.run_until(lambda: bool(h.notices("job_running")), about=incident)
            steps = await h.steps(incident)
            node_back = "slurm_resume" in steps and steps["slurm_resume"].status == "ok"
            assert node_back is not case.job_first
            if case.job_first:  # the node track is still waiting for the replacement
                assert (await h.incident(incident)).state.value == "verifying"
                assert steps["wait_ready"].status == "running"
        done = await h.until_ended(incident)
        assert done.state.value == case.state
        steps = await h.steps(incident)
        confirmed = (await h.events(incident, "step_finished", "confirm_resumed"))[-1]
        assert case.confirmed in confirmed.detail
        assert steps["slurm_resume"].status == "ok"  # the node track ended too
        assert {kind: len(h.notices(kind, incident)) for kind in case.notices} == case.notices
        if case.job_first is not None:
            job_at = steps["confirm_resumed"].result["confirmed_at"]
            node_at = steps["slurm_resume"].result["returned_at"]
            assert isinstance(job_at, str) and isinstance(node_at, str)
            assert (job_at < node_at) is case.job_first
        if case.job_first is False:
            assert await h.events(incident, "requeue_wait_expired", "slurm_resume")
            jobs = steps["confirm_resumed"].result["jobs"]
            assert isinstance(jobs, list) and isinstance(jobs[0], dict)
            assert jobs[0]["detail"] == "running again on the repaired node"
        if case.state == "failed":
            assert done.outcome.startswith(
                "confirm_resumed failed: confirm_resumed did not finish within its budget"
            )
            assert "training job needs a human" in h.notices("escalation", incident)[0]["title"]


# -------------------------------------------------------------------- approvals
@dataclass(frozen=True)
class ApprovalCase:
    decide: Callable[[EngineHarness, str], Awaitable[None]]
    state: str
    outcome: str
    #: The approvals counter that moved.
    counted: str
    acted: bool


def _by(
    actor: str, approve: bool = True, status: str = "ok"
) -> Callable[[EngineHarness, str], Awaitable[None]]:
    async def decide(h: EngineHarness, incident: str) -> None:
        result = await h.commands.decide(incident, actor, approve=approve)
        assert result.status == status, result

    return decide


async def _stranger_then_nobody(h: EngineHarness, incident: str) -> None:
    await _by("mallory", status="refused")(h, incident)
    refused = await h.events(incident, "approve_refused")
    assert [(e.actor, e.outcome) for e in refused] == [("mallory", "refused")]
    await h.time.advance(600)
    assert (await h.incident(incident)).state.value == "awaiting_approval"
    assert not h.calls()


async def _nobody(h: EngineHarness, incident: str) -> None:
    return None


async def _after_a_restart(h: EngineHarness, incident: str) -> None:
    await h.restart()
    approval = await h.store.approval(incident)
    assert approval is not None and approval.status == "pending"
    await _by("alice")(h, incident)


APPROVALS = {
    "approved-by-name": ApprovalCase(_by("alice"), "resolved", "resolved", "approved", True),
    "approved-by-slack-id": ApprovalCase(_by("slack:U0ALICE"), "resolved", "resolved", "approved", True),
    "stranger-refused-then-expires": ApprovalCase(
        _stranger_then_nobody, "suppressed", "approval timed out: nothing was done", "refused", False
    ),
    "rejected": ApprovalCase(
        _by("alice", approve=False), "suppressed", "rejected by alice", "rejected", False
    ),
    "expired": ApprovalCase(_nobody, "suppressed", "approval timed out: nothing was done", "expired", False),
    "approved-after-a-restart": ApprovalCase(_after_a_restart, "resolved", "resolved", "approved", True),
}


@pytest.mark.parametrize("case", APPROVALS.values(), ids=APPROVALS.keys())
async def test_approval(case: ApprovalCase, tmp_path: Path) -> None:
    async with EngineHarness(tmp_path, mode="approve") as h:
        incident = await h.alert(NODE)
        await h.until_state(incident, "awaiting_approval")
        await h.time.advance(60)
        assert not h.calls()  # nothing destructive runs unapproved
        requested = await h.events(incident, "approval_requested")
        assert len(requested) == 1 and "approvers: alice, slack:U0ALICE" in requested[0].detail
        assert h.notices("incident", incident)[0]["actions"] == ["approve", "reject", "rollback"]
        await case.decide(h, incident)
        done = await h.until_ended(incident)
        assert (done.state.value, done.outcome) == (case.state, case.outcome)
        assert h.sample("pitcrew_approvals_total", outcome=case.counted) == 1
        assert bool(h.calls()) is case.acted
        if case.acted:
            assert h.calls()[("slurm_down", NODE)] == 1 and h.calls()[("replace", NODE)] == 1
        expired = h.notices("approval_expired", incident)
        assert len(expired) == (1 if "timed out" in case.outcome else 0)
        if expired:
            assert (done.updated_at - done.opened_at).total_seconds() >= 1800  # the 30 min deadline
