"""The audit log exported (``Store.audit_log``, ``pitcrew audit export``), on SQLite and on a real
PostgreSQL (``tests.harness.stores``).

Cases: ``audit_log`` reads every incident's events and those of none, in ``seq`` order, page after
page from a cursor, within ``since`` (inclusive) and ``until`` (exclusive); the command streams
them as JSON lines, one event a line with its incident, in pages of the store, and says on stderr
how many it wrote; the destructive action of an incident pruned by retention is still exported;
``--since`` not before ``--until`` and a time that is not ISO 8601 are refused; no store, no export.
"""

from __future__ import annotations

import asyncio
import json
from datetime import timedelta
from pathlib import Path

import pytest

from bot import cli
from bot.cli import main
from bot.store.base import ACTION, NewEvent
from tests.harness.stores import AnyStore, Stores
from tests.integration.test_store_contract import T0, _alert, _delivery
from tests.integration.test_store_retention import CUTOFF, _gone, _incident

HOUR = timedelta(hours=1)


async def _log(store: AnyStore) -> list[tuple[str | None, str, str]]:
    """Events at T0 (two incidents opened, each by an alert firing), T0+1h, T0+2h (one of no
    incident) and T0+3h."""
    (first,) = (await store.ingest(_delivery(_alert("fp1", "gpu-001")), T0)).opened
    (second,) = (await store.ingest(_delivery(_alert("fp2", "gpu-002")), T0)).opened
    await store.record(first, NewEvent(ACTION, step="slurm_down", detail="DOWN gpu-001"), T0 + HOUR)
    await store.record(None, NewEvent("paused", actor="cli:alice", detail="maintenance"), T0 + 2 * HOUR)
    await store.record(second, NewEvent(ACTION, step="cordon", detail="cordon gpu-002"), T0 + 3 * HOUR)
    return [(e.incident_id, e.kind, e.detail) for e in await store.events_since(0, 100)]


async def test_the_audit_log_is_read_page_by_page_within_a_window(stores: Stores) -> None:
    store = await stores.open()
    everything = await _log(store)
    assert len(everything) == 7 and everything[4] == ("pc-00001", ACTION, "DOWN gpu-001")

    pages, after = [], 0
    while page := await store.audit_log(after=after, limit=2):
        pages.append(page)
        after = page[-1].seq
    assert [len(p) for p in pages] == [2, 2, 2, 1]
    assert [(e.incident_id, e.kind, e.detail) for p in pages for e in p] == everything

    window = await store.audit_log(since=T0 + HOUR, until=T0 + 3 * HOUR)
    assert [(e.incident_id, e.kind, e.detail) for e in window] == everything[4:6]
    assert await store.audit_log(since=T0 + 4 * HOUR) == []
    assert [e.detail for e in await store.audit_log(after=window[0].seq, until=T0 + 3 * HOUR)] == [
        "maintenance"
    ]


@pytest.fixture
def configured(stores: Stores, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Stores:
    """``pitcrew`` configured (environment) for the store the case runs on."""
    if stores.database is not None:
        monkeypatch.setenv("PITCREW_STORE__URL", stores.database.url)
        monkeypatch.setenv("PITCREW_STORE__PASSWORD_FILE", str(stores.database.password_file))
    else:
        monkeypatch.setenv("PITCREW_STORE__PATH", str(tmp_path / "pitcrew.db"))
    return stores


async def test_the_export_streams_json_lines_and_keeps_pruned_incidents_actions(
    configured: Stores, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    store = await configured.open()
    old = await _incident(store, "fp1", "gpu-001")  # closed at T0, with a DOWN action
    await _incident(store, "fp2", "gpu-002")  # the newest: kept
    await store.prune(CUTOFF)
    assert await _gone(store, old)
    expected = [(e.seq, e.incident_id, e.kind, e.detail) for e in await store.events_since(0, 1000)]
    await configured.close()

    monkeypatch.setattr(cli, "AUDIT_PAGE", 3)  # several pages
    assert await _run(["audit", "export", "--format", "jsonl"]) == 0
    out, err = capsys.readouterr()
    lines = [json.loads(line) for line in out.splitlines()]
    assert [(r["seq"], r["incident_id"], r["kind"], r["detail"]) for r in lines] == expected
    assert (old, ACTION, "DOWN gpu-001") in [(r["incident_id"], r["kind"], r["detail"]) for r in lines]
    assert set(lines[0]) == {
        "seq",
        "incident_id",
        "at",
        "kind",
        "step",
        "outcome",
        "attempt",
        "actor",
        "detail",
        "data",
    }
    assert err == f"exported {len(expected)} audit events (seq {expected[0][0]}..{expected[-1][0]})\n"

    # A window: --since inclusive, --until exclusive, a time without an offset is UTC.
    at = lines[-1]["at"]
    assert await _run(["audit", "export", "--since", at]) == 0
    window = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert window and all(r["at"] >= at for r in window)
    assert await _run(["audit", "export", "--until", "2026-11-30T09:00:00"]) == 0  # T0 in UTC
    assert capsys.readouterr() == ("", "exported 0 audit events\n")


async def test_an_export_refuses_a_window_that_is_not_one(
    configured: Stores, capsys: pytest.CaptureFixture[str]
) -> None:
    await configured.open()
    await configured.close()
    assert await _run(["audit", "export", "--since", "2026-06-02", "--until", "2026-06-01"]) == 1
    assert "--since must be before --until" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        await _run(["audit", "export", "--since", "last tuesday"])
    assert "an ISO 8601 date or time" in capsys.readouterr().err


def test_no_store_no_export(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("PITCREW_STORE__PATH", str(tmp_path / "absent.db"))
    assert main(["audit", "export"]) == 1
    assert capsys.readouterr().err == f"no incident store at {tmp_path / 'absent.db'}\n"


async def _run(argv: list[str]) -> int:
    """The command in a thread of its own: it runs its own event loop (``asyncio.run``)."""
    return await asyncio.to_thread(main, argv)
