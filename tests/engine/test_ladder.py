"""The repair ladder inside one incident: a playbook's ``next`` rung, climbed when its repair fails.

The far side is the simulated cluster with an operator's validation Job (``Validating``): it
fails on the first repaired node it checks and passes afterwards, as a GPU reset that did not
clear the fault and the reboot that did. Cases: in ``auto`` a reset whose validation fails
climbs to ``reboot-node`` by itself, the node taken out once (what the reset rung did carries
over), rebooted, validated and returned, and the incident resolves; the timeline records the
climb and both rungs, the trust ledger counts the failed rung's retest (``climbed``) and the
reboot's (``passed``). In ``approve`` the climb asks again, under the new rung's name, and a
rejection ends it with nothing more done. Without ``next`` the failed validation goes to
humans, as before. A ladder naming no playbook, or climbing in a circle, is refused.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from bot.domain.playbooks import Playbook, PlaybookSet
from bot.engine.errors import PermanentError, Reason
from bot.engine.steps import REGISTRY
from tests.engine.harness import EngineHarness
from tests.simulator.cluster import SimulatedCluster
from tests.simulator.world import SimulatedWorld

NODE = "gpu-node-02"
RESET = "xid48-then-xid154-1-after-xid48.json"  # XID 48 → reset-gpu
RESET_THEN_REBOOT = {
    "reset-gpu": {
        "steps": [
            "notify",
            "slurm_down",
            "cordon",
            "drain",
            "reset_gpu",
            {"step": "wait_ready", "timeout": "15m"},
            "slurm_resume",
            {"step": "confirm_resumed", "timeout": "45m"},
            "close",
        ],
        "next": "reboot-node",
    }
}


class Validating(SimulatedCluster):
    """The simulated cluster with a validation Job that fails its first run."""

    runs: list[bool] = []

    def __init__(self, world: SimulatedWorld) -> None:
        super().__init__(world)
        self.runs = []

    async def validate(self, name: str, *, incident_id: str) -> bool | None:
        passed = bool(self.runs)
        self.runs.append(passed)
        if not passed:
            raise PermanentError(
                f"validation Job failed on {name}: dcgmi diag level 3", reason=Reason.JOB_FAILED
            )
        return True


def harness(tmp_path: Path, mode: str, playbooks: dict[str, Any] | None = RESET_THEN_REBOOT) -> EngineHarness:
    return EngineHarness(tmp_path, mode=mode, playbooks=playbooks, cluster=Validating)


async def test_a_failed_reset_climbs_to_reboot_by_itself_in_auto(tmp_path: Path) -> None:
    async with harness(tmp_path, "auto") as h:
        incident = await h.alert(NODE, RESET)
        done = await h.until_ended(incident)
        assert done.state.value == "resolved", await h.timeline(incident)
        assert done.playbook == "reboot-node"
        [climbed] = await h.events(incident, "climbed")
        assert climbed.data["from"] == "reset-gpu" and climbed.data["to"] == "reboot-node"
        assert "validation Job failed" in climbed.detail
        calls = h.calls()
        assert calls[("reset_gpu", NODE)] == 1 and calls[("reboot", NODE)] == 1
        assert calls[("cordon", NODE)] == 1 and calls[("slurm_down", NODE)] == 1  # taken out once
        assert h.cluster.runs == [False, True]
        planned = [e.detail for e in await h.events(incident, "planned")]
        assert planned[0].startswith("reset-gpu")
        ledger = {
            outcome: h.sample(
                "pitcrew_trust_retests_total", playbook=playbook, fault_class=fc, outcome=outcome
            )
            for playbook, fc, outcome in [
                ("reset-gpu", done.plan.decisive.fault_class, "climbed"),  # type: ignore[union-attr]
                ("reboot-node", done.plan.decisive.fault_class, "passed"),  # type: ignore[union-attr]
            ]
        }
        assert ledger == {"climbed": 1, "passed": 1}


async def test_the_climb_asks_again_in_approve_mode(tmp_path: Path) -> None:
    async with harness(tmp_path, "approve") as h:
        incident = await h.alert(NODE, RESET)
        await h.until_state(incident, "awaiting_approval")
        assert (await h.commands.approve(incident, "alice")).ok
        await h.until_event(incident, "climbed")
        await h.until_state(incident, "awaiting_approval")
        asked = await h.events(incident, "approval_requested")
        assert len(asked) == 2
        assert h.calls()[("reboot", NODE)] == 0  # nothing of the new rung before its approval
        assert (await h.commands.reject(incident, "alice")).ok
        done = await h.until_ended(incident)
        assert done.state.value == "suppressed" and done.playbook == "reboot-node"
        assert h.calls()[("reboot", NODE)] == 0


async def test_without_a_next_rung_a_failed_validation_goes_to_humans(tmp_path: Path) -> None:
    async with harness(tmp_path, "auto", playbooks=None) as h:
        incident = await h.alert(NODE, RESET)
        done = await h.until_ended(incident)
        assert done.state.value == "failed" and done.playbook == "reset-gpu"
        assert not await h.events(incident, "climbed")
        assert h.calls()[("reboot", NODE)] == 0


def test_a_ladder_must_name_playbooks_and_never_circle() -> None:
    steps = {"steps": ["notify", "close"]}
    bad = PlaybookSet(
        playbooks={
            "a": Playbook.model_validate({**steps, "next": "b"}),
            "b": Playbook.model_validate({**steps, "next": "a"}),
            "c": Playbook.model_validate({**steps, "next": "nowhere"}),
        }
    )
    problems = bad.problems(REGISTRY)
    assert "playbooks.c: next rung 'nowhere' is not a playbook" in problems
    assert any("climbs in a circle (a → b → a)" in p for p in problems), problems
