"""The checkpoint step (playbook ``checkpoint-reset-gpu``), in virtual time against the simulated far side.

Cases: a degrading fault under a running job: the job's batch step is signalled once (USR1), the step
waits until the job's checkpoint metric moves, and only then does the node go DOWN; a job that never
checkpoints holds the node at most ``wait_seconds``, then the node goes out anyway and the step says
so; without ``resumption.checkpoint_query`` nothing is signalled and the playbook goes on.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.engine.harness import EngineHarness, fleet
from tests.harness.scenarios import fault_delivery

NODE = "gpu-node-02"
JOB = {"job_id": "101", "name": "llm-pretrain", "user": "dana", "node": NODE}
QUERY = 'max(pitcrew_train_checkpoint_step{job_id="{job_id}"})'
OPT_IN = {"row-remap-pending": {"playbook": "checkpoint-reset-gpu"}}


class Checkpoints:
    """The job's checkpoint metric: 10, and 14 once the job has been signalled (unless ``deaf``)."""

    def __init__(self, h: EngineHarness, deaf: bool = False) -> None:
        self.h, self.deaf = h, deaf

    async def instant(self, promql: str) -> list[tuple[dict[str, str], float]]:
        signalled = any(r.get("op") == "signal_job" for r in self.h.records())
        return [({}, 14.0 if signalled and not self.deaf else 10.0)]


def playbook(wait_seconds: int) -> dict[str, Any]:
    steps = [
        "notify",
        {"step": "checkpoint", "options": {"wait_seconds": wait_seconds}},
        "slurm_down",
        "cordon",
    ]
    steps += ["drain", "reset_gpu", "wait_ready", "slurm_resume", "confirm_resumed", "close"]
    return {"checkpoint-reset-gpu": {"slurm_action": "down", "steps": steps}}


async def degrade(h: EngineHarness) -> str:
    body = fault_delivery("row-remap-pending", alertname="GpuRowRemapPending", node=NODE, starts=h.time.now())
    return await h.opens(body)


def ops(h: EngineHarness) -> list[str]:
    return [r["op"] for r in h.records() if r.get("op") in {"signal_job", "slurm_down"}]


async def test_the_node_goes_out_after_the_new_checkpoint(tmp_path: Path) -> None:
    async with EngineHarness(
        tmp_path, inventory=fleet(jobs=(JOB,)), catalog=OPT_IN, resumption={"checkpoint_query": QUERY}
    ) as h:
        h.deps.ports.query = Checkpoints(h)
        incident = await degrade(h)
        await h.until_call("slurm_down", NODE)
        assert ops(h) == ["signal_job", "slurm_down"]
        [signal] = [r for r in h.records() if r.get("op") == "signal_job"]
        assert (signal["job_id"], signal["signal"]) == ("101", "USR1")
        result = (await h.steps(incident))["checkpoint"]
        assert result.status == "ok" and result.result["saved"] == {"101": 14.0}
        [down] = [r for r in h.records() if r.get("op") == "slurm_down"]
        assert down["reason"].startswith(f"pitcrew: {incident} ")


async def test_a_job_that_never_checkpoints_holds_the_node_only_so_long(tmp_path: Path) -> None:
    async with EngineHarness(
        tmp_path,
        inventory=fleet(jobs=(JOB,)),
        catalog=OPT_IN,
        resumption={"checkpoint_query": QUERY},
        playbooks=playbook(wait_seconds=30),
    ) as h:
        h.deps.ports.query = Checkpoints(h, deaf=True)
        incident = await degrade(h)
        await h.until_call("slurm_down", NODE)
        assert ops(h) == ["signal_job", "slurm_down"]
        result = (await h.steps(incident))["checkpoint"]
        assert result.result["gave_up"] == ["101"]
        [finished] = await h.events(incident, "step_finished", "checkpoint")
        assert "no new checkpoint from job(s) 101 within 30s" in finished.detail
        assert (
            finished.at - result_started(await h.events(incident, "step_started", "checkpoint"))
        ).total_seconds() >= 30


def result_started(events: list[Any]) -> Any:
    return events[0].at


@pytest.mark.parametrize("resumption", [{}, {"progress_query": "max(step)"}])
async def test_without_a_checkpoint_query_nothing_is_signalled(
    tmp_path: Path, resumption: dict[str, str]
) -> None:
    async with EngineHarness(
        tmp_path, inventory=fleet(jobs=(JOB,)), catalog=OPT_IN, resumption=resumption
    ) as h:
        incident = await degrade(h)
        await h.until_call("slurm_down", NODE)
        assert ops(h) == ["slurm_down"]
        [finished] = await h.events(incident, "step_finished", "checkpoint")
        assert "no resumption.checkpoint_query" in finished.detail


async def test_in_approve_mode_the_job_is_signalled_only_after_approval(tmp_path: Path) -> None:
    async with EngineHarness(
        tmp_path,
        mode="approve",
        inventory=fleet(jobs=(JOB,)),
        catalog=OPT_IN,
        resumption={"checkpoint_query": QUERY},
    ) as h:
        h.deps.ports.query = Checkpoints(h)
        incident = await degrade(h)
        await h.until_state(incident, "awaiting_approval")
        record = await h.incident(incident)
        assert record.plan is not None
        assert record.plan.steps[:3] == ("notify", "approve", "checkpoint")
        assert ops(h) == []
