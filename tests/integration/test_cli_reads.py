"""The CLI as a reader: output into a closed pipe, and ``pitcrew incidents show`` in pages.

Cases: ``catalog``, ``catalog --json``, ``plan`` and ``incidents`` writing into a pipe whose
reader has already gone (``pitcrew catalog | head``) exit with 141 (128 + SIGPIPE, what a
shell reports for ``yes | head``) and print nothing on stderr — run as real subprocesses;
``incidents show`` gives the alerts and events of a 150-alert incident a page at a time with
the API's parameters and cursors (``--alerts-limit``/``--alerts-after``,
``--events-limit``/``--events-after``), 100 rows by default, and the JSON carries
``alerts_next``/``events_next``; the text rendering says how to get the next page of the
timeline; a cursor that is not one is an error (exit 1), not a traceback.
"""

from __future__ import annotations

import asyncio
import copy
import json
import os
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from bot.cli import main
from bot.config import load_config
from bot.engine.intake import Intake
from bot.engine.metrics import Metrics
from bot.store.sqlite import SqliteStore
from tests.conftest import FIXTURES

REPO = Path(__file__).resolve().parents[2]
AM = FIXTURES / "alertmanager"


@pytest.mark.parametrize(
    "argv",
    [["catalog"], ["catalog", "--json"], ["plan", str(AM / "xid79-firing.json")], ["incidents"]],
    ids=["catalog", "catalog-json", "plan", "incidents"],
)
def test_output_into_a_closed_pipe_ends_quietly(argv: list[str], tmp_path: Path) -> None:
    store = tmp_path / "pitcrew.db"
    if argv == ["incidents"]:
        asyncio.run(_incident_with(store, 3))
    read_end, write_end = os.pipe()
    os.close(read_end)  # the reader is gone before pitcrew writes a byte: `| head -c0`, deterministically
    try:
        done = subprocess.run(
            [sys.executable, "-m", "bot.cli", *argv],
            stdout=write_end,
            stderr=subprocess.PIPE,
            cwd=REPO,
            env={**os.environ, "PITCREW_STORE__PATH": str(store)},
            timeout=60,
            check=False,
        )
    finally:
        os.close(write_end)
    assert done.stderr.decode() == ""
    assert done.returncode == 141


def _body(first: int, count: int) -> bytes:
    body = json.loads((AM / "xid79-firing.json").read_text())
    template = body["alerts"][0]
    body["alerts"] = []
    for number in range(first, first + count):
        alert = copy.deepcopy(template)
        alert["fingerprint"] = f"{number:016x}"
        body["alerts"].append(alert)
    return json.dumps(body).encode()


async def _incident_with(path: Path, alerts: int) -> str:
    config = load_config(None, store={"path": str(path)})
    store = SqliteStore(path)
    await store.open()
    try:
        intake = Intake(store, config.catalog, config.labels, Metrics(version="test"))
        start = datetime(2026, 11, 29, 9, tzinfo=UTC)
        opened = (await intake.accept(_body(0, 50), start)).opened
        for index, first in enumerate(range(50, alerts, 50), start=1):
            await intake.accept(_body(first, 50), start + timedelta(seconds=index))
        return opened[0]
    finally:
        await store.close()


def test_incidents_show_pages(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    db = tmp_path / "store.db"
    monkeypatch.setenv("PITCREW_STORE__PATH", str(db))
    incident = asyncio.run(_incident_with(db, 150))

    assert main(["incidents", "show", incident, "--json"]) == 0
    first = json.loads(capsys.readouterr().out)
    assert len(first["alerts"]) == 100 and first["alerts_next"] is not None
    assert len(first["events"]) == 100 and first["events_next"] is not None

    assert main(["incidents", "show", incident, "--json", "--alerts-after", first["alerts_next"]]) == 0
    second = json.loads(capsys.readouterr().out)
    assert len(second["alerts"]) == 50 and second["alerts_next"] is None
    fingerprints = [a["fingerprint"] for a in first["alerts"] + second["alerts"]]
    assert fingerprints == [f"{n:016x}" for n in range(150)]

    argv = ["incidents", "show", incident, "--json", "--events-limit", "40", "--alerts-limit", "1"]
    assert main(argv) == 0
    page = json.loads(capsys.readouterr().out)
    assert len(page["events"]) == 40 and len(page["alerts"]) == 1
    assert main([*argv, "--events-after", page["events_next"]]) == 0
    later = json.loads(capsys.readouterr().out)
    assert later["events"][0]["seq"] > page["events"][-1]["seq"]

    assert main(["incidents", "show", incident]) == 0
    text = capsys.readouterr().out
    assert f"--events-after {first['events_next']}" in text

    assert main(["incidents", "show", incident, "--alerts-after", "nonsense"]) == 1
    assert "--alerts-after" in capsys.readouterr().err
