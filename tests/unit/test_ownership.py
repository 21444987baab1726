"""Ownership marks: whose a Slurm reason, a node annotation or a Slinky reason is.

Cases (one row each): this incident's reason is owned by it; another pitcrew incident's
reason is pitcrew's but not this incident's; a foreign reason (an operator's, Slurm's health
check) is nobody's of ours; the same for the Slinky operator's copy and the node annotation;
what ``spec.unschedulable`` was before the cordon (absent, false, true) reads back as it was;
only pitcrew's taint is its own; a replacement mark names its incident and handle, a broken one
nothing; slurm-operator's preStop DOWN is known by the hook's reason or the undrain's relabel of it,
and by nothing else the operator or a person writes.
"""

from __future__ import annotations

import pytest

from bot.domain.ownership import (
    OWNER_ANNOTATION,
    REPLACE_ANNOTATION,
    TAINT_KEY,
    cordon_marks,
    is_own_taint,
    is_pitcrew_reason,
    owns_node,
    owns_slurm_reason,
    prior_unschedulable,
    replacement_mark,
    replacement_owner,
    slinky_prestop_down,
    slinky_reason_is_ours,
    slurm_reason,
    slurm_reason_owner,
)

MINE = "pc-00001"


@pytest.mark.parametrize(
    ("reason", "owner", "pitcrew", "mine"),
    [
        (slurm_reason(MINE, "XID 79 gpu3"), MINE, True, True),
        (slurm_reason("pc-00002", "XID 79 gpu3"), "pc-00002", True, False),
        ("pitcrew: pc-000011 XID 48", "pc-000011", True, False),  # a prefix of another id is not ours
        ("ops: bios update", None, False, False),
        ("NHC: check_gpu failed", None, False, False),
        ("pitcrew:", None, False, False),
        ("", None, False, False),
    ],
)
def test_slurm_reason(reason: str, owner: str | None, pitcrew: bool, mine: bool) -> None:
    assert slurm_reason_owner(reason) == owner
    assert is_pitcrew_reason(reason) is pitcrew
    assert owns_slurm_reason(reason, MINE) is mine
    assert slinky_reason_is_ours(f"slurm-operator: {reason}", MINE) is mine
    assert slinky_reason_is_ours(f"slurm-operator: {reason}") is pitcrew


@pytest.mark.parametrize(
    ("annotations", "mine"),
    [({OWNER_ANNOTATION: MINE}, True), ({OWNER_ANNOTATION: "pc-00002"}, False), ({}, False)],
)
def test_node_annotation(annotations: dict[str, str], mine: bool) -> None:
    assert owns_node(annotations, MINE) is mine


@pytest.mark.parametrize("prior", [None, False, True])
def test_what_the_cordon_found_is_what_rollback_restores(prior: bool | None) -> None:
    marks = cordon_marks(MINE, prior)
    assert marks[OWNER_ANNOTATION] == MINE
    assert prior_unschedulable(marks) is prior
    assert prior_unschedulable({}) is None  # no mark: the field was absent


def test_the_taint_and_the_replacement_mark_are_ours_only_when_they_say_so() -> None:
    assert is_own_taint(TAINT_KEY) and not is_own_taint("karpenter.sh/disrupted")
    mark = {REPLACE_ANNOTATION: replacement_mark(MINE, "machine/gpu-east/m0")}
    assert replacement_owner(mark) == (MINE, "machine/gpu-east/m0")
    for broken in ({}, {REPLACE_ANNOTATION: ""}, {REPLACE_ANNOTATION: MINE}, {REPLACE_ANNOTATION: " handle"}):
        assert replacement_owner(broken) is None, broken


def test_only_the_operators_copy_of_our_reason_is_a_slinky_drain_of_ours() -> None:
    ours = slurm_reason(MINE, "XID 79 gpu3")
    assert slinky_reason_is_ours(f"slurm-operator: {ours}", MINE)
    assert not slinky_reason_is_ours(ours, MINE)  # our own reason, not the operator's copy
    assert not slinky_reason_is_ours(f"{'x' * len('slurm-operator: ')}{ours}", MINE)  # another prefix


@pytest.mark.parametrize(
    ("reason", "prestop"),
    [
        ("slurm-operator: Pod is terminating", True),  # worker_app.go's preStop hook
        ("slurm-operator: Pod (slurm/slurm-worker-gpu-1) was uncordoned", True),  # MakeNodeUndrain over it
        ("slurm-operator: Pod (slurm/slurm-worker-gpu-1) was cordoned", False),  # a drain, never a DOWN
        ("slurm-operator: pitcrew: pc-1 XID 79", False),
        ("Pod is terminating", False),
        ("pitcrew: pc-1 XID 79", False),
        ("Not responding", False),
        ("", False),
    ],
)
def test_the_operators_prestop_down_is_known_by_its_reason(reason: str, prestop: bool) -> None:
    assert slinky_prestop_down(reason) is prestop
