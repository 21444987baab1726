"""The hung-job watch in the engine, in virtual time against the simulated Slurm and a fake Prometheus.

Cases: a RUNNING job whose progress stands still for ``engine.hung_job_after`` opens one incident with
exactly one notice naming the job, its node and its last progress, and nothing is done to any node;
later looks at the same stall add no second incident or notice; a job that keeps progressing, and a job
with no progress sample, are never called hung; progress moving again resolves the alert; a job on a
node with another open incident is left to that incident; a restart half-way through a stall keeps
its clock (the progress is kept in the store), so the notice comes when it would have.

A site that opts into ``requeue-hung-job`` (``catalog.overrides: {job-hung: {playbook: ...}}``): the
hung job, and only it, is requeued once, audited and counted, with no call touching a node; the
restarted run's progress moving past where it stood is the proof, and the incident resolves. In
observe mode nothing is requeued; in approve mode nothing until a human approves; while paused
the incident is suppressed and nothing is requeued. A hung job Slurm will not requeue (submitted
``--no-requeue``, or an srun job) is not asked for: the incident goes to a human saying why.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta
from pathlib import Path
from typing import Any, cast

import pytest

from bot.config_sections import EngineSettings, ResumptionSettings
from bot.engine.hung_jobs import HungJobs
from tests.engine.harness import EngineHarness, fleet
from tests.harness.scenarios import gpu_node

QUERY = 'max(train_step{slurm_job_id="{job_id}"})'

JOBS = (
    {"job_id": "101", "name": "llm-pretrain", "user": "dana", "node": "gpu-node-02"},
    {"job_id": "102", "name": "vision", "user": "eve", "node": "gpu-node-03"},
    {"job_id": "103", "name": "no-metrics", "user": "fay", "node": "gpu-node-04"},
)
# Real Slurm shows a node with a running job ALLOCATED (or MIXED); the simulator leaves that to the inventory.
INVENTORY = fleet(
    extra={
        name: gpu_node(f"ml-train/{name}-worker", slurm_state="ALLOCATED")
        for name in ("gpu-node-02", "gpu-node-03", "gpu-node-04")
    },
    jobs=JOBS,
)


class Prometheus:
    """train_step per job: 101 stuck at 1200 until ``unstick``, 102 one step a second, 103 no series."""

    def __init__(self, h: EngineHarness) -> None:
        self.h, self.unstick, self.asked = h, float("inf"), 0

    async def instant(self, promql: str) -> list[tuple[dict[str, str], float]]:
        self.asked += 1
        t = self.h.time.elapsed
        if '"101"' in promql:
            return [({}, 1200.0 if t < self.unstick else 1200.0 + t)]
        if '"102"' in promql:
            return [({}, t)]
        return []


class Requeued(Prometheus):
    """101 stuck at 1200 while its first run lasts; its restarted run resumes from the checkpoint at
    1000 and trains a step a second from its first sample."""

    def __init__(self, h: EngineHarness) -> None:
        super().__init__(h)
        self.restarted_at: float | None = None

    async def instant(self, promql: str) -> list[tuple[dict[str, str], float]]:
        _, jobs = self.h.world.state()
        if '"101"' in promql and jobs["101"].restarts > 0:
            self.asked += 1
            if self.restarted_at is None:
                self.restarted_at = self.h.time.elapsed
            return [({}, 1000.0 + self.h.time.elapsed - self.restarted_at)]
        return await super().instant(promql)


def watching(h: EngineHarness, query: Prometheus | None = None) -> HungJobs:
    h.deps.ports.query = query or Prometheus(h)
    deps = replace(
        h.deps,
        settings=EngineSettings(poll_interval=timedelta(seconds=60), hung_job_after=timedelta(minutes=30)),
        steps=replace(h.deps.steps, resumption=ResumptionSettings(progress_query=QUERY)),
    )
    return HungJobs(deps, h.catalog, look_again=h.engine.look_again, opened=h.engine.opened)


async def look(h: EngineHarness, watch: HungJobs, minutes: int) -> None:
    for _ in range(minutes):
        await watch.poll()
        await h.time.advance(60)


async def test_a_stalled_job_gets_one_notice_and_nothing_else(tmp_path: Path) -> None:
    async with EngineHarness(tmp_path, inventory=INVENTORY) as h:
        watch = watching(h)
        await look(h, watch, 29)
        assert not await h.store.active()  # 28 minutes flat: not yet
        await look(h, watch, 40)
        [(incident_id, _, _)] = await h.store.active()
        incident = await h.incident(incident_id)
        assert incident.node == "gpu-node-02" and incident.plan is not None
        assert incident.plan.playbook == "notify-only"
        [notice] = h.notices("incident", incident_id)
        text = " ".join(notice["lines"])
        assert all(
            words in text for words in ("101", "llm-pretrain", "dana", "1200", "no other alert on its nodes")
        )
        assert not h.calls()  # no node touched, by anyone
        [alert] = await h.store.alerts_of(incident_id)
        assert alert.alertname == "SlurmJobHung" and alert.deliveries > 1  # looked again: the same alert

        assert isinstance(h.deps.ports.query, Prometheus)
        # 69 minutes of scans, a look every 5 (a sixth of 30): 14 looks of 3 jobs, not 69.
        assert h.deps.ports.query.asked == 3 * 14
        h.deps.ports.query.unstick = h.time.elapsed
        await look(h, watch, 6)  # the next look (every 5 minutes: a sixth of the 30)
        [resolved] = await h.store.alerts_of(incident_id)
        assert resolved.status == "resolved"
        assert len(h.notices("incident")) == 1


async def test_a_node_with_another_incident_is_left_to_it(tmp_path: Path) -> None:
    async with EngineHarness(tmp_path, inventory=INVENTORY, catalog={"79": {"playbook": "notify-only"}}) as h:
        other = await h.alert("gpu-node-02")
        watch = watching(h)
        await look(h, watch, 45)
        assert [i for i, _, _ in await h.store.active()] == [other]
        assert all(a.alertname != "SlurmJobHung" for a in await h.store.alerts_of(other))


REQUEUE = {"job-hung": {"playbook": "requeue-hung-job"}}


def opted_in(tmp_path: Path, mode: str = "auto", inventory: dict[str, Any] | None = None) -> EngineHarness:
    """The steps read the job's progress through the same query as the watch."""
    return EngineHarness(
        tmp_path,
        mode=mode,
        inventory=inventory or INVENTORY,
        catalog=REQUEUE,
        resumption={"progress_query": QUERY},
    )


@pytest.mark.parametrize(
    ("flags", "why"),
    [({"requeue": False}, "--no-requeue"), ({"batch": False}, "not a batch job")],
    ids=["no-requeue", "srun"],
)
async def test_a_hung_job_slurm_will_not_requeue_goes_to_a_human(
    tmp_path: Path, flags: dict[str, Any], why: str
) -> None:
    inventory = {**INVENTORY, "jobs": [{**JOBS[0], **flags}, *JOBS[1:]]}
    async with opted_in(tmp_path, inventory=inventory) as h:
        watch = watching(h)
        await look(h, watch, 40)
        [notice] = h.notices("incident")
        incident_id = notice["incident_id"]
        await h.until_ended(incident_id)
        assert (await h.incident(incident_id)).state.value == "failed"
        assert not h.calls()  # neither the job nor its node touched
        [escalation] = h.notices("escalation", incident_id)
        text = escalation["title"] + " " + " ".join(escalation["lines"])
        assert "101" in text and why in text and "does not end it" in text, text


async def test_an_opted_in_site_requeues_exactly_the_hung_job(tmp_path: Path) -> None:
    async with opted_in(tmp_path) as h:
        watch = watching(h, Requeued(h))
        await look(h, watch, 29)
        assert not h.notices("incident")
        await look(h, watch, 10)
        [notice] = h.notices("incident")
        incident_id = notice["incident_id"]
        incident = await h.incident(incident_id)
        assert incident.plan is not None and incident.plan.playbook == "requeue-hung-job"

        async def confirmed() -> bool:
            await watch.poll()
            return (await h.incident(incident_id)).state.terminal

        await h.run_until(confirmed, 3600, about=incident_id)
        assert (await h.incident(incident_id)).state.value == "resolved"
        assert h.calls() == {("requeue", "101"): 1}  # the job, once; no node touched
        [action] = await h.events(incident_id, "action")
        assert "job 101" in action.detail and "gpu-node-02 left as they are" in action.detail
        assert h.sample("pitcrew_actions_total", action="slurm_requeue") == 1
        steps = await h.steps(incident_id)
        [outcome] = cast(list[dict[str, Any]], steps["confirm_requeued"].result["jobs"])
        assert (outcome["status"], outcome["restarts_before"], outcome["restarts_now"]) == ("resumed", 0, 1)
        assert outcome["progress_before"] == 1200 and outcome["progress_now"] > 1200
        assert h.notices("job_running", incident_id)


async def test_observe_mode_requeues_nothing(tmp_path: Path) -> None:
    async with opted_in(tmp_path, "observe") as h:
        watch = watching(h, Requeued(h))
        await look(h, watch, 90)
        [(incident_id, _, _)] = await h.store.active()
        assert not h.calls()
        would = [e.detail for e in await h.events(incident_id) if e.step == "requeue_job"]
        assert any("requeue the hung job" in d for d in would), would


async def test_approve_mode_requeues_only_once_approved(tmp_path: Path) -> None:
    async with opted_in(tmp_path, "approve") as h:
        watch = watching(h, Requeued(h))
        await look(h, watch, 40)
        [notice] = h.notices("incident")
        incident_id = notice["incident_id"]
        assert (await h.incident(incident_id)).state.value == "awaiting_approval"
        assert not h.calls()
        assert (await h.commands.approve(incident_id, "alice")).ok
        await h.until_call("requeue", "101")
        await look(h, watch, 30)
        assert h.calls() == {("requeue", "101"): 1}


async def test_while_paused_nothing_is_requeued(tmp_path: Path) -> None:
    async with opted_in(tmp_path) as h:
        await h.commands.pause("oncall", "maintenance")
        watch = watching(h, Requeued(h))
        await look(h, watch, 60)
        [suppressed] = h.notices("suppressed")
        assert "paused by oncall" in suppressed["lines"][0]
        assert (await h.incident(suppressed["incident_id"])).state.value == "suppressed"
        assert not h.calls()


async def test_the_notice_names_the_other_alerts_its_node_had_lately(tmp_path: Path) -> None:
    """An XID on the job's node, resolved before the stall counts (its incident over), is named with
    when it fired; one on another node, and one older than the hour, are not."""
    catalog = {"79": {"playbook": "notify-only"}}
    async with EngineHarness(tmp_path, inventory=INVENTORY, catalog=catalog) as h:
        old = await h.alert("gpu-node-02")
        before = h.time.now()
        await h.resolve(old)
        await h.time.advance(65 * 60)
        recent = await h.alert("gpu-node-02")
        elsewhere = await h.alert("gpu-node-04")
        at = h.time.now()
        await h.resolve(recent)
        await h.resolve(elsewhere)
        await h.until_ended(recent)
        watch = watching(h)
        await look(h, watch, 40)
        [notice] = [n for n in h.notices("incident") if n["incident_id"] not in {old, recent, elsewhere}]
        text = " ".join(notice["lines"])
        words = f"other alerts on its nodes (last 1h): GpuXidCritical (xid79@gpu3) on gpu-node-02 at {at:%H:%M} UTC"
        assert words in text, text
        # The fixture's three rules, of the recent XID only: not the other node's, nor the one past the hour.
        assert text.count("on gpu-node-02 at") == 3 and f"{before:%H:%M} UTC" not in text
        assert "gpu-node-04" not in text and " and more" not in text


async def test_a_restart_keeps_the_clock_of_a_stall(tmp_path: Path) -> None:
    async with EngineHarness(tmp_path, inventory=INVENTORY) as h:
        began = h.time.now()
        await look(h, watching(h), 20)  # looks at minutes 0, 5, 10 and 15
        assert not await h.store.active()
        restarted = watching(h)  # a new process's watch, on the same store
        await look(h, restarted, 11)  # looks at 20, 25 and 30: flat for 30 minutes since minute 0
        [(incident_id, _, _)] = await h.store.active()
        [alert] = await h.store.alerts_of(incident_id)
        assert alert.starts_at == began  # the stall as first seen, not since the restart
        assert "(30m)" in alert.annotations["description"]
