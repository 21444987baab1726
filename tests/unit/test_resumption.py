"""The proof that a job resumed (``judge_resumption``), hostlists, and pitcrew's reasons.

Cases: resumed only when RUNNING on no faulty node with a higher restart count (and, when
required, progress past the pre-fault value and past the first sample after the restart);
waiting while pending, still on the faulty
node, the interrupted run of a multi-node job still completing on its other nodes, restarts unchanged or progress not yet past; lost when Slurm forgot the job or it ended
NODE_FAIL/FAILED/CANCELLED; finished when it completed without a restart, resumed when it
completed after one. Hostlists: ranges, padding, lists, suffixes, empty. Reasons: prefix,
one line, bounded, ownership. A job's outcome holds its verdict and is stored flat.
"""

from __future__ import annotations

from dataclasses import fields
from datetime import UTC, datetime, timedelta
from typing import cast

import pytest

from bot.domain.jobs import JobSnapshot, ResumeVerdict, expand_hostlist, judge_resumption
from bot.domain.ownership import REASON_MAX_LEN, clean_reason, is_pitcrew_reason, slurm_reason
from bot.engine.steps.resumed import ConfirmResumedResult, JobOutcome
from bot.store import codec
from bot.store.base import Json

BEFORE = JobSnapshot("42", "train", "alice", "RUNNING", ("gpu-001",), restarts=0)


def now(state: str, nodes: tuple[str, ...] = ("gpu-002",), restarts: int = 1) -> JobSnapshot:
    return JobSnapshot("42", "train", "alice", state, nodes, restarts=restarts)


@pytest.mark.parametrize(
    ("current", "progress", "status"),
    [
        (now("RUNNING"), None, "resumed"),
        (now("RUNNING", ("gpu-002", "gpu-003")), None, "resumed"),
        (now("PENDING", ()), None, "waiting"),
        (now("REQUEUED", ()), None, "waiting"),
        (now("RUNNING", ("gpu-001",)), None, "waiting"),  # still on the faulty node
        # A two-node job just after DOWN: Slurm dropped the faulty node from its NodeList and
        # counted the restart, while the interrupted run still ends on the other node.
        (now("COMPLETING", ("gpu-002",)), None, "waiting"),
        (now("RUNNING", restarts=0), None, "waiting"),  # never restarted: not our proof
        (now("RUNNING"), (10.0, None), "waiting"),  # progress required, no sample yet
        (now("RUNNING"), (10.0, 10.0), "waiting"),  # back at the checkpoint, not past it
        (now("RUNNING"), (10.0, 11.0), "resumed"),
        (now("RUNNING"), (None, 3.0), "resumed"),  # no pre-fault sample: any sample counts
        (None, None, "lost"),
        (now("NODE_FAIL", ("gpu-001",), 0), None, "lost"),  # --no-requeue: report, do not wait
        (now("FAILED"), None, "lost"),
        (now("CANCELLED"), None, "lost"),
        (now("COMPLETED", ("gpu-001",), 0), None, "finished"),
        (now("COMPLETED"), None, "resumed"),  # requeued, ran elsewhere, already done
    ],
)
def test_judge_resumption(
    current: JobSnapshot | None, progress: tuple[float | None, float | None] | None, status: str
) -> None:
    if progress is None:
        verdict = judge_resumption(BEFORE, current, ["gpu-001"])
    else:
        before, after = progress
        verdict = judge_resumption(
            BEFORE, current, ["gpu-001"], progress_before=before, progress_now=after, progress_required=True
        )
    assert verdict.status == status, verdict.detail
    assert verdict.job_id == "42"
    assert verdict.old_nodes == ("gpu-001",)


def test_verdict_records_where_and_how_often() -> None:
    verdict = judge_resumption(BEFORE, now("RUNNING", ("gpu-003",), 1), ["gpu-001"])
    assert (verdict.old_nodes, verdict.new_nodes) == (("gpu-001",), ("gpu-003",))
    assert (verdict.restarts_before, verdict.restarts_now) == (0, 1)


@pytest.mark.parametrize(
    ("spec", "names"),
    [
        ("gpu-001", ("gpu-001",)),
        ("gpu-[001-003]", ("gpu-001", "gpu-002", "gpu-003")),
        ("gpu-[001-002,007],cpu-1", ("gpu-001", "gpu-002", "gpu-007", "cpu-1")),
        ("n[8-10]", ("n8", "n9", "n10")),
        ("rack[1-2]-gpu", ("rack1-gpu", "rack2-gpu")),
        ("", ()),
        ("(null)", ()),
        ("  ", ()),
    ],
)
def test_expand_hostlist(spec: str, names: tuple[str, ...]) -> None:
    assert expand_hostlist(spec) == names


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("pitcrew: inc-1 XID 79 gpu3", "pitcrew: inc-1 XID 79 gpu3"),
        ("pitcrew: inc-1\nXID 79\t gpu3\x00", "pitcrew: inc-1 XID 79 gpu3"),
        ("  spaced   out  ", "spaced out"),
    ],
)
def test_clean_reason(text: str, expected: str) -> None:
    assert clean_reason(text) == expected


def test_pitcrew_reason_is_ours_and_bounded() -> None:
    reason = slurm_reason("inc-1", "XID 79 " + "x" * 500)
    assert reason.startswith("pitcrew: inc-1 XID 79 ")
    assert len(reason) <= REASON_MAX_LEN
    assert is_pitcrew_reason(reason)
    assert not is_pitcrew_reason("XID 79 by alice")
    assert not is_pitcrew_reason("slurm-operator: " + reason)


def test_a_job_outcome_is_stored_flat_and_reads_back_the_same() -> None:
    # The outcome holds the verdict; the stored record (and the read API) keeps one flat object
    # per job, as release 0.1.0 wrote it.
    verdict = judge_resumption(BEFORE, now("RUNNING"), ["gpu-001"], progress_before=3.0, progress_now=5.0)
    down = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
    outcome = JobOutcome(
        verdict, down_at=down, resumed_at=down + timedelta(seconds=9), seconds_to_resumed=9.0
    )
    record = ConfirmResumedResult(jobs=(outcome,), last=(outcome,))  # final and latest: two uses of the type
    stored = codec.encode_record(record)
    for key in ("jobs", "last"):
        [job] = cast(list[Json], stored[key])
        assert isinstance(job, dict)
        assert {f.name for f in fields(ResumeVerdict)} | {
            "down_at",
            "resumed_at",
            "seconds_to_resumed",
        } <= set(job), key
        assert (job["job_id"], job["status"], job["new_nodes"], job["progress_before"]) == (
            "42",
            "resumed",
            ["gpu-002"],
            3.0,
        )
        assert "verdict" not in job
    assert codec.decode_record(ConfirmResumedResult, stored) == record


def test_progress_must_pass_the_first_sample_after_the_restart_too() -> None:
    # That sample may still be the pre-fault run's last one, scraped after the value read before DOWN.
    def judge(at_now: float) -> str:
        return judge_resumption(
            BEFORE,
            now("RUNNING"),
            ["gpu-001"],
            progress_before=3.0,
            progress_at_restart=6.0,
            progress_now=at_now,
            progress_required=True,
        ).status

    assert (judge(5.0), judge(6.0), judge(7.0)) == ("waiting", "waiting", "resumed")
