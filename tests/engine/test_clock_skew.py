"""An alert's startsAt against pitcrew's clock, through intake and the engine, in virtual time.

Cases: an alert that says it started more than 10 minutes from now (a sender's clock far
ahead, the year 9999) is refused at intake and leaves nothing in the store; one a few minutes
ahead (within the skew intake allows) runs its playbook to the end, and every duration — the
summary, the job-running notice, the time-to-recovery, job-running and node-back histograms —
is measured from the first delivery (pitcrew's own clock), so never negative; the alert's age
reads 0.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from bot.domain.alerts import MAX_CLOCK_SKEW, AlertRejected
from tests.engine.harness import EngineHarness, fleet
from tests.harness.scenarios import delivery

NODE = "gpu-node-02"
JOB = {"job_id": "101", "name": "llm-pretrain", "user": "dana", "node": NODE}


@pytest.mark.parametrize(
    "starts",
    [MAX_CLOCK_SKEW + timedelta(seconds=1), datetime(9999, 1, 1, tzinfo=UTC)],
    ids=["skew-plus-1s", "year-9999"],
)
async def test_a_start_beyond_the_skew_is_refused_and_stores_nothing(
    tmp_path: Path, starts: timedelta | datetime
) -> None:
    async with EngineHarness(tmp_path, mode="auto") as h:
        at = h.time.now() + starts if isinstance(starts, timedelta) else starts
        with pytest.raises(AlertRejected, match=r"startsAt .* is more than 10m ahead of pitcrew's clock"):
            await h.deliver(delivery(node=NODE, starts=at))
        assert await h.store.incidents(limit=10) == []
        assert h.calls() == {}


async def test_a_start_within_the_skew_never_gives_a_negative_duration(tmp_path: Path) -> None:
    async with EngineHarness(tmp_path, mode="auto", inventory=fleet(jobs=(JOB,))) as h:
        ahead = MAX_CLOCK_SKEW - timedelta(seconds=1)
        incident = await h.alert(NODE, starts=h.time.now() + ahead)
        done = await h.until_ended(incident)
        assert done.state.value == "resolved"
        assert h.time.elapsed < ahead.total_seconds()  # the whole playbook ran "before" the alert began
        # Every duration is measured from the first delivery, not from the startsAt ahead of it:
        # the incident's own short time, never negative, never zero for want of a start.
        took = h.time.elapsed
        [summary] = h.notices("summary", incident)
        assert summary["title"].startswith(f"{NODE}: replace-node finished in ")
        assert "in -" not in summary["title"]
        [running] = h.notices("job_running", incident)
        assert running["title"].startswith(f"{NODE}: training running again after ")
        assert "after -" not in running["title"]
        for histogram in (
            "pitcrew_time_to_recovery_seconds",
            "pitcrew_time_to_job_running_seconds",
            "pitcrew_time_to_node_back_seconds",
        ):
            assert h.sample(f"{histogram}_count", playbook="replace-node") == 1, histogram
            assert 0.0 <= h.sample(f"{histogram}_sum", playbook="replace-node") <= took, histogram
        close = (await h.steps(incident))["close"].result
        assert close["alert_age_seconds"] == 0.0  # an alert from the future has no age
