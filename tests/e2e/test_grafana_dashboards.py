"""Both dashboards against a real Prometheus while an XID 79 incident runs on the real Slurm cluster.

A real Prometheus scrapes, every second, the dcgm-exporter stand-in (one target per Slurm node,
``node`` relabelled as Kubernetes SD would), the training job's progress and pitcrew's own
``/metrics``. pitcrew (subprocess, mode auto) remediates an XID 79 on the node the checkpointing
job runs on, while the stand-in reports that XID. The test shows:

* while the incident runs, ``pitcrew_incident_info`` has exactly its one series;
* afterwards, every query of every panel of both dashboards parses and returns data over the
  run (Grafana's ``$__range`` and ``$__rate_interval`` set as Grafana would);
* the GPU-hours lost, as exported and as the dashboard's headline stat computes it, match the
  figure computed by hand from the incident's own timeline (the node's 8 GPUs from Slurm's Gres
  x fault → back in service), within one scrape interval's worth; the job's training loss too;
* the spares panels read real series: one spare (8 GPUs) waits in a Slurm reservation the whole
  run, and pitcrew's reads of the pool count the GPU-hours it was held idle.
"""

from __future__ import annotations

import time
import urllib.parse
from collections.abc import Iterator
from typing import Any

import pytest

from proving_ground.assets import COLLECTORS_CSV
from proving_ground.dcgm import Standin, load_collectors
from proving_ground.prometheus import Prometheus, http_json
from proving_ground.slurm import SlurmCluster
from proving_ground.train_job import METRIC, ProgressServer
from tests.e2e.slurm_engine import epoch, open_incident, start_pitcrew, training_on_a_node
from tests.grafana.dashboards import concrete, dashboards, queries
from tests.harness.proc import require_binary
from tests.harness.scenarios import delivery, step_result

pytestmark = pytest.mark.slow
SCRAPE = 1.0  # seconds
QUERY = f'max({METRIC}{{job_id="{{job_id}}"}})'


@pytest.fixture
def exporters(slurm: SlurmCluster) -> Iterator[tuple[Standin, ProgressServer]]:
    collectors, fields = load_collectors(COLLECTORS_CSV)
    standin = Standin(slurm.nodes, collectors=collectors, fields=fields).start()
    progress = ProgressServer(slurm.job_dir).start()
    try:
        yield standin, progress
    finally:
        progress.stop()
        standin.stop()


def _prometheus_config(
    standin: Standin, progress: ProgressServer, pitcrew: str, read_token: str
) -> dict[str, Any]:
    return {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "scrape_configs": [
            {
                "job_name": "dcgm-exporter",
                "static_configs": [
                    {"targets": [standin.address(node)], "labels": {"__meta_kubernetes_pod_node_name": node}}
                    for node in standin.nodes
                ],
                "relabel_configs": [
                    {"source_labels": ["__meta_kubernetes_pod_node_name"], "target_label": "node"}
                ],
            },
            {"job_name": "train", "static_configs": [{"targets": [progress.url.split("/")[2]]}]},
            {
                "job_name": "pitcrew",
                "static_configs": [{"targets": [pitcrew.split("/")[2]]}],
                # The per-incident series (the incidents table) are scraped with the read token only.
                "authorization": {"credentials": read_token},
            },
        ],
    }


def _range(prometheus: Prometheus, expr: str, start: float, end: float) -> dict[str, Any]:
    params = urllib.parse.urlencode({"query": expr, "start": start, "end": end, "step": "1s"})
    try:
        reply: dict[str, Any] = http_json(f"{prometheus.url}/api/v1/query_range?{params}")
    except Exception as exc:  # an HTTP 400 carries Prometheus's parse error
        body = getattr(exc, "read", lambda: b"")()
        raise AssertionError(f"{expr}: {exc} {body[:300]!r}") from exc
    return reply


def _instant(prometheus: Prometheus, expr: str) -> float:
    [sample] = prometheus.query(expr)
    return float(sample["value"][1])


def _maybe(prometheus: Prometheus, expr: str) -> float | None:
    """``_instant``, or ``None`` while the query has no sample."""
    found = prometheus.query(expr)
    return float(found[0]["value"][1]) if len(found) == 1 else None


def test_every_panel_returns_data_and_gpu_hours_match_the_timeline(
    slurm: SlurmCluster,
    pitcrew_factory: Any,
    exporters: tuple[Standin, ProgressServer],
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    standin, progress = exporters
    binary = require_binary("prometheus", "prometheus")
    settings: dict[str, Any] = {
        "resumption": {"progress_query": QUERY, "prometheus_url": "", "require_progress": False},
        "goodput": {"progress_unit_seconds": 1.0},  # the stand-in job does one step a second
        # One spare held apart in a reservation: the job restarts on the third node by itself, and
        # the pool's reads give the spares panels their series.
        "capacity": {
            "pools": [{"name": "spares", "kind": "spare", "reservation": "spares"}],
            "read_every": "1s",
        },
    }
    began = time.time()
    prometheus = Prometheus(binary, tmp_path_factory.mktemp("prometheus-grafana"), {"global": {}})
    settings["resumption"]["prometheus_url"] = prometheus.url
    server = start_pitcrew(pitcrew_factory, slurm, "grafana", **settings)
    prometheus.write_config(_prometheus_config(standin, progress, server.url, server.read_token))
    try:
        spare = slurm.nodes[-1]
        slurm.run(
            "scontrol",
            "create",
            "reservation",
            "ReservationName=spares",
            f"Nodes={spare}",
            "StartTime=now",
            "Duration=infinite",
            "Users=root",
            "Flags=MAINT,IGNORE_JOBS",
        )
        prometheus.start()
        prometheus.wait(
            lambda: (
                {s["metric"]["job"] for s in prometheus.query("up == 1")}
                >= {"dcgm-exporter", "train", "pitcrew"}
            ),
            timeout=60,
            what="dcgm-exporter, the training job and pitcrew scraped",
        )
        job_id, node = training_on_a_node(slurm)
        prometheus.wait(
            lambda: any(
                float(s["value"][1]) >= 1 for s in prometheus.query(QUERY.replace("{job_id}", job_id))
            ),
            timeout=60,
            what=f"a progress sample of job {job_id}",
        )
        standin.node(node).inject("xid", gpu=3, xid=79)
        prometheus.wait(
            lambda: bool(prometheus.query(f'DCGM_EXP_XID_ERRORS_COUNT{{node="{node}",xid="79"}} > 0')),
            timeout=60,
            what="the XID 79 scraped",
        )
        incident_id = open_incident(server, delivery("xid79-firing.json", node=node))
        prometheus.wait(
            lambda: (
                [s["metric"]["incident"] for s in prometheus.query("pitcrew_incident_info")] == [incident_id]
            ),
            timeout=60,
            what="the active incident's info series",
        )
        final = server.wait_incident(incident_id, "resolved", "failed", timeout=120)
        assert final["state"] == "resolved", final["outcome"]

        # The figure by hand, from the incident's own timeline.
        fault = epoch(final["opened_at"])  # every figure is clocked from the first delivery
        back = epoch(step_result(final, "slurm_resume")["returned_at"])
        assert slurm.node(node).gpus == 8
        by_hand = 8 * (back - fault) / 3600
        cost = step_result(final, "close")["goodput"]
        assert (cost["node_gpus"], cost["gpus_from"]) == (8, "slurm")
        one_scrape = 8 * SCRAPE / 3600
        lost = 'sum(pitcrew_gpu_hours_lost_total{playbook="replace-node",fault_class="gpu-lost"})'
        # The last counters scraped: a loaded machine may scrape seconds late.
        prometheus.wait(
            lambda: _maybe(prometheus, lost) == pytest.approx(by_hand, abs=one_scrape),
            timeout=60,
            what=f"the GPU-hours lost scraped: {by_hand:.4f} by hand",
        )
        end = time.time()
        exported = _instant(prometheus, lost)
        assert exported == pytest.approx(by_hand, abs=one_scrape)
        window = f"{int(end - began) + 5}s"
        headline = _instant(
            prometheus, concrete("sum(increase(pitcrew_gpu_hours_lost_total[$__range]))", range_=window)
        )
        assert headline == pytest.approx(by_hand, abs=one_scrape)
        [job] = cost["jobs"]
        assert job["job_id"] == job_id and job["gpus"] == 8 and job["status"] == "resumed"
        [record] = step_result(final, "confirm_resumed")["jobs"]
        running = epoch(record["restarted_at"] or record["resumed_at"])
        redone = max(record["progress_before"] - record["progress_at_restart"], 0)
        job_by_hand = 8 * ((running - fault) + redone) / 3600
        assert _instant(prometheus, "sum(pitcrew_job_gpu_hours_lost_total)") == pytest.approx(
            job_by_hand, abs=one_scrape
        )

        assert _instant(prometheus, 'sum(pitcrew_capacity_idle_nodes{pool="spares"})') == 1
        held = _instant(prometheus, 'sum(pitcrew_capacity_idle_gpu_hours_total{pool="spares"})')
        assert 0 < held <= 8 * (end - began) / 3600, held

        empty = []
        for name, dashboard in dashboards().items():
            for title, target in queries(dashboard):
                expr = concrete(target["expr"], rate_interval="30s", range_=window)
                reply = _range(prometheus, expr, began, end)
                assert reply["status"] == "success", (name, title, reply)
                if not reply["data"]["result"]:
                    empty.append(f"{name} / {title}: {target['expr']}")
        assert not empty, "queries without data:\n" + "\n".join(empty)
        print(
            f"\n[grafana] {incident_id}: {by_hand:.4f} GPU-hours by hand, {exported:.4f} exported, "
            f"{headline:.4f} by the dashboard; job {job_id} {job_by_hand:.4f}"
        )
    finally:
        prometheus.stop()
        slurm.run("scontrol", "delete", "ReservationName=spares", check=False)
