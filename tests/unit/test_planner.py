"""The planner and the guards, table-tested: pure functions of faults, history, policy and now.

Cases: the most severe fault decides; repeats climb the ladder inside the window and not
outside it; modes (observe skips, approve inserts ``approve`` before the first step needing
approval, auto runs); DOWN vs DRAIN; every guard blocks with words and passes with words;
the breaker trips on count and on share; stale alerts after a reset; the state machine.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from bot.config import load_catalog, load_playbooks
from bot.domain.faults import Fault, classify
from bot.domain.guards import BreakerState, Fleet, World, evaluate
from bot.domain.incident import State, TransitionError, can_move, move
from bot.domain.labels import Subject
from bot.domain.planner import PastIncident, plan
from bot.domain.policy import (
    ApprovalPolicy,
    BreakerPolicy,
    EscalationPolicy,
    GuardPolicy,
    Mode,
    NodePolicy,
    Policy,
)
from bot.engine.steps import REGISTRY

NOW = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)
CATALOG = load_catalog()
PLAYBOOKS = load_playbooks()


def fault(xid: int | None = None, kind: str | None = None, gpu: str = "3", message: str = "") -> Fault:
    made = classify(
        Subject("gpu-node-02", gpu, None, None, xid, None if xid is None else str(xid), kind, message),
        CATALOG,
    )
    assert made is not None
    return made


def policy(mode: Mode = Mode.AUTO, **kw: object) -> Policy:
    return Policy(mode=mode, approvals=ApprovalPolicy(approvers=("alice",)), **kw)


def past(playbook: str, ago: timedelta, acted: bool = True, incident: str = "pc-00001") -> PastIncident:
    return PastIncident(incident, playbook, NOW - ago, acted)


@pytest.mark.parametrize(
    ("faults", "playbook"),
    [
        ([fault(79), fault(kind="ecc-dbe", gpu="5")], "replace-node"),
        ([fault(kind="ecc-dbe", gpu="5"), fault(13)], "reset-gpu"),
        ([fault(13), fault(43)], "notify-only"),
        ([fault(43)], "ignore"),
        ([fault(kind="exporter-down"), fault(4242)], "ask-human"),
        ([fault(48), fault(154, message="GPU Recovery Action Changed")], "reset-gpu"),
        ([fault(kind="health-fail"), fault(48)], "reset-gpu"),
    ],
)
def test_most_severe_fault_decides(faults: list[Fault], playbook: str) -> None:
    p = plan("gpu-node-02", faults, [], policy(), PLAYBOOKS, NOW, REGISTRY)
    assert p.playbook == playbook
    assert p.decisive is not None
    assert p.decisive.playbook == playbook
    assert len(p.reasons) >= len(faults)


@pytest.mark.parametrize(
    ("history", "playbook", "says"),
    [
        ([], "reset-gpu", None),
        ([past("reset-gpu", timedelta(hours=2))], "reboot-node", "escalate to reboot-node"),
        (
            [past("reset-gpu", timedelta(hours=3)), past("reboot-node", timedelta(hours=1))],
            "replace-node",
            "escalate to replace-node",
        ),
        ([past("replace-node", timedelta(hours=1))], "replace-node", "escalate to replace-node"),
        ([past("reset-gpu", timedelta(hours=30))], "reset-gpu", None),  # outside the 24h window
        ([past("reset-gpu", timedelta(hours=1), acted=False)], "reset-gpu", None),  # observe-mode past
        ([past("notify-only", timedelta(hours=1))], "reset-gpu", None),
    ],
)
def test_repeats_escalate_inside_the_window(
    history: list[PastIncident], playbook: str, says: str | None
) -> None:
    p = plan("gpu-node-02", [fault(48)], history, policy(), PLAYBOOKS, NOW, REGISTRY)
    assert p.playbook == playbook
    if says:
        assert any(says in r for r in p.reasons), p.reasons


def test_repeat_at_the_top_of_the_ladder_says_so() -> None:
    p = plan(
        "gpu-node-02",
        [fault(79)],
        [past("replace-node", timedelta(hours=1))],
        policy(),
        PLAYBOOKS,
        NOW,
        REGISTRY,
    )
    assert p.playbook == "replace-node"
    assert any("top of the ladder" in r for r in p.reasons)


def test_escalation_window_and_ladder_are_configurable() -> None:
    custom = policy(
        escalation=EscalationPolicy(window=timedelta(hours=48), ladder=("reset-gpu", "replace-node"))
    )
    p = plan(
        "gpu-node-02", [fault(48)], [past("reset-gpu", timedelta(hours=30))], custom, PLAYBOOKS, NOW, REGISTRY
    )
    assert p.playbook == "replace-node"


def test_modes() -> None:
    auto = plan("n", [fault(79)], [], policy(Mode.AUTO), PLAYBOOKS, NOW, REGISTRY)
    assert auto.steps == (
        "notify",
        "slurm_down",
        "capacity",
        "cordon",
        "drain",
        "replace",
        "wait_ready",
        "give_back",
        "slurm_resume",
        "confirm_resumed",
        "close",
    )
    approve = plan("n", [fault(79)], [], policy(Mode.APPROVE), PLAYBOOKS, NOW, REGISTRY)
    assert approve.steps[:3] == ("notify", "approve", "slurm_down")
    assert any("approvers: alice" in r for r in approve.reasons)
    observe = plan("n", [fault(79)], [], policy(Mode.OBSERVE), PLAYBOOKS, NOW, REGISTRY)
    assert observe.steps == auto.steps
    assert not observe.runs_mutating_steps
    assert any("observe" in r and "not executed" in r for r in observe.reasons)
    per_playbook = policy(Mode.AUTO, playbook_modes={"replace-node": Mode.APPROVE})
    assert "approve" in plan("n", [fault(79)], [], per_playbook, PLAYBOOKS, NOW, REGISTRY).steps
    assert "approve" not in plan("n", [fault(48)], [], per_playbook, PLAYBOOKS, NOW, REGISTRY).steps


def test_hands_off_playbooks_never_get_an_approve_step() -> None:
    p = plan("n", [fault(13)], [], policy(Mode.APPROVE), PLAYBOOKS, NOW, REGISTRY)
    assert p.steps == ("notify", "close")
    assert not p.acts


@pytest.mark.parametrize(
    ("f", "action"),
    [(fault(79), "down"), (fault(kind="row-remap-pending"), "drain"), (fault(kind="health-fail"), "drain")],
)
def test_down_or_drain(f: Fault, action: str) -> None:
    assert plan("n", [f], [], policy(), PLAYBOOKS, NOW, REGISTRY).slurm_action == action


def test_no_faults_means_nothing_to_do() -> None:
    p = plan("n", [], [], policy(), PLAYBOOKS, NOW, REGISTRY)
    assert p.playbook == "ignore"
    assert p.steps == ("close",)


# ------------------------------------------------------------------------------ guards
ACTING = plan("gpu-node-02", [fault(79)], [], policy(), PLAYBOOKS, NOW, REGISTRY)


def blocked_by(world: World, pol: Policy | None = None) -> set[str]:
    verdict = evaluate(ACTING, world, pol or policy(), NOW)
    assert all(d.words for d in verdict.decisions)
    assert verdict.allowed == (not verdict.blocking)
    return {d.guard for d in verdict.blocking}


def test_a_clean_world_lets_the_plan_through_and_says_why() -> None:
    verdict = evaluate(ACTING, World(node_labels={}), policy(), NOW)
    assert verdict.allowed
    assert {d.guard for d in verdict.decisions} == {
        "pause",
        "opt-out",
        "attempts",
        "cooldown",
        "stale",
        "breaker",
    }


@pytest.mark.parametrize(
    ("world", "guard"),
    [
        (World(paused=True, paused_by="bob"), "pause"),
        (World(node_labels={"pitcrew.dev/opt-out": "true"}), "opt-out"),
        (
            World(history=[past("reset-gpu", timedelta(hours=h), incident=f"pc-{h}") for h in (2, 4, 6)]),
            "attempts",
        ),
        (World(history=[past("reset-gpu", timedelta(minutes=10))]), "cooldown"),
        (World(breaker=BreakerState(open=True, reason="storm")), "breaker"),
        (World(nodes_in_remediation=frozenset({"a", "b", "c"})), "breaker"),
        (World(nodes_in_remediation=frozenset({"a"}), fleet=Fleet(20, "Kubernetes")), "breaker"),
        (World(nodes_in_remediation=frozenset({"a", "b"}), fleet=Fleet(40, "Kubernetes")), "breaker"),
        (
            World(
                breaker=BreakerState(reset_at=NOW - timedelta(minutes=1)),
                alert_started_at=NOW - timedelta(hours=1),
            ),
            "stale",
        ),
    ],
)
def test_each_guard_blocks_with_words(world: World, guard: str) -> None:
    assert guard in blocked_by(world)


def test_breaker_trip_is_reported_only_when_it_is_the_reason() -> None:
    verdict = evaluate(ACTING, World(nodes_in_remediation=frozenset({"a", "b", "c"})), policy(), NOW)
    assert verdict.trip_breaker is not None
    assert "max_nodes 3" in verdict.trip_breaker
    paused = evaluate(
        ACTING, World(paused=True, nodes_in_remediation=frozenset({"a", "b", "c"})), policy(), NOW
    )
    assert paused.trip_breaker is None  # a paused plan does not count toward the blast radius
    already = evaluate(ACTING, World(breaker=BreakerState(open=True, reason="x")), policy(), NOW)
    assert already.trip_breaker is None


def test_the_share_limit_never_forbids_the_first_node() -> None:
    assert "breaker" not in blocked_by(
        World(fleet=Fleet(6, "Kubernetes"))
    )  # 1 of 6 is 16.7% > 5%, still allowed
    assert "breaker" in blocked_by(World(nodes_in_remediation=frozenset({"a"}), fleet=Fleet(6, "Kubernetes")))


def test_breaker_share_and_fresh_alerts_after_reset() -> None:
    roomy = policy(guards=GuardPolicy(breaker=BreakerPolicy(max_nodes=100, max_fraction=0.5)))
    assert "breaker" not in blocked_by(
        World(nodes_in_remediation=frozenset({"a"}), fleet=Fleet(10, "Kubernetes")), roomy
    )
    fresh = World(
        breaker=BreakerState(reset_at=NOW - timedelta(minutes=1)),
        alert_started_at=NOW - timedelta(seconds=30),
    )
    assert "stale" not in blocked_by(fresh)


def test_cooldown_and_attempts_are_configurable() -> None:
    lenient = policy(guards=GuardPolicy(node=NodePolicy(max_attempts=5, cooldown=timedelta(minutes=5))))
    world = World(history=[past("reset-gpu", timedelta(minutes=10))])
    assert blocked_by(world, lenient) == set()


def test_hands_off_plans_pass_every_guard() -> None:
    hands_off = plan("n", [fault(13)], [], policy(), PLAYBOOKS, NOW, REGISTRY)
    verdict = evaluate(hands_off, World(paused=True, breaker=BreakerState(open=True)), policy(), NOW)
    assert verdict.allowed


# ------------------------------------------------------------------------- state machine
@pytest.mark.parametrize(
    ("a", "b", "ok"),
    [
        (State.OPEN, State.GUARDED, True),
        (State.GUARDED, State.AWAITING_APPROVAL, True),
        (State.AWAITING_APPROVAL, State.RUNNING, True),
        (State.RUNNING, State.VERIFYING, True),
        (State.VERIFYING, State.RESOLVED, True),
        (State.VERIFYING, State.AWAITING_APPROVAL, True),  # a climb asks again
        (State.FAILED, State.ROLLED_BACK, True),
        (State.OPEN, State.RUNNING, False),
        (State.RESOLVED, State.RUNNING, False),
        (State.RESOLVED, State.ROLLED_BACK, True),
        (State.SUPPRESSED, State.GUARDED, False),
        (State.ROLLED_BACK, State.RESOLVED, False),
    ],
)
def test_state_machine(a: State, b: State, ok: bool) -> None:
    assert can_move(a, b) is ok
    if ok:
        assert move(a, b) is b
    else:
        with pytest.raises(TransitionError):
            move(a, b)
