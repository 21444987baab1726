"""The dry-run journal writes down what would have been done and knows nothing; notices go to the log.

Cases: every write of the Scheduler and Cluster ports appends one line marked
``"dry_run": true`` with its op and arguments, in call order, durable (fsynced in a worker
thread, not on the event loop) before the call returns; reads know nothing — node and fleet
reads raise ``PermanentError(reason="dry_run")``, lists are empty, a job is unknown, no
replacement ever started — and stay so after writes (no state model); the journal satisfies
both ports. ``LogNotifier``: one ``pitcrew.notice`` log record per notice with its fields
(and nothing else of the notice), one journal line when a journal is given.
"""

from __future__ import annotations

import json
import logging
import os
import threading
from collections.abc import Awaitable
from pathlib import Path
from typing import Any

import pytest

from bot.engine.errors import PermanentError
from bot.engine.ports import Cluster, Notice, PodRef, Scheduler
from bot.integrations.journal import DryRunJournal, LogNotifier


def lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


async def test_every_write_appends_one_marked_line_with_its_arguments(tmp_path: Path) -> None:
    path = tmp_path / "state" / "dry-run-journal.jsonl"
    journal = DryRunJournal(path)
    pod = PodRef("ml-train", "worker-0", owner_kind="Job")
    calls: list[tuple[Awaitable[object], dict[str, Any]]] = [
        (journal.down("gpu-001", "pitcrew: pc-1 XID 79"), {"op": "slurm_down", "node": "gpu-001"}),
        (journal.drain("gpu-002", "pitcrew: pc-2 ecc"), {"op": "slurm_drain", "node": "gpu-002"}),
        (journal.requeue("4711"), {"op": "requeue", "job_id": "4711"}),
        (journal.signal_job("4711", "USR1"), {"op": "signal_job", "job_id": "4711", "signal": "USR1"}),
        (journal.cordon("gpu-001", incident_id="pc-1", reason="r"), {"op": "cordon", "incident_id": "pc-1"}),
        (journal.set_annotations("gpu-001", {"a": "1", "b": None}), {"annotations": {"a": "1", "b": None}}),
        (
            journal.set_labels("gpu-001", {"pitcrew.dev/lemon": "true"}),
            {"labels": {"pitcrew.dev/lemon": "true"}},
        ),
        (journal.evict(pod), {"op": "evict", "pod": "ml-train/worker-0"}),
        (journal.delete_pod(pod, force=True), {"op": "delete_pod", "force": True}),
        (journal.replace("gpu-001", strategy="cluster-api", incident_id="pc-1"), {"strategy": "cluster-api"}),
        (journal.reboot("gpu-003", incident_id="pc-3"), {"op": "reboot", "node": "gpu-003"}),
        (
            journal.reset_gpu("gpu-003", ["3", "5"], incident_id="pc-3"),
            {"op": "reset_gpu", "gpus": ["3", "5"]},
        ),
        (journal.uncordon("gpu-001", incident_id="pc-1"), {"op": "uncordon", "incident_id": "pc-1"}),
        (journal.resume("gpu-001"), {"op": "slurm_resume", "node": "gpu-001"}),
    ]
    for number, (call, expected) in enumerate(calls, start=1):
        await call
        written = lines(path)  # on disk as soon as the call returned
        assert len(written) == number
        assert written[-1]["dry_run"] is True and "at" in written[-1]
        assert written[-1].items() >= expected.items(), written[-1]
    assert [r["op"] for r in lines(path)] == [
        "slurm_down",
        "slurm_drain",
        "requeue",
        "signal_job",
        "cordon",
        "annotate",
        "label",
        "evict",
        "delete_pod",
        "replace",
        "reboot",
        "reset_gpu",
        "uncordon",
        "slurm_resume",
    ]


async def test_each_line_is_fsynced_off_the_event_loop(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    synced_on: list[threading.Thread] = []
    real_fsync = os.fsync

    def fsync(fd: int) -> None:
        synced_on.append(threading.current_thread())
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)  # the module the journal imported
    journal = DryRunJournal(tmp_path / "j.jsonl")
    await journal.down("gpu-001", "pitcrew: pc-1 XID 79")
    await journal.cordon("gpu-001", incident_id="pc-1", reason="r")
    assert len(synced_on) == 2
    assert threading.main_thread() not in synced_on


async def test_reads_know_nothing_before_and_after_writes(tmp_path: Path) -> None:
    journal = DryRunJournal(tmp_path / "j.jsonl")
    for written in (False, True):
        if written:
            await journal.down("gpu-001", "pitcrew: pc-1 XID 79")
            await journal.cordon("gpu-001", incident_id="pc-1", reason="r")
            await journal.replace("gpu-001", strategy="delete-node", incident_id="pc-1")
        for read in (journal.node("gpu-001"), journal.count_nodes()):
            with pytest.raises(PermanentError) as refused:
                await read
            assert refused.value.reason == "dry_run"
        assert await journal.jobs_on_node("gpu-001") == []
        assert await journal.job("4711") is None
        assert await journal.pods_on_node("gpu-001") == []
        assert await journal.slurmd_pods("slurm", {"app": "slurmd"}) == []
        assert await journal.replacement_started("gpu-001", incident_id="pc-1") is False
        assert await journal.cancel_replacement("gpu-001", incident_id="pc-1") is False


def test_the_journal_stands_behind_both_ports_and_says_what_it_is(tmp_path: Path) -> None:
    journal = DryRunJournal(tmp_path / "j.jsonl")
    assert isinstance(journal, Scheduler) and isinstance(journal, Cluster)
    assert journal.far_side == "journal"
    assert not (tmp_path / "j.jsonl").exists()  # nothing written until something is asked


NOTICE = Notice(
    "pc-00042",
    "escalation",
    "gpu-node-02: replace failed — a human must take over",
    ("replace cannot succeed", "Roll back with `pitcrew rollback pc-00042`"),
    severity="critical",
    actions=("rollback",),
    node="gpu-node-02",
)


async def test_a_notice_is_one_log_record_and_one_journal_line(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "j.jsonl"
    notifier = LogNotifier(DryRunJournal(path))
    with caplog.at_level(logging.INFO, logger="pitcrew.notice"):
        first = await notifier.post(NOTICE)
        second = await notifier.post(NOTICE)
    assert first and second and first != second
    records = [r for r in caplog.records if r.name == "pitcrew.notice"]
    assert len(records) == 2
    record = records[0]
    assert record.levelno == logging.WARNING
    fields = {k: getattr(record, k) for k in ("incident", "kind", "severity", "title", "lines")}
    assert fields == {
        "incident": "pc-00042",
        "kind": "escalation",
        "severity": "critical",
        "title": NOTICE.title,
        "lines": list(NOTICE.lines),
    }
    [line, _] = lines(path)
    assert (
        line.items()
        >= {
            "op": "notice",
            "dry_run": True,
            "incident_id": "pc-00042",
            "kind": "escalation",
            "title": NOTICE.title,
            "lines": list(NOTICE.lines),
            "severity": "critical",
            "actions": ["rollback"],
        }.items()
    )


async def test_without_a_journal_a_notice_is_only_logged(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    info = Notice("pc-1", "summary", "gpu-node-02: replace-node finished in 3m")
    with caplog.at_level(logging.INFO, logger="pitcrew.notice"):
        assert await LogNotifier().post(info)
    [record] = [r for r in caplog.records if r.name == "pitcrew.notice"]
    assert record.levelno == logging.INFO and record.getMessage() == info.title
    assert list(tmp_path.iterdir()) == []
