"""The step registry: every step is complete, and a new step is one registration.

Cases: every registered step has a state, its flags, a budget, observe-mode words and an
undo (or the reason there is none), and names the port a mutating step acts through; the
shipped playbooks agree with the registry and set a budget only where it differs from the
step's default; a dummy step registered once (and nowhere else)
is accepted in a playbook, planned, approved like any destructive step and described in
observe mode; incomplete or contradictory definitions are refused when registered; a
playbook naming an unknown step, or a step before what it needs, is refused with the key.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import pytest

from bot.config import load_playbooks
from bot.domain.faults import Fault
from bot.domain.incident import State
from bot.domain.planner import plan
from bot.domain.playbooks import Playbook, PlaybookSet
from bot.domain.policy import Mode, Policy
from bot.engine.context import Done, StepContext, StepResult, Wait
from bot.engine.registry import StepRegistry, Track
from bot.engine.steps import REGISTRY

NOW = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
XID79 = Fault("xid", "gpu-node-02", "3", 79, "RESTART_BM", "gpu-lost", "replace-node", True, "fell off", True)


@pytest.mark.parametrize("name", sorted(REGISTRY))
def test_every_registered_step_has_everything_it_needs(name: str) -> None:
    step = REGISTRY[name]
    assert step.name == name
    assert isinstance(step.state, State) and not step.state.terminal
    assert isinstance(step.mutating, bool) and isinstance(step.destructive, bool)
    assert step.budget.timeout > timedelta(0) and step.budget.attempts >= 1
    assert step.would.strip() and step.would.format(action="DOWN")
    assert callable(step.undo) or (isinstance(step.undo, str) and step.undo.strip())
    assert issubclass(step.result, StepResult) and step.result() is not None  # a fresh progress record
    assert REGISTRY.step_of(step.result) == name
    if step.mutating:
        assert step.port is not None and not step.in_observe
    if step.destructive:
        assert step.mutating
    for needed in step.needs:
        assert needed in REGISTRY


def test_the_registry_holds_the_vocabulary_of_the_shipped_playbooks() -> None:
    shipped = load_playbooks()
    assert REGISTRY.problems(shipped) == []
    used = {spec.step for p in shipped.playbooks.values() for spec in p.steps}
    assert used == set(REGISTRY)
    job_track = sorted(n for n, s in REGISTRY.items() if s.track is Track.JOB)
    assert job_track == ["capacity", "confirm_requeued", "confirm_resumed"]
    assert {n for n, s in REGISTRY.items() if s.reversible} == {"slurm_down", "capacity", "cordon", "replace"}


def test_a_shipped_playbook_sets_a_budget_only_where_it_differs_from_the_step_s_default() -> None:
    # The default budget is the registry's; a playbook repeating it would be a second copy that
    # silently stops being the default when the registry's changes.
    repeated = [
        f"{name}.{spec.step}.{field}"
        for name, playbook in sorted(load_playbooks().playbooks.items())
        for spec in playbook.steps
        for field, given, default in (
            ("timeout", spec.timeout, REGISTRY[spec.step].budget.timeout),
            ("attempts", spec.attempts, REGISTRY[spec.step].budget.attempts),
        )
        if given is not None and given == default
    ]
    assert repeated == []


@dataclass(frozen=True, slots=True)
class FlashResult(StepResult):
    flashed: bool = False


async def flash_firmware(ctx: StepContext[FlashResult]) -> Done[FlashResult] | Wait:
    return Done(FlashResult(flashed=True), "firmware flashed")


def test_a_new_step_is_one_registration_and_nothing_else() -> None:
    registry = REGISTRY.copy()
    registry.step(
        FlashResult,
        state=State.RUNNING,
        timeout=timedelta(minutes=3),
        attempts=2,
        would="flash the GPU firmware",
        undo="firmware cannot be unflashed",
        mutating=True,
        destructive=True,
        port="cluster",
    )(flash_firmware)
    book = Playbook.model_validate({"steps": ["notify", "slurm_down", "cordon", "flash_firmware", "close"]})
    playbooks = load_playbooks().merged({"replace-node": book})
    assert registry.problems(playbooks) == []
    assert REGISTRY.problems(playbooks) == [
        "playbooks.replace-node: unknown step 'flash_firmware' " + _known()
    ]

    approve = plan("gpu-node-02", [XID79], [], Policy(mode=Mode.APPROVE), playbooks, NOW, registry)
    assert approve.steps == ("notify", "approve", "slurm_down", "cordon", "flash_firmware", "close")
    observe = plan("gpu-node-02", [XID79], [], Policy(mode=Mode.OBSERVE), playbooks, NOW, registry)
    assert "flash_firmware" in observe.reasons[-1] and observe.acts
    assert book.spec("flash_firmware").budget(registry["flash_firmware"]).attempts == 2
    assert registry.step_of(FlashResult) == "flash_firmware"


def _known() -> str:
    return "(steps: " + ", ".join(sorted(REGISTRY)) + ")"


@pytest.mark.parametrize(
    ("changes", "words"),
    [
        ({"would": " "}, "observe mode must say"),
        ({"undo": ""}, "say how the step is undone"),
        ({"destructive": True, "mutating": False}, "destructive step is mutating"),
        ({"mutating": True, "in_observe": True, "port": "cluster"}, "observe mode never runs"),
        ({"mutating": True}, "names the port"),
        ({"timeout": timedelta(0)}, "positive timeout"),
        ({"attempts": 0}, "at least one attempt"),
    ],
    ids=[
        "no-observe-words",
        "no-undo-note",
        "destructive-not-mutating",
        "mutating-in-observe",
        "no-port",
        "zero-timeout",
        "zero-attempts",
    ],
)
def test_incomplete_definitions_are_refused(changes: dict[str, object], words: str) -> None:
    fields: dict[str, object] = {
        "state": State.RUNNING,
        "timeout": timedelta(seconds=5),
        "attempts": 1,
        "would": "do it",
        "undo": "nothing to undo",
        **changes,
    }
    with pytest.raises(ValueError, match=words):
        StepRegistry().step(FlashResult, **fields)(flash_firmware)  # type: ignore[arg-type]


def test_a_step_and_a_result_type_are_registered_once() -> None:
    registry = REGISTRY.copy()
    with pytest.raises(ValueError, match="registered twice"):
        registry.register(REGISTRY["cordon"])
    fresh = StepRegistry()
    fresh.step(FlashResult, state=State.RUNNING, timeout=timedelta(1), attempts=1, would="x", undo="y")(
        flash_firmware
    )
    with pytest.raises(ValueError, match="already belongs"):
        fresh.step(
            FlashResult,
            state=State.RUNNING,
            timeout=timedelta(1),
            attempts=1,
            would="x",
            undo="y",
            name="other",
        )(flash_firmware)


@pytest.mark.parametrize(
    ("steps", "problem"),
    [
        (["notify", "slurm_resume", "close"], "'slurm_resume' needs 'slurm_down' before it"),
        (
            ["notify", "confirm_resumed", "slurm_down", "close"],
            "'confirm_resumed' needs 'slurm_down' before it",
        ),
        (["notify", "reboot_now", "close"], "unknown step 'reboot_now'"),
    ],
)
def test_playbooks_disagreeing_with_the_registry_are_refused(steps: list[str], problem: str) -> None:
    playbooks = PlaybookSet(playbooks={"site": Playbook.model_validate({"steps": steps})})
    assert any(problem in p and p.startswith("playbooks.site: ") for p in REGISTRY.problems(playbooks))
