"""Which Slurm nodes the Slurm watch turns into alerts, and how (``bot.domain.slurm_watch``).

Cases (table): DOWN, DRAIN (idle or with jobs), FAIL with someone else's reason are outages - an
NHC reason, ``Not responding``, ``Kill task failed``, a prolog error; pitcrew's own reason and the
Slinky operator's copy of it are not; a node in service, or out without a reason, is not. An
outage's identity is stable across polls (the node and when Slurm set the reason) and changes with
a new reason; its words carry Slurm's reason and who set it; it names the jobs the watch saw on
the node before it went out with their restart counts (none: no annotation), and reading them back
skips what is not ``<job id>@<restarts>``.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from bot.config import load_catalog
from bot.domain.faults import classify
from bot.domain.jobs import JobSnapshot, SlurmNodeState
from bot.domain.labels import Subject
from bot.domain.slurm_watch import SEEN_JOBS, SLURM_FAULT, out_by_others, outage, seen_jobs

NOW = datetime(2026, 12, 1, 22, 0, tzinfo=UTC)
SET = NOW - timedelta(minutes=3)


def node(*states: str, reason: str = "", user: str | None = "root") -> SlurmNodeState:
    return SlurmNodeState("gpu-002", frozenset(states), reason, user, SET if reason else None)


@pytest.mark.parametrize(
    ("state", "out"),
    [
        (node("IDLE", "DRAIN", reason="NHC: check_fs_mount: /scratch not mounted"), True),
        (node("MIXED", "DRAIN", reason="NHC: check_hw_ib: mlx5_0 port 1 not ACTIVE"), True),
        (node("DOWN", "NOT_RESPONDING", reason="Not responding", user="slurm"), True),
        (node("DOWN", reason="Kill task failed", user="slurm"), True),
        (node("IDLE", "DRAIN", reason="Prolog error", user="slurm"), True),
        (node("IDLE", "FAIL", reason="bad DIMM, ticket 4711"), True),
        (node("DOWN", reason="pitcrew: pc-00042 XID 79 gpu3"), False),
        (node("IDLE", "DRAIN", reason="slurm-operator: pitcrew: pc-00042 XID 79 gpu3"), False),
        (node("IDLE"), False),
        (node("ALLOCATED", reason="stale reason on a node in service"), False),
        (node("DOWN"), False),
    ],
)
def test_which_nodes_are_out_by_others(state: SlurmNodeState, out: bool) -> None:
    assert out_by_others(state) is out


def test_an_outage_keeps_its_identity_across_polls_and_changes_with_its_reason() -> None:
    drained = node("IDLE", "DRAIN", reason="NHC: check_fs_mount: /scratch not mounted")
    first, again = outage(drained, NOW), outage(drained, NOW + timedelta(seconds=2))
    assert (first.fingerprint, first.starts_at) == (again.fingerprint, again.starts_at)
    assert first.starts_at == SET
    other = SlurmNodeState("gpu-002", drained.states, "NHC: check_hw_gpu", "root", SET + timedelta(seconds=5))
    assert outage(other, NOW).fingerprint != first.fingerprint
    assert first.labels["node"] == "gpu-002" and first.labels["fault"] == SLURM_FAULT
    assert first.labels["slurm_state"] == "DRAIN"
    assert "NHC: check_fs_mount: /scratch not mounted" in first.annotations["description"]
    assert "by root" in first.annotations["description"]


def test_the_catalog_follows_slurm_and_the_fault_carries_slurms_reason() -> None:
    message = outage(node("DOWN", reason="Kill task failed", user="slurm"), NOW).annotations["description"]
    subject = Subject("gpu-002", None, None, None, None, None, SLURM_FAULT, message)
    fault = classify(subject, load_catalog())
    assert fault is not None
    assert (fault.playbook, fault.job_fatal, fault.fault_class) == ("follow-slurm", False, "scheduler")
    assert "Kill task failed" in fault.detail


def test_an_outage_names_the_jobs_seen_on_the_node_before_it_went_out() -> None:
    down = node("DOWN", reason="NHC: check_hw_gpu: GPU 3 missing")
    seen = (
        JobSnapshot("4711", "train", "dana", "RUNNING", ("gpu-002",), 2),
        JobSnapshot("4712_3", "sweep", "eve", "RUNNING", ("gpu-002",), 0),
    )
    named = outage(down, NOW, seen)
    assert named.annotations[SEEN_JOBS] == "4711@2 4712_3@0"
    assert seen_jobs(named.annotations) == {"4711": 2, "4712_3": 0}
    assert named.fingerprint == outage(down, NOW).fingerprint  # the jobs are words, not identity
    assert SEEN_JOBS not in outage(down, NOW).annotations and seen_jobs({}) == {}
    assert seen_jobs({SEEN_JOBS: "4711@2 junk @3 4713@x 4714@1"}) == {"4711": 2, "4714": 1}
