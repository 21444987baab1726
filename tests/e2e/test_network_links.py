"""Network links end to end: node-exporter stand-in -> real Prometheus (pitcrew's rules, FAST) -> real
Alertmanager (the shipped route) -> pitcrew (a subprocess, mode auto) -> real Slurm.

Kubernetes and the notifier are simulated (``tests.simulator``); Slurm is real (gpu-001..003, one
node-exporter stand-in target per node, Kubernetes node name = Slurm node name). Cases:

* an InfiniBand port goes DOWN on the node running the checkpointing training job: one incident,
  ``isolate-node``; Slurm shows the node DOWN with ``pitcrew: <incident> link-down mlx5_0 port 1``,
  the job is requeued and runs again on another node (``confirm_resumed``: resumed), the Kubernetes
  node is cordoned with pitcrew's mark, humans were told the port; the node stays out;
* a port flaps three times (up again after each, so no scrape need see it down): the same, with
  ``link-flapping`` and the count in the notice; after two flaps there is no incident yet;
* a slowly rising symbol-error rate on the node running the job: a notice naming the port and the
  error count, and no action: no Slurm change, no cordon, the job still running where it was.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from proving_ground.assets import fast_rules
from proving_ground.nodeexporter import Standin
from proving_ground.proc import free_port
from proving_ground.prometheus import Alertmanager, Prometheus, alertmanager_config, prometheus_config
from proving_ground.slurm import SlurmCluster
from proving_ground.stack import TEST_TIMING
from tests.e2e.slurm_engine import TERMINAL, start_pitcrew, training_on_a_node
from tests.harness.pitcrew import Pitcrew
from tests.harness.proc import require_binary, wait_until
from tests.harness.scenarios import destructive_calls, notices, step_result

pytestmark = pytest.mark.slow
SLURM_NODES = ("gpu-001", "gpu-002", "gpu-003")
NETWORK_ALERTS = ("NetworkLinkDown", "NetworkLinkFlapping", "NetworkLinkErrors")


@dataclass
class NetworkStack:
    standin: Standin
    prometheus: Prometheus
    alertmanager_port: int
    workdir: Path


@pytest.fixture
def stack(tmp_path_factory: pytest.TempPathFactory, slurm: SlurmCluster) -> Iterator[NetworkStack]:
    """node-exporter stand-ins for the Slurm nodes, scraped by a Prometheus with pitcrew's rules;
    one per test: the next test's pitcrew must not inherit this test's alerts, and a fresh
    Prometheus is ready in seconds where this one's alerts take a rule window (a minute) to clear."""
    workdir = tmp_path_factory.mktemp("network")
    standin = Standin(SLURM_NODES, ib_ports=(("mlx5_0", 1), ("mlx5_1", 1)), interfaces=("eth0",)).start()
    port = free_port()
    rule_file = workdir / "gpu-faults.rules.yml"
    rule_file.write_text(fast_rules())
    node_exporter = {
        "job_name": "node-exporter",
        "static_configs": [
            {"targets": [standin.address(n)], "labels": {"__meta_kubernetes_pod_node_name": n}}
            for n in SLURM_NODES
        ],
        "relabel_configs": [{"source_labels": ["__meta_kubernetes_pod_node_name"], "target_label": "node"}],
    }
    config = prometheus_config({}, f"127.0.0.1:{port}", rule_file, TEST_TIMING, [node_exporter])
    prometheus = Prometheus(require_binary("prometheus", "prometheus"), workdir, config)
    try:
        prometheus.start()
        # Every port ACTIVE in Prometheus's memory before a test breaks one: a link counts as down
        # only if it was up within the window.
        wait_until(
            lambda: len(prometheus.query("node_infiniband_state_id == 4")) == 2 * len(SLURM_NODES),
            timeout=60,
            what="every stand-in port scraped ACTIVE",
        )
        yield NetworkStack(standin, prometheus, port, workdir)
    finally:
        prometheus.stop()
        standin.stop()


def pitcrew_behind_alertmanager(
    factory: Any, slurm: SlurmCluster, stack: NetworkStack, name: str
) -> tuple[Pitcrew, Alertmanager]:
    server = start_pitcrew(factory, slurm, name)
    token = stack.workdir / f"{name}.token"
    token.write_text(server.token)
    alertmanager = Alertmanager(
        require_binary("prometheus-alertmanager", "prometheus-alertmanager"),
        stack.workdir / f"alertmanager-{name}",
        alertmanager_config(f"{server.url}/api/v1/alerts", token, TEST_TIMING),
        port=stack.alertmanager_port,
    )
    alertmanager.start()
    return server, alertmanager


def closed_incident(server: Pitcrew, node: str) -> dict[str, Any]:
    found: list[dict[str, Any]] = []

    def closed() -> bool:
        found[:] = [server.incident(i["id"]) for i in server.incidents(node)]
        return bool(found) and found[0]["state"] in TERMINAL

    wait_until(closed, timeout=120, interval=0.2, what=f"the incident on {node} to close")
    return found[0]


def assert_isolated_and_resumed(
    server: Pitcrew, slurm: SlurmCluster, node: str, job_id: str, fault: str, port: str
) -> dict[str, Any]:
    incident = closed_incident(server, node)
    assert [i["id"] for i in server.incidents(node)] == [incident["id"]], "one incident for the node"
    assert incident["state"] == "resolved", incident["outcome"]
    assert incident["playbook"] == "isolate-node"
    assert {f["kind"] for f in incident["faults"]} >= {fault}
    # Slurm: the node is out, with the port in pitcrew's reason; pitcrew does not return it.
    state = slurm.node(node)
    assert state.down, state
    assert state.reason == f"pitcrew: {incident['id']} {fault} {port}", state.reason
    down = step_result(incident, "slurm_down")
    assert down["action"] == "down" and [j["job_id"] for j in down["jobs"]] == [job_id]
    # Kubernetes: cordoned with pitcrew's mark.
    assert step_result(incident, "cordon")
    calls = destructive_calls(server.journal_records())
    assert calls[("cordon", node)] == 1
    assert calls[("uncordon", node)] == 0
    # The job: requeued, running again on another node.
    [record] = step_result(incident, "confirm_resumed")["jobs"]
    assert record["job_id"] == job_id and record["status"] == "resumed", record["detail"]
    assert node not in record["new_nodes"]
    job = slurm.job(job_id)
    assert job is not None and job.state == "RUNNING" and node not in job.nodes and job.restarts == 1
    # Humans were told which port.
    [told] = notices(server.journal_records(), "incident")
    assert told["title"] == f"{node}: {fault} {port} → isolate-node", told["title"]
    assert any(port in line for line in told["lines"]), told["lines"]
    return incident


def test_an_ib_port_down_under_a_job_takes_the_node_out_and_the_job_resumes(
    stack: NetworkStack, slurm: SlurmCluster, pitcrew_factory: Any
) -> None:
    server, alertmanager = pitcrew_behind_alertmanager(pitcrew_factory, slurm, stack, "link-down")
    try:
        job_id, node = training_on_a_node(slurm)
        stack.standin.node(node).port_down("mlx5_0", 1)
        assert_isolated_and_resumed(server, slurm, node, job_id, "link-down", "mlx5_0 port 1")
        others = [n for n in SLURM_NODES if n != node]
        assert not any(server.incidents(n) for n in others), "only the node with the port down"
    finally:
        alertmanager.stop()


def test_a_port_flapping_three_times_takes_the_node_out_and_the_job_resumes(
    stack: NetworkStack, slurm: SlurmCluster, pitcrew_factory: Any
) -> None:
    server, alertmanager = pitcrew_behind_alertmanager(pitcrew_factory, slurm, stack, "link-flapping")
    try:
        job_id, node = training_on_a_node(slurm)
        port = stack.standin.node(node).port("mlx5_1", 1)
        before = port.counters["link_downed_total"]
        stack.standin.node(node).flap("mlx5_1", 1, times=2)  # two downs: not yet flapping
        scraped = f'node_infiniband_link_downed_total{{node="{node}",device="mlx5_1"}} == {before + 2:g}'
        wait_until(lambda: bool(stack.prometheus.query(scraped)), timeout=30, what="two downs scraped")
        assert not server.incidents(node), "two downs are no flapping"
        stack.standin.node(node).flap("mlx5_1", 1, times=1)
        incident = assert_isolated_and_resumed(server, slurm, node, job_id, "link-flapping", "mlx5_1 port 1")
        [told] = notices(server.journal_records(), "incident")
        assert any("went down 3 times" in line for line in told["lines"]), told["lines"]
        assert "link-down" not in {f["kind"] for f in incident["faults"]}, "the port never looked down"
    finally:
        alertmanager.stop()


def test_a_rising_symbol_error_rate_sends_a_notice_and_takes_no_action(
    stack: NetworkStack, slurm: SlurmCluster, pitcrew_factory: Any
) -> None:
    server, alertmanager = pitcrew_behind_alertmanager(pitcrew_factory, slurm, stack, "link-errors")
    try:
        job_id, node = training_on_a_node(slurm)
        stack.standin.node(node).error_rate("mlx5_0", 1, symbol=2.0)
        found: list[dict[str, Any]] = []

        def told() -> bool:
            found[:] = notices(server.journal_records(), "incident")
            return bool(found)

        wait_until(told, timeout=90, interval=0.2, what="a notice about the error rate")
        [notice] = found
        assert notice["title"] == f"{node}: link-errors mlx5_0 port 1 → notify-only", notice["title"]
        assert any("physical-layer errors" in line for line in notice["lines"]), notice["lines"]
        [incident] = [server.incident(i["id"]) for i in server.incidents(node)]
        assert incident["playbook"] == "notify-only"
        assert not destructive_calls(server.journal_records())
        assert slurm.node(node).in_service
        job = slurm.job(job_id)
        assert job is not None and job.state == "RUNNING" and job.nodes == (node,) and job.restarts == 0
    finally:
        alertmanager.stop()
