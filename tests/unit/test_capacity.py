"""The capacity choice (``bot.domain.capacity.choose``), table-driven.

Cases: a spare is taken before a lender; ``min_idle`` keeps spares back; ``max_lend`` as a
count and as a fraction of the pool (counting nodes already lent out); a node taken by
another incident is never taken again, while the asking incident's own take is not held
against it; a node with an open incident, the opt-out label, another GPU type or count, or
busy is refused with its guard named; the failed node's topology block is preferred; no
pool, or pools without a usable member, say why none; two incidents choosing one after the
other never get the same node.
"""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from bot.config import CapacitySettings
from bot.domain.capacity import Candidate, Choice, Need, Pool, PoolView, Taken, choose
from bot.domain.pool_command import fill

NEED = Need("inc-1", "gpu-001", gpu_type="h100", gpus=8, topology="rack-a")
SPARE = Pool("spare", "spare")
LENDER = Pool("inference", "lender", max_lend=2)


def node(name: str, **kw: object) -> Candidate:
    base: dict[str, object] = {"gpu_type": "h100", "gpus": 8, "topology": "rack-b"}
    return Candidate(name, **(base | kw))  # type: ignore[arg-type]


def view(pool: Pool, *members: Candidate) -> PoolView:
    return PoolView(pool, members)


CASES: list[tuple[str, list[PoolView], list[Taken], str | None, tuple[str, ...]]] = [
    ("spare first", [view(SPARE, node("s1")), view(LENDER, node("i1"))], [], "s1", ()),
    (
        "min_idle keeps the last spare, lender next",
        [view(Pool("spare", "spare", min_idle=1), node("s1")), view(LENDER, node("i1"))],
        [],
        "i1",
        ("min_idle",),
    ),
    (
        "min_idle with no lender: none",
        [view(Pool("spare", "spare", min_idle=1), node("s1"))],
        [],
        None,
        ("min_idle",),
    ),
    (
        "min_idle counts only idle members",
        [view(Pool("spare", "spare", min_idle=1), node("s1"), node("s2", idle=False))],
        [],
        None,
        ("busy", "min_idle"),
    ),
    (
        "min_idle 1 with two spares",
        [view(Pool("spare", "spare", min_idle=1), node("s1"), node("s2"))],
        [],
        "s1",
        (),
    ),
    (
        "max_lend count reached",
        [view(LENDER, node("i3"), node("i4"))],
        [Taken("i1", "inference", "inc-8"), Taken("i2", "inference", "inc-9")],
        None,
        ("max_lend",),
    ),
    (
        "max_lend count not yet reached",
        [view(LENDER, node("i2"), node("i3"))],
        [Taken("i1", "inference", "inc-8")],
        "i2",
        (),
    ),
    (
        "max_lend fraction of the pool (1 lent of 4, 0.25 → at most 1)",
        [view(Pool("inference", "lender", max_lend=0.25), node("i2"), node("i3"), node("i4"))],
        [Taken("i1", "inference", "inc-8")],
        None,
        ("max_lend",),
    ),
    (
        "max_lend fraction rounds down: 0.5 of 4 is 2",
        [view(Pool("inference", "lender", max_lend=0.5), node("i2"), node("i3"), node("i4"))],
        [Taken("i1", "inference", "inc-8")],
        "i2",
        (),
    ),
    (
        "max_lend fraction of a small pool lends nothing",
        [view(Pool("inference", "lender", max_lend=0.25), node("i1"), node("i2"))],
        [],
        None,
        ("max_lend",),
    ),
    (
        "taken by another incident",
        [view(SPARE, node("s1"), node("s2"))],
        [Taken("s1", "spare", "inc-2")],
        "s2",
        ("taken",),
    ),
    (
        "the asking incident's own take is not refused",
        [view(SPARE, node("s1"))],
        [Taken("s1", "spare", "inc-1")],
        "s1",
        (),
    ),
    (
        "open incident",
        [view(SPARE, node("s1", open_incident=True), node("s2"))],
        [],
        "s2",
        ("open_incident",),
    ),
    ("opt-out", [view(SPARE, node("s1", opt_out=True))], [], None, ("opt_out",)),
    ("other GPU type", [view(SPARE, node("s1", gpu_type="a100"), node("s2"))], [], "s2", ("gpu_type",)),
    ("other GPU count", [view(SPARE, node("s1", gpus=4))], [], None, ("gpu_count",)),
    (
        "a side that does not say does not refuse",
        [view(SPARE, node("s1", gpu_type=None, gpus=None))],
        [],
        "s1",
        (),
    ),
    ("busy", [view(SPARE, node("s1", idle=False)), view(LENDER, node("i1"))], [], "i1", ("busy",)),
    (
        "topology block preferred over name order",
        [view(SPARE, node("s1"), node("s2", topology="rack-a"))],
        [],
        "s2",
        (),
    ),
    ("the failed node itself is never a candidate", [view(SPARE, node("gpu-001"))], [], None, ()),
    ("no pool", [], [], None, ()),
]


@pytest.mark.parametrize(("name", "pools", "taken", "expected", "guards"), CASES, ids=[c[0] for c in CASES])
def test_choice(
    name: str, pools: list[PoolView], taken: list[Taken], expected: str | None, guards: tuple[str, ...]
) -> None:
    choice = choose(NEED, pools, taken)
    assert choice.node == expected, choice.why
    assert choice.guards == guards, choice.refused
    if expected is None:
        assert choice.why.startswith(("no node to take", "no pool is configured")), choice.why
        for guard in guards:
            assert guard in choice.why  # the answer names every guard that stopped it
    else:
        assert expected in choice.why


def test_choice_names_the_pool_and_the_topology_block() -> None:
    choice = choose(NEED, [view(SPARE, node("s2", topology="rack-a"))], [])
    assert choice == Choice(
        "s2", "spare", "s2 from spare pool spare, in the failed node's topology block rack-a", ()
    )


def test_two_incidents_choosing_in_turn_never_take_the_same_node() -> None:
    pools = [view(SPARE, node("s1"), node("s2")), view(LENDER, node("i1"))]
    taken: list[Taken] = []
    chosen = []
    for n in range(4):
        need = Need(f"inc-{n}", f"gpu-00{n}", gpu_type="h100", gpus=8)
        choice = choose(need, pools, taken)
        if choice.node is not None:
            assert choice.pool is not None
            taken.append(Taken(choice.node, choice.pool, need.incident))
            chosen.append(choice.node)
    assert chosen == ["s1", "s2", "i1"]  # the fourth finds every node taken
    assert choose(Need("inc-9", "gpu-009"), pools, taken).guards == ("taken",)


def test_lend_cap() -> None:
    assert Pool("p", "lender").lend_cap(10) is None
    assert Pool("p", "lender", max_lend=3).lend_cap(10) == 3
    assert Pool("p", "lender", max_lend=0.25).lend_cap(10) == 2


#: A Kubernetes pool, before it says how its nodes join the partition.
SELECTED: dict[str, object] = {"name": "a", "selector": "pitcrew.dev/pool=spare"}


@pytest.mark.parametrize(
    ("pools", "words"),
    [
        ([{"name": "a", "reservation": "r", "max_lend": 1.5}], "whole count"),
        ([{"name": "a", "reservation": "r"}, {"name": "a", "reservation": "s"}], "its own name"),
        ([{"name": "a"}], "reservation"),
        ([{"name": "a", "reservation": "r", "kind": "borrowed"}], "kind"),
        ([{"name": "a", "selector": "p=s"}], "join_labels .* or join_command"),
        (
            [{**SELECTED, "join_labels": {"n": "g"}, "join_command": ["j"], "leave_command": ["l"]}],
            "one of them",
        ),
        ([{**SELECTED, "join_command": ["/bin/join", "{node}"]}], "go together"),
        (
            [{**SELECTED, "join_command": ["/bin/join", "{host}"], "leave_command": ["l"]}],
            r"unknown placeholder \{host\}",
        ),
        ([{**SELECTED, "join_command": ["j"], "leave_command": ["/bin/leave", "{node"]}], "'{node'"),
        (
            [{"name": "a", "reservation": "r", "join_command": ["j"], "leave_command": ["l"]}],
            "Kubernetes pool",
        ),
    ],
    ids=[
        "fractional-count",
        "same-name",
        "no-reservation",
        "unknown-kind",
        "no-join",
        "labels-and-command",
        "join-without-leave",
        "unknown-placeholder",
        "malformed-placeholder",
        "command-on-a-reservation",
    ],
)
def test_capacity_settings_refuse(pools: list[dict[str, object]], words: str) -> None:
    with pytest.raises(ValidationError, match=words):
        CapacitySettings.model_validate({"pools": pools})


def test_capacity_settings_accept_a_count_or_a_fraction() -> None:
    settings = CapacitySettings.model_validate(
        {
            "pools": [
                {"name": "s", "reservation": "r", "min_idle": 1},
                {"name": "i", "reservation": "t", "max_lend": 0.25},
            ]
        }
    )
    assert [p.kind for p in settings.pools] == ["spare", "spare"] and settings.give_back == "refill"
    assert settings.pools[1].max_lend == 0.25


def test_a_pool_command_is_filled_word_by_word() -> None:
    pool = CapacitySettings.model_validate(
        {
            "pools": [
                {**SELECTED, "join_command": ["/bin/join", "--node={node}"], "leave_command": ["/bin/leave"]}
            ]
        }
    ).pools[0]
    words = fill(pool.join_command, node="gpu 01; rm -rf /", incident="pc-00001", pool="a")
    assert words == ["/bin/join", "--node=gpu 01; rm -rf /"]  # one word, never a shell's
