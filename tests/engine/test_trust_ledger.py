"""``pitcrew trust`` reads the same ledger from the store that the counters count live.

Cases, through the engine in virtual time: an XID 79 replaced and back in service (passed),
the same fault on the same node ten minutes later (a repeat against the first, and passed),
another node's remediation rolled back by a human afterwards; ``pitcrew trust --json`` on the
store agrees with ``pitcrew_trust_*_total``, and the text view names the window. An incident
whose fault came back after the reset climbed to the reboot: the store's ledger counts the reset
``climbed`` and the reboot ``passed``, as the counters do.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from bot.cli import main
from tests.engine.harness import EngineHarness
from tests.engine.test_ladder import NODE, RESET, WATCHED, fault_again

LABELS = {"playbook": "replace-node", "fault_class": "gpu-lost"}


async def test_the_cli_ledger_matches_the_counters(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    async with EngineHarness(tmp_path) as h:
        first = await h.alert("gpu-node-02")
        assert (await h.until_ended(first)).state.value == "resolved"
        await h.time.advance(600)
        again = await h.alert("gpu-node-02")
        assert (await h.until_ended(again)).state.value == "resolved"
        other = await h.alert("gpu-node-03")
        assert (await h.until_ended(other)).state.value == "resolved"
        assert (await h.commands.rollback(other, "alice")).ok
        counted = {
            "passed": h.sample("pitcrew_trust_retests_total", outcome="passed", **LABELS),
            "repeat": h.sample("pitcrew_trust_retests_total", outcome="repeat", **LABELS),
            "rolled_back": h.sample("pitcrew_trust_overrides_total", action="rolled_back", **LABELS),
            "rejected": h.sample("pitcrew_trust_overrides_total", action="rejected", **LABELS),
        }
    assert counted == {"passed": 3, "repeat": 1, "rolled_back": 1, "rejected": 0}

    monkeypatch.setenv("PITCREW_STORE__PATH", str(tmp_path / "pitcrew.db"))
    assert await asyncio.to_thread(main, ["trust", "--json"]) == 0
    [row] = json.loads(capsys.readouterr().out)["rows"]
    assert {k: row[k] for k in counted} == counted
    assert (row["playbook"], row["fault_class"], row["remediations"]) == ("replace-node", "gpu-lost", 3)
    assert row["overridden_rate"] == pytest.approx(1 / 3) and row["repeat_rate"] == pytest.approx(1 / 3)
    assert await asyncio.to_thread(main, ["trust"]) == 0
    text = capsys.readouterr().out
    assert "replace-node" in text and "33%" in text and "within 1d" in text


async def test_the_cli_ledger_counts_the_rung_that_climbed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    async with EngineHarness(tmp_path, playbooks=WATCHED) as h:
        incident = await h.alert(NODE, RESET)
        await h.until_event(incident, "return_watch")
        await h.time.advance(60)
        await fault_again(h, incident)
        done = await h.until_ended(incident)
        assert (done.state.value, done.playbook) == ("resolved", "reboot-node")
        fault_class = done.plan.decisive.fault_class  # type: ignore[union-attr]
        counted = {
            (playbook, outcome): h.sample(
                "pitcrew_trust_retests_total", playbook=playbook, fault_class=fault_class, outcome=outcome
            )
            for playbook in ("reset-gpu", "reboot-node")
            for outcome in ("passed", "climbed")
        }
    monkeypatch.setenv("PITCREW_STORE__PATH", str(tmp_path / "pitcrew.db"))
    assert await asyncio.to_thread(main, ["trust", "--json"]) == 0
    rows = {r["playbook"]: r for r in json.loads(capsys.readouterr().out)["rows"]}
    assert {(p, o): rows[p][o] for p, o in counted} == counted
    assert counted[("reset-gpu", "climbed")] == 1 and counted[("reboot-node", "passed")] == 1
    assert await asyncio.to_thread(main, ["trust"]) == 0
    assert "climbed: the rung's repair did not clear the fault" in capsys.readouterr().out
