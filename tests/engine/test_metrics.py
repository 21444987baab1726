"""The metrics the dashboards read, driven through the engine in virtual time.

Cases: an XID 79 replace-node incident exports its stage histograms, its GPU-hours lost
(node and job) equal to the figures recomputed by hand from its own timeline (clocked from the
first delivery), its retest,
and one ``pitcrew_incident_info`` series that follows its step and is gone at close; the
trust ledger counts a rollback, a rejection (with the approval wait) and a repeat of the
same fault class on a remediated node; far-side errors are counted by system and reason;
1,000 incidents opened and closed leave no per-incident series in ``/metrics``. An alert already
firing for 10 years at its first delivery is clocked from that delivery (its age reported apart,
the counters get minutes); one incident adds at most a day per node and per job to the GPU-hours
counters, and its summary shows each cut figure beside what was measured.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime, timedelta
from pathlib import Path
from typing import cast

import pytest
from prometheus_client import generate_latest

from bot.engine.errors import Reason
from bot.engine.metrics import IncidentLabels, Metrics
from bot.report import render_detail
from bot.store.base import Json
from bot.web.views import incident_detail
from tests.engine.harness import Answer, EngineHarness, Slow, Through, fleet, transient

NODE = "gpu-node-02"
JOB = {"job_id": "101", "name": "llm-pretrain", "user": "dana", "node": NODE}
LABELS = {"playbook": "replace-node", "fault_class": "gpu-lost"}


def _info(h: EngineHarness) -> list[dict[str, str]]:
    return [
        dict(sample.labels)
        for family in h.metrics.registry.collect()
        if family.name == "pitcrew_incident_info"
        for sample in family.samples
    ]


def _at(text: object) -> datetime:
    assert isinstance(text, str), text
    return datetime.fromisoformat(text)


async def test_xid79_exports_stages_goodput_retest_and_one_info_series(tmp_path: Path) -> None:
    async with EngineHarness(tmp_path, inventory=fleet(jobs=(JOB,))) as h:
        h.scheduler.script("down", Slow(30))  # the fault → out of service stage takes time
        for call in ("node", "successor"):  # the same node, or the node that replaced it
            h.cluster.always(
                call, Answer(lambda n: n if n is None or h.time.elapsed >= 900 else replace(n, ready=False))
            )
        incident = await h.alert(NODE)
        await h.run_until(lambda: h.cluster.calls["replace"] > 0)
        await h.time.advance(120)
        [row] = _info(h)
        assert row == {
            "incident": incident,
            "node": NODE,
            "playbook": "replace-node",
            "step": "wait_ready",
            "mode": "auto",
            "thread": "",  # no Slack here
        }
        assert (
            h.sample("pitcrew_incident_info", **row)
            == cast(datetime, (await h.incident(incident)).first_alert_at).timestamp()
        )
        assert h.sample("pitcrew_nodes_under_remediation") == 1
        done = await h.until_ended(incident)
        assert done.state.value == "resolved"
        assert _info(h) == []

        steps = await h.steps(incident)
        fault = done.opened_at  # the first delivery: the clock of every figure
        back = _at(steps["slurm_resume"].result["returned_at"])
        expected_node = 8 * (back - fault).total_seconds() / 3600  # the simulator's nodes list no Gres
        assert expected_node >= 8 * 900 / 3600  # the replacement is Ready at +900 s
        assert h.sample("pitcrew_gpu_hours_lost_total", **LABELS) == pytest.approx(expected_node, abs=1e-6)
        [job] = cast(list[Json], steps["confirm_resumed"].result["jobs"])
        assert isinstance(job, dict)
        running = _at(job["restarted_at"] or job["resumed_at"])
        expected_job = 8 * (running - fault).total_seconds() / 3600
        assert h.sample("pitcrew_job_gpu_hours_lost_total", **LABELS) == pytest.approx(expected_job, abs=1e-6)

        close = steps["close"].result["goodput"]
        assert isinstance(close, dict) and close["node_gpus"] == 8 and close["gpus_from"] == "config"
        [summary] = h.notices("summary", incident)
        assert f"GPU-hours lost: {expected_node:.2f} (8 GPUs x" in "\n".join(summary["lines"])
        assert any(line.startswith("job 101 training lost:") for line in summary["lines"])
        events = await h.store.events_of(incident)
        shown = render_detail(incident_detail(done, await h.store.alerts_of(incident), events, steps, None))
        assert f"cost:\n  GPU-hours lost: {expected_node:.2f} (8 GPUs x" in shown  # pitcrew incidents show
        [noted] = await h.events(incident, "goodput")
        assert noted.data["gpu_hours_lost"] == pytest.approx(expected_node, abs=1e-5)

        for stage in ("out_of_service", "node_back", "job_running", "recovery"):
            assert h.sample(f"pitcrew_time_to_{stage}_seconds_count", playbook="replace-node") == 1, stage
        down_at = min(_at(v) for v in steps["slurm_down"].result["down_at"].values())  # type: ignore[union-attr]
        assert h.sample(
            "pitcrew_time_to_out_of_service_seconds_sum", playbook="replace-node"
        ) == pytest.approx((down_at - fault).total_seconds())
        assert h.sample("pitcrew_trust_retests_total", outcome="passed", **LABELS) == 1
        assert h.sample("pitcrew_trust_retests_total", outcome="repeat", **LABELS) == 0
        await h.time.advance(120)  # the engine's next scan
        assert h.sample("pitcrew_nodes_under_remediation") == 0


async def test_the_same_fault_again_on_a_remediated_node_is_a_repeat(tmp_path: Path) -> None:
    async with EngineHarness(tmp_path) as h:
        first = await h.alert(NODE)
        assert (await h.until_ended(first)).state.value == "resolved"
        await h.time.advance(600)
        second = await h.alert(NODE)
        await h.until_ended(second)
        assert h.sample("pitcrew_trust_retests_total", outcome="repeat", **LABELS) == 1
        assert h.sample("pitcrew_trust_retests_total", outcome="passed", **LABELS) == 2


async def test_a_rollback_is_an_override(tmp_path: Path) -> None:
    async with EngineHarness(tmp_path) as h:
        incident = await h.alert(NODE)
        assert (await h.until_ended(incident)).state.value == "resolved"
        assert (await h.commands.rollback(incident, "alice")).ok
        assert h.sample("pitcrew_trust_overrides_total", action="rolled_back", **LABELS) == 1
        assert h.sample("pitcrew_trust_overrides_total", action="rejected", **LABELS) == 0


async def test_a_rejection_is_an_override_and_its_wait_is_observed(tmp_path: Path) -> None:
    async with EngineHarness(tmp_path, mode="approve") as h:
        incident = await h.alert(NODE)
        await h.until_state(incident, "awaiting_approval")
        await h.run_until(lambda: h.sample("pitcrew_approvals_waiting") == 1)
        await h.time.advance(90)
        assert (await h.commands.reject(incident, "alice")).ok
        assert (await h.until_ended(incident)).state.value == "suppressed"
        assert h.sample("pitcrew_trust_overrides_total", action="rejected", **LABELS) == 1
        assert h.sample("pitcrew_approval_wait_seconds_count", playbook="replace-node") == 1
        assert h.sample("pitcrew_approval_wait_seconds_sum", playbook="replace-node") >= 90
        await h.run_until(lambda: h.sample("pitcrew_approvals_waiting") == 0)


async def test_far_side_errors_are_counted_by_system_and_reason(tmp_path: Path) -> None:
    async with EngineHarness(tmp_path) as h:
        h.scheduler.script("down", *transient(2, Reason.UNAVAILABLE))
        h.cluster.script("cordon", *transient(1, Reason.CONFLICT))
        incident = await h.alert(NODE)
        assert (await h.until_ended(incident)).state.value == "resolved"
        assert h.sample("pitcrew_integration_errors_total", system="scheduler", reason="unavailable") == 2
        assert h.sample("pitcrew_integration_errors_total", system="cluster", reason="conflict") == 1
        assert h.sample("pitcrew_integration_errors_total", system="notifier", reason="unavailable") == 0


@pytest.mark.slow
async def test_a_thousand_incidents_leave_no_per_incident_series(tmp_path: Path) -> None:
    nodes = tuple(f"gpu-{n:03d}" for n in range(40))
    opened: list[str] = []
    hands_off = {"79": {"playbook": "notify-only"}}  # few steps: open, watch while firing, close
    async with EngineHarness(tmp_path, inventory=fleet(nodes), catalog=hands_off) as h:

        async def all_ended() -> bool:
            return not await h.store.active()

        for _ in range(25):  # 25 waves of 40 (the harness calls more in one virtual instant a livelock)
            wave = [await h.alert(node) for node in nodes]
            await h.run_until(lambda: len(_info(h)) == len(nodes), about=wave[0])
            assert {row["incident"] for row in _info(h)} == set(wave)  # one series per active incident
            for incident in wave:
                await h.resolve(incident)
            await h.run_until(all_ended, about=wave[0])
            opened += wave
        await h.time.advance(120)  # a scan after the last close
        exposition = generate_latest(h.metrics.registry).decode()
        assert len(set(opened)) == 1000 and h.sample("pitcrew_incidents_opened_total") == 1000
        assert "pitcrew_incident_info{" not in exposition
        assert not any(incident in exposition for incident in opened)


async def test_a_summary_the_notifier_refused_once_is_counted_once(tmp_path: Path) -> None:
    async with EngineHarness(tmp_path) as h:
        h.notifier.script(
            "post", Through(), *transient(1)
        )  # the incident notice, then the summary fails once
        incident = await h.alert(NODE)
        assert (await h.until_ended(incident)).state.value == "resolved"
        assert h.sample("pitcrew_steps_total", step="close", outcome="retried") == 1
        assert len(h.notices("summary", incident)) == 1
        assert h.sample("pitcrew_time_to_recovery_seconds_count", playbook="replace-node") == 1
        assert h.sample("pitcrew_trust_retests_total", outcome="passed", **LABELS) == 1
        [noted] = await h.events(incident, "goodput")
        assert h.sample("pitcrew_gpu_hours_lost_total", **LABELS) == pytest.approx(
            noted.data["gpu_hours_lost"], abs=1e-6
        )
        assert h.sample("pitcrew_integration_errors_total", system="notifier", reason="unavailable") == 1


def test_the_slack_thread_joins_the_incident_series_and_leaves_with_it() -> None:
    """``IncidentSeries.link`` (the Slack destination, once the thread is posted): the incident's
    one series carries ``thread`` from then on, whether the link came before or after it was
    shown; a step change keeps it; closing (or the engine's scan) takes both away."""
    metrics = Metrics(version="test")
    series, at = metrics.incidents, datetime(2026, 12, 1, 6, 0)

    def shown() -> list[dict[str, str]]:
        return [
            dict(s.labels)
            for family in metrics.registry.collect()
            if family.name == "pitcrew_incident_info"
            for s in family.samples
        ]

    series.show("pc-1", IncidentLabels(NODE, "replace-node", "cordon", "auto"), at)
    assert [s["thread"] for s in shown()] == [""]
    series.link("pc-1", "https://x.slack.com/archives/C1/p1")
    series.link("pc-1", "https://x.slack.com/archives/C1/p1")  # again after a restart: no change
    assert [(s["step"], s["thread"]) for s in shown()] == [("cordon", "https://x.slack.com/archives/C1/p1")]
    series.show("pc-1", IncidentLabels(NODE, "replace-node", "drain", "auto"), at)
    assert [(s["step"], s["thread"]) for s in shown()] == [("drain", "https://x.slack.com/archives/C1/p1")]

    series.link("pc-2", "https://x.slack.com/archives/C1/p2")  # posted before the engine showed it
    series.show("pc-2", IncidentLabels("gpu-node-03", "replace-node", "cordon", "auto"), at)
    assert {s["incident"]: s["thread"] for s in shown()}["pc-2"] == "https://x.slack.com/archives/C1/p2"

    series.link("pc-3", "https://x.slack.com/archives/C1/p3")  # closed before it was ever shown
    series.drop("pc-1")
    series.keep_only(["pc-2"])
    assert [s["incident"] for s in shown()] == ["pc-2"]
    assert len(series) == 1 and "pc-3" not in series
    series.drop("pc-2")
    assert shown() == []
    assert series._threads == {}  # nothing of a closed incident is kept


async def test_an_alert_firing_for_ten_years_is_clocked_from_its_first_delivery(tmp_path: Path) -> None:
    """pitcrew deployed while an alert has been firing for 10 years: every figure counts from the
    first delivery, the alert's own age is reported apart, and the counters get minutes, not years."""
    async with EngineHarness(tmp_path) as h:
        h.scheduler.script("down", Slow(30))  # out of service for a known while: minutes, never years
        incident = await h.alert(NODE, starts=h.time.now() - timedelta(days=3650))
        done = await h.until_ended(incident)
        assert done.state.value == "resolved"
        took = (done.updated_at - done.opened_at).total_seconds()
        assert took < 3600
        [summary] = h.notices("summary", incident)
        assert "3650d" not in summary["title"], summary["title"]
        close = (await h.steps(incident))["close"].result
        lost = h.sample("pitcrew_gpu_hours_lost_total", **LABELS)
        assert 8 * 30 / 3600 <= lost <= 8 * took / 3600, (took, close)
        assert close["alert_age_seconds"] == pytest.approx(3650 * 86400, abs=1)
        assert close["time_to_recovery_seconds"] == pytest.approx(took, abs=1)
        assert (
            "the alert had been firing for 3650d before pitcrew's first delivery of it; the times above start "
            "at that delivery" in summary["lines"]
        )
        assert h.sample("pitcrew_time_to_recovery_seconds_sum", playbook="replace-node") <= took
        assert h.sample("pitcrew_time_to_node_back_seconds_sum", playbook="replace-node") <= took


async def test_one_incident_adds_at_most_a_day_to_the_counters(tmp_path: Path) -> None:
    """Two days from the first delivery to the node back and the job running again (an approval
    that took two days): the counters get one day for each (goodput.max_hours_per_incident), and
    the summary says so, job line included."""
    async with EngineHarness(
        tmp_path, mode="approve", approvals={"timeout": timedelta(days=3)}, inventory=fleet(jobs=(JOB,))
    ) as h:
        incident = await h.alert(NODE)
        await h.until_state(incident, "awaiting_approval")
        await h.time.advance(2 * 86400)
        assert (await h.commands.approve(incident, "alice")).ok
        done = await h.until_ended(incident)
        assert done.state.value == "resolved"
        assert h.sample("pitcrew_gpu_hours_lost_total", **LABELS) == pytest.approx(8 * 24, abs=1e-6)
        assert h.sample("pitcrew_job_gpu_hours_lost_total", **LABELS) == pytest.approx(8 * 24, abs=1e-6)
        [summary] = h.notices("summary", incident)
        [cut] = [
            line for line in summary["lines"] if line.startswith("counted up to 1d per node and per job")
        ]
        assert "out of service, job 101 2d" in cut, cut
        [job] = [line for line in summary["lines"] if line.startswith("job 101 training lost:")]
        assert job.startswith("job 101 training lost: 192.00 GPU-hours (8 GPUs x 1d counted of 2d"), job
