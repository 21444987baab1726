"""Once only: every destructive step, crashed in the middle of its call, never makes it twice.

Each case lets the destructive call reach the far side and then kills pitcrew before the
answer comes back (``Unconfirmed``: the change is made, pitcrew does not know it), restarts
it on the same store and runs the incident to its end. The far side must have seen the call
exactly once. ``reset_gpu`` and ``reboot`` have no far-side question to ask ("did my reset
happen?"): they rely on the intent persisted before the call, and a restart that finds it
unconfirmed assumes the call was made and says so in the timeline (``assumed_issued``).
``slurm_down``, ``cordon``, ``drain`` and ``replace`` ask the far side instead; so does
``requeue_job`` (the hung job's restart count grown, or the job pending, is the requeue made).

The table covers every destructive step of the registry (a new one must be added here). And the
other side: a repair call refused before it reached the far side leaves no intent, so the retry
issues it (once) and assumes nothing.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from bot.engine.steps import REGISTRY
from tests.engine.harness import EngineHarness, Unconfirmed, fleet, transient
from tests.harness.scenarios import fault_delivery


@dataclass(frozen=True)
class Crash:
    port: str
    call: str
    #: What the far side's journal records for the call: (op, target).
    made: tuple[str, str]
    fixture: str = "xid79-firing.json"
    harness: dict[str, Any] = field(default_factory=dict)
    #: The restart took the intent as done (without asking the far side, or as it answered).
    assumed: bool = False
    #: Extra labels on every alert of the delivery, and the catalog fault it becomes (``fault_delivery``).
    labels: dict[str, str] = field(default_factory=dict)
    fault: tuple[str, str] | None = None


NODE = "gpu-node-02"
CRASHES = {
    "slurm_down": Crash("scheduler", "down", ("slurm_down", NODE)),
    "cordon": Crash("cluster", "cordon", ("cordon", NODE)),
    "drain": Crash("cluster", "evict", ("evict", f"ml-train/{NODE}-worker")),
    "reset_gpu": Crash(
        "cluster",
        "reset_gpu",
        ("reset_gpu", NODE),
        fixture="xid48-then-xid154-1-after-xid48.json",
        assumed=True,
    ),
    "reboot": Crash(
        "cluster",
        "reboot",
        ("reboot", NODE),
        harness={"catalog": {"79": {"playbook": "reboot-node"}}},
        assumed=True,
    ),
    "replace": Crash("cluster", "replace", ("replace", NODE)),
    "requeue_job": Crash(
        "scheduler",
        "requeue",
        ("requeue", "101"),
        harness={
            "catalog": {"job-hung": {"playbook": "requeue-hung-job"}},
            "inventory": fleet(jobs=({"job_id": "101", "name": "llm", "user": "dana", "node": NODE},)),
        },
        assumed=True,
        labels={"slurm_job_id": "101"},
        fault=("job-hung", "SlurmJobHung"),
    ),
}


def test_every_destructive_step_is_crashed() -> None:
    assert set(CRASHES) == {name for name, step in REGISTRY.items() if step.destructive}


@pytest.mark.parametrize("case", CRASHES.values(), ids=CRASHES.keys())
async def test_a_crash_mid_call_never_repeats_the_call(case: Crash, tmp_path: Path) -> None:
    step = next(name for name, crash in CRASHES.items() if crash is case)
    async with EngineHarness(tmp_path, **case.harness) as h:
        port = getattr(h, case.port)
        port.script(case.call, Unconfirmed(30))  # made at once; the answer never arrives
        if case.fault is None:
            incident = await h.alert(NODE, case.fixture)
        else:
            incident = await h.opens(_body(case, h.time.now()))
        await h.run_until(lambda: h.calls()[case.made] > 0, about=incident)
        assert (await h.steps(incident))[step].status == "running"
        await h.restart()  # pitcrew dies with the call made and unconfirmed
        done = await h.until_ended(incident)
        assert h.calls()[case.made] == 1, await h.timeline(incident)
        assert done.state.value == "resolved", done.outcome
        assert (await h.steps(incident))[step].status == "ok"
        assumed = await h.events(incident, "assumed_issued", step)
        assert len(assumed) == (1 if case.assumed else 0)
        result = (await h.steps(incident))[step].result
        if "issuing" in result:  # the repair steps' intent record
            assert (result["issued"], result["assumed"]) == (True, case.assumed), result


def _body(case: Crash, starts: datetime) -> bytes:
    """The delivery of a case whose alert is another catalog fault, with its extra labels."""
    assert case.fault is not None
    fault, alertname = case.fault
    body: dict[str, Any] = json.loads(fault_delivery(fault, alertname=alertname, node=NODE, starts=starts))
    for alert in body["alerts"]:
        alert["labels"].update(case.labels)
    return json.dumps(body).encode()


@pytest.mark.parametrize("step", ["reset_gpu", "reboot", "replace"])
async def test_a_call_that_failed_is_issued_again(step: str, tmp_path: Path) -> None:
    """A call refused before it reached the far side (a transient error) leaves no intent behind:
    the retry issues it, once, and nothing is assumed."""
    case = CRASHES[step]
    async with EngineHarness(tmp_path, **case.harness) as h:
        h.cluster.script(case.call, *transient(1))
        incident = await h.alert(NODE, case.fixture)
        done = await h.until_ended(incident)
        assert done.state.value == "resolved", done.outcome
        assert h.cluster.calls[case.call] == 2 and h.calls()[case.made] == 1
        assert not await h.events(incident, "assumed_issued")
        result = (await h.steps(incident))[step].result
        assert (result["issued"], result["assumed"]) == (True, False), result
        [action] = await h.events(incident, "action", step)
        if step == "replace":  # what was acted on is named
            assert action.detail.endswith(f": configured:{NODE}"), action.detail
