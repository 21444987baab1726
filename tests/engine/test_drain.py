"""The drain step's judgement of each pod, in virtual time against the simulated far side.

Cases: one pod's eviction error does not keep the pods listed after it from theirs — a transient one
(the API server's 500) is retried on the next pass after the others were evicted; a permanent one
(a pod under two PodDisruptionBudgets, which the Eviction API refuses with HTTP 500 on every try)
fails the incident naming the pod and both budgets, once every other pod was evicted.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from bot.engine.errors import PermanentError, Reason, TransientError
from tests.engine.harness import EngineHarness, Fail, Through, fleet
from tests.harness.scenarios import gpu_node

NODE = "gpu-node-02"
STEPS = ["notify", "slurm_down", "cordon", "drain", "replace", "wait_ready", "slurm_resume", "close"]
TWO_BUDGETS = (
    "eviction of pod training/a refused: it is selected by more than one PodDisruptionBudget "
    "(team-a, team-wide), which the Eviction API does not support"
)


def _inventory() -> dict[str, Any]:
    return fleet(extra={NODE: gpu_node("training/a", "training/b")})


def _evictions(h: EngineHarness) -> list[str]:
    return [r["pod"] for r in h.records() if r.get("op") == "evict"]


async def test_a_failed_eviction_does_not_hold_back_the_pods_after_it(tmp_path: Path) -> None:
    playbooks = {"replace-node": {"steps": STEPS}}
    async with EngineHarness(tmp_path, inventory=_inventory(), playbooks=playbooks) as h:
        h.cluster.script(
            "evict", Fail(TransientError("evict pod training/a: 500", reason=Reason.UNAVAILABLE)), Through()
        )
        incident = await h.alert(NODE)
        done = await h.until_ended(incident)
        assert done.state.value == "resolved"
        assert _evictions(h) == ["training/b", "training/a"]  # b in the first pass, a on the retry


async def test_a_pod_under_two_budgets_fails_the_drain_naming_them_after_the_others(tmp_path: Path) -> None:
    playbooks = {"replace-node": {"steps": STEPS}}
    async with EngineHarness(tmp_path, inventory=_inventory(), playbooks=playbooks) as h:
        h.cluster.script("evict", Fail(PermanentError(TWO_BUDGETS, reason=Reason.PDB)))
        incident = await h.alert(NODE)
        done = await h.until_ended(incident)
        assert done.state.value == "failed"
        assert _evictions(h) == ["training/b"]
        assert h.calls()[("replace", NODE)] == 0
        [escalation] = h.notices("escalation", incident)
        text = " ".join(escalation["lines"]) + escalation["title"]
        assert "training/a" in text and "team-a, team-wide" in text, text
