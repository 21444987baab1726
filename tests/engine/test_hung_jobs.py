"""The hung-job watch in the engine, in virtual time against the simulated Slurm and a fake Prometheus.

Cases: a RUNNING job whose progress stands still for ``engine.hung_job_after`` opens one incident with
exactly one notice naming the job, its node and its last progress, and nothing is done to any node;
later looks at the same stall add no second incident or notice; a job that keeps progressing, and a job
with no progress sample, are never called hung; progress moving again resolves the alert; a job on a
node with another open incident is left to that incident.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta
from pathlib import Path

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


def watching(h: EngineHarness) -> HungJobs:
    h.deps.ports.query = Prometheus(h)
    deps = replace(
        h.deps,
        settings=EngineSettings(poll_interval=timedelta(seconds=60), hung_job_after=timedelta(minutes=30)),
        steps=replace(h.deps.steps, resumption=ResumptionSettings(progress_query=QUERY)),
    )
    return HungJobs(deps, h.catalog, signal=h.engine.signal, wake=h.engine.wake)


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
        assert all(words in text for words in ("101", "llm-pretrain", "dana", "1200", "changes nothing"))
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
