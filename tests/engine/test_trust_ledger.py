"""``pitcrew trust`` reads the same ledger from the store that the counters count live.

Cases, through the engine in virtual time: an XID 79 replaced and back in service (passed),
the same fault on the same node ten minutes later (a repeat against the first, and passed),
another node's remediation rolled back by a human afterwards; ``pitcrew trust --json`` on the
store agrees with ``pitcrew_trust_*_total``, and the text view names the window.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from bot.cli import main
from tests.engine.harness import EngineHarness

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
