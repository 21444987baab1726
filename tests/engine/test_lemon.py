"""A lemon node in the engine, in virtual time against the simulated far side.

Cases: a node reset twice, each time more than the escalation window apart (so the ladder never
climbs), gets its third fault within the lemon window: the plan is replacement, chosen by itself;
the node carries the lemon label from its cordon on; the notice names the earlier incidents and
asks for an RMA; ``pitcrew_lemon_nodes_total`` counts it once; ``pitcrew trust`` lists the node as a lemon with its three incidents; a lemon someone
else cordoned is labelled too (their cordon left as it is); a rollback
takes the label off with the cordon.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import replace
from pathlib import Path

import pytest

from bot.cli import main
from bot.engine.ports import PodRef
from tests.engine.harness import Answer, EngineHarness

NODE = "gpu-node-02"
LABEL = "pitcrew.dev/lemon"
#: XID 79 reset instead of replaced: the first two incidents are ordinary GPU resets.
RESET = {"79": {"playbook": "reset-gpu"}}
APART = 25 * 3600.0  # more than escalation.window (24 h), well inside lemon.window (7 d)


async def two_resets(h: EngineHarness) -> list[str]:
    done = []
    for _ in range(2):
        incident = await h.alert(NODE)
        ended = await h.until_ended(incident)
        assert (ended.state.value, ended.plan and ended.plan.playbook) == ("resolved", "reset-gpu")
        done.append(incident)
        await h.time.advance(APART)
    return done


async def test_the_third_fault_in_the_window_replaces_labels_and_asks_for_an_rma(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    async with EngineHarness(tmp_path, catalog=RESET) as h:
        earlier = await two_resets(h)
        assert LABEL not in h.world.node_record(NODE).labels
        third = await h.alert(NODE)
        await h.until_call("replace", NODE)
        record = await h.incident(third)
        assert record.plan is not None
        assert (record.plan.playbook, record.plan.lemon) == ("replace-node", tuple(earlier))
        assert h.world.node_record(NODE).labels[LABEL] == "true"
        [notice] = h.notices("incident", third)
        text = " ".join(notice["lines"])
        assert "lemon: remediation 3" in text and "RMA" in text
        assert all(incident in text for incident in earlier)
        [labelled] = [e for e in await h.events(third, "action") if "labelled" in e.detail]
        assert LABEL in labelled.detail
        assert (await h.until_ended(third)).state.value == "resolved"
        # The fleet dashboard's lemon table: the node, once, under the fault that made it a lemon.
        assert h.sample("pitcrew_lemon_nodes_total", node=NODE, fault_class="gpu-lost") == 1

    # ``pitcrew trust`` lists it among the repeat offenders, as a lemon, with its history.
    monkeypatch.setenv("PITCREW_STORE__PATH", str(tmp_path / "pitcrew.db"))
    assert await asyncio.to_thread(main, ["trust", "--json"]) == 0
    [offender] = json.loads(capsys.readouterr().out)["offenders"]
    assert (offender["node"], offender["lemon"], offender["incidents"]) == (NODE, True, [*earlier, third])
    assert await asyncio.to_thread(main, ["trust"]) == 0
    text = capsys.readouterr().out
    assert "repeat offenders" in text and f"{NODE}" in text and "yes" in text


async def test_a_rollback_takes_the_lemon_label_off(tmp_path: Path) -> None:
    async with EngineHarness(tmp_path, catalog=RESET) as h:
        await two_resets(h)
        # A pod that will not leave holds the drain, so the rollback meets the cordoned lemon.
        h.cluster.always(
            "pods_on_node", Answer(lambda pods: [*pods, PodRef("training", "stuck", owner_kind="Job")])
        )
        third = await h.alert(NODE)
        await h.run_until(lambda: LABEL in h.world.node_record(NODE).labels)
        assert h.world.node_record(NODE).labels[LABEL] == "true"
        await h.commands.rollback(third, actor="cli:alice")
        await h.until_ended(third)
        assert LABEL not in h.world.node_record(NODE).labels
        assert not h.world.node_record(NODE).unschedulable


async def test_a_lemon_someone_else_cordoned_is_labelled_too(tmp_path: Path) -> None:
    async with EngineHarness(tmp_path, catalog=RESET) as h:
        await two_resets(h)
        cordons = h.calls()[("cordon", NODE)]
        # Someone else cordons the node before the third fault (their cordon, not pitcrew's mark).
        h.cluster.always(
            "node", Answer(lambda n: replace(n, unschedulable=True, annotations={}) if n is not None else n)
        )
        third = await h.alert(NODE)
        await h.run_until(lambda: LABEL in h.world.node_record(NODE).labels)
        assert h.calls()[("cordon", NODE)] == cordons  # their cordon is left as it is
        assert [e for e in await h.events(third, "not_owned")]
