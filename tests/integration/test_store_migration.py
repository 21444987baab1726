"""Rows written by release 0.1.0 are read by this release.

``tests/fixtures/store/pitcrew-0.1.0.db`` was written by the 0.1.0 service itself (see the
README beside it): a resolved replace-node incident with recorded jobs, a failed one, a
rolled-back one, an observe-mode one, one awaiting approval and one killed in the middle of
its drain. Cases: every incident, plan and step record decodes into this release's typed
records with the values 0.1.0 stored; the read API renders each incident; the interrupted
drain's progress is what a resumed step would continue from; the file migrates to this release's
schema and retention prunes it by the same rule as a new store.
"""

from __future__ import annotations

import json
import shutil
import sqlite3
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from bot.domain.incident import State
from bot.engine.rollback import ROLLBACK, RollbackRecord
from bot.engine.steps import REGISTRY
from bot.engine.steps.cluster import DrainResult
from bot.engine.steps.resumed import ConfirmResumedResult
from bot.engine.steps.slurm import SlurmDownResult
from bot.store import codec
from bot.store.schema import SCHEMA_VERSION
from bot.store.sqlite import SqliteStore
from bot.web.views import incident_detail
from tests.conftest import FIXTURES

STORE = FIXTURES / "store"
EXPECTED: dict[str, Any] = json.loads((STORE / "pitcrew-0.1.0.expected.json").read_text())


@pytest.fixture
async def old_store(tmp_path: Path) -> Any:
    # Opening a WAL database creates files beside it: never open the fixture in place.
    path = tmp_path / "pitcrew.db"
    shutil.copy(STORE / "pitcrew-0.1.0.db", path)
    store = SqliteStore(path)
    await store.open()
    yield store
    await store.close()


async def test_every_old_incident_reads_into_typed_records(old_store: SqliteStore) -> None:
    assert len(EXPECTED["incidents"]) == 6
    for want in EXPECTED["incidents"]:
        incident = await old_store.incident(want["id"])
        assert incident is not None, want["id"]
        assert (
            incident.node,
            incident.state.value,
            incident.playbook,
            incident.mode,
            incident.step_index,
        ) == (
            want["node"],
            want["state"],
            want["playbook"],
            want["mode"],
            want["step_index"],
        )
        assert incident.plan is not None
        assert list(incident.plan.steps) == want["plan"]["steps"]
        assert incident.plan.slurm_action == want["plan"]["slurm_action"]
        assert incident.plan.mode.value == want["mode"]
        steps = await old_store.steps_of(want["id"])
        assert {name: r.status for name, r in steps.items()} == {
            name: r["status"] for name, r in want["step_records"].items()
        }
        for name, record in steps.items():
            if name in REGISTRY and record.status != "skipped":
                codec.decode_record(REGISTRY[name].result, record.result)  # every result decodes
        view = incident_detail(
            incident,
            await old_store.alerts_of(want["id"]),
            await old_store.events_of(want["id"]),
            steps,
            await old_store.approval(want["id"]),
        )
        assert view["steps"] == want["plan"]["steps"] and view["state"] == want["state"]


async def test_old_results_keep_their_values(old_store: SqliteStore) -> None:
    resolved = await old_store.incident("pc-00001")
    assert resolved is not None and resolved.plan is not None
    assert resolved.plan.decisive is not None and resolved.plan.decisive.xid == 79
    assert resolved.plan.summary == "XID 79 gpu3"
    steps = await old_store.steps_of("pc-00001")
    down = codec.decode_record(SlurmDownResult, steps["slurm_down"].result)
    assert down.slurm_nodes == ("gpu-node-01",) and down.owned == {"gpu-node-01": True}
    assert down.jobs is not None and [(j.job_id, j.name, j.user) for j in down.jobs] == [
        ("101", "llama-pretrain", "alice")
    ]
    assert down.taken_out_at is not None and down.action == "down"
    confirmed = codec.decode_record(ConfirmResumedResult, steps["confirm_resumed"].result)
    [job] = (o.verdict for o in confirmed.jobs)
    assert (job.job_id, job.status, job.new_nodes, job.restarts_now) == (
        "101",
        "resumed",
        ("gpu-node-02",),
        1,
    )

    rolled = await old_store.steps_of("pc-00003")
    # 0.1.0 kept only the report in the finished rollback record (the actor is in the audit log).
    report = codec.decode_record(RollbackRecord, rolled[ROLLBACK].result).report
    assert any("uncordoned" in line for line in report), report
    assert (await old_store.incident("pc-00003")).state is State.ROLLED_BACK  # type: ignore[union-attr]


async def test_an_interrupted_step_resumes_from_its_old_progress(old_store: SqliteStore) -> None:
    steps = await old_store.steps_of("pc-00006")
    assert steps["drain"].status == "running"
    drain = codec.decode_record(DrainResult, steps["drain"].result)
    assert drain.evicted == ("ml-train/moe-worker-0",) and drain.evicting == "ml-train/moe-worker-1"
    assert [i for i, state, _ in await old_store.active()] == ["pc-00005", "pc-00006"]


async def test_an_old_store_migrates_to_this_schema_and_prunes_to_the_policy(old_store: SqliteStore) -> None:
    """The 0.1.0 file, migrated to this release's schema (retention's indexes included), is
    pruned by the same rule as a new one: its four closed incidents go, the one awaiting approval
    and the one killed mid-drain stay, and the audit log of every one of them stays whole."""
    with sqlite3.connect(old_store.path) as db:
        assert db.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
        indexes = {r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type = 'index'")}
    assert {"incidents_closed", "outbox_incident"} <= indexes
    ids = [want["id"] for want in EXPECTED["incidents"]]
    timelines = {i: await old_store.events_of(i) for i in ids}
    assert all(timelines.values())

    pruned = await old_store.prune(datetime(2100, 1, 1, tzinfo=UTC))

    assert pruned.counts["incidents"] == 4
    assert [i for i in ids if await old_store.incident(i) is not None] == ["pc-00005", "pc-00006"]
    assert [await old_store.alerts_of(i) for i in ids[:4]] == [[], [], [], []]
    assert {i: await old_store.events_of(i) for i in ids} == timelines
