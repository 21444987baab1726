"""Notices once: a step that told humans and died before its result committed does not tell them again.

A step's notice commits with its timeline event and outbox rows in one transaction; the step's
result (its progress, or its end) commits in a later one. Each case lets the notice commit, then
the step's next write of its own record never comes back (``LostCommit``: the process dies there,
as SIGKILL would leave it), restarts pitcrew on the same store and runs the incident to its end:
the notice is in the timeline once, in the outbox once, in the log once, and the step's result
refers to the one that was posted. Cases: the incident notice (``notify``), the summary
(``close``), training running again and a lost job (``confirm_resumed``).

And the other side: a step superseded runs afresh, and its notice is news. A climb to the next rung
runs ``notify`` again, and the new rung's notice is posted beside the first.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from bot.store.base import Store
from tests.engine.harness import EngineHarness, FakeTime, fleet
from tests.engine.test_ladder import RESET, RESET_THEN_REBOOT, Validating

NODE = "gpu-node-02"
JOB = {"job_id": "101", "name": "llm-pretrain", "user": "dana", "node": NODE}


class LostCommit:
    """The store, except that the first write of ``step``'s record after its notice of ``kind``
    was enqueued never answers (pitcrew dies there, the notice committed, the step not); later
    writes go through."""

    def __init__(self, store: Store, time: FakeTime, step: str, kind: str) -> None:
        self._store = store
        self._time = time
        self._step = step
        self._kind = kind
        self._armed = False
        #: The write was cut: pitcrew hangs in it until the test restarts it.
        self.cut = False

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)

    async def enqueue(self, *args: Any, **kwargs: Any) -> int:
        seq: int = await self._store.enqueue(*args, **kwargs)
        kind = args[2] if len(args) > 2 else kwargs["kind"]
        if kind == self._kind and not self.cut:
            self._armed = True
        return seq

    async def step_progress(self, incident_id: str, step: str, *args: Any, **kwargs: Any) -> None:
        await self._maybe_cut(step)
        await self._store.step_progress(incident_id, step, *args, **kwargs)

    async def step_finished(self, incident_id: str, step: str, *args: Any, **kwargs: Any) -> None:
        await self._maybe_cut(step)
        await self._store.step_finished(incident_id, step, *args, **kwargs)

    async def _maybe_cut(self, step: str) -> None:
        if self._armed and step == self._step:
            self._armed, self.cut = False, True
            await self._time.sleep(10**7)  # never answers: the restart cancels it


@dataclass(frozen=True)
class Case:
    step: str
    #: The notice's kind.
    kind: str
    jobs: tuple[dict[str, Any], ...] = ()
    #: The incident's end state.
    state: str = "resolved"
    harness: dict[str, Any] = field(default_factory=dict)


CASES = {
    "incident-notice": Case("notify", "incident"),
    "summary": Case("close", "summary"),
    "training-running-again": Case("confirm_resumed", "job_running", jobs=(JOB,)),
    "job-lost": Case("confirm_resumed", "job_lost", jobs=({**JOB, "requeue": False},)),
}


@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
async def test_a_notice_committed_before_a_crash_is_not_posted_again(case: Case, tmp_path: Path) -> None:
    lost: list[LostCommit] = []

    def wrap(store: Store, time: FakeTime) -> Store:
        lost.append(LostCommit(store, time, case.step, case.kind))
        return lost[0]

    harness = EngineHarness(
        tmp_path, inventory=fleet(jobs=case.jobs), outbox=["slack"], store=wrap, **case.harness
    )
    async with harness as h:
        incident = await h.alert(NODE)
        await h.run_until(lambda: lost[0].cut, about=incident)
        assert (await h.steps(incident))[case.step].status == "running"
        await h.restart()  # pitcrew dies with the notice posted and the step not done
        done = await h.until_ended(incident)
        assert done.state.value == case.state, done.outcome
        told = await h.told_once(incident, case.kind)
        assert (await h.steps(incident))[case.step].status == "ok"
        if case.step == "notify":
            assert (await h.steps(incident))["notify"].result["message"] == f"notice-{told.seq}"


async def test_a_climb_posts_the_next_rung_s_notice(tmp_path: Path) -> None:
    harness = EngineHarness(
        tmp_path, mode="auto", playbooks=RESET_THEN_REBOOT, cluster=Validating, outbox=["slack"]
    )
    async with harness as h:
        incident = await h.alert(NODE, RESET)
        done = await h.until_ended(incident)
        assert done.state.value == "resolved" and done.playbook == "reboot-node", done.outcome
        events = [e for e in await h.events(incident, "notice") if e.outcome == "incident"]
        assert [e.step for e in events] == ["notify", "notify"], await h.timeline(incident)
        assert [e.data["once"] for e in events] == ["incident", "incident"]
        assert "reset-gpu" in events[0].detail and "reboot-node" in events[1].detail
        outbox = [i.event_seq for i in await h.store.outbox_pending("slack") if i.kind == "incident"]
        assert outbox == [e.seq for e in events]
