"""A spare from a Kubernetes pool (label selector) for a gang job, on real Slurm and the Kubernetes
API emulator together.

Three nodes: ``gpu-001``/``gpu-002`` are selected by the NodeSet of the jobs' partition and run
a gang job (``-N2``); ``gpu-003`` carries ``pitcrew.dev/pool=spare`` and no NodeSet label, so
Slurm cannot place a job there (``NodeSetStandin`` keeps it drained ``nodeset: not selected``,
as a node with no slurmd pod). pitcrew is the real ``serve`` (mode auto, cluster-api
replacement, the MachineSet stand-in's new node Ready only after ``REPLACE`` seconds). XID 79 on
``gpu-001``: pitcrew takes ``gpu-003`` out of the pool (mark, the pool's label off, then the
NodeSet's label on), its slurmd registers, and the job runs again on ``gpu-002``+``gpu-003``
from its checkpoint long before the replacement exists. When the replacement is Ready it takes
the spare's place in the pool (the pool's size is as it was), the lent node stays with the jobs
unmarked and uncordoned, and the incident resolves.

The same with a lender (``kind: lender``, an inference node selector): ``gpu-003`` runs one of
two vLLM replicas under the service's budget (minAvailable 1, the other replica not Ready yet);
pitcrew cordons the node, evicts its replica through the Eviction API (429 while the budget
holds, 201 once the other replica is Ready; nothing else evicted), takes the inference labels
off, and only then does the NodeSet select it; afterwards the replacement carries the inference
labels the lent node had, so the inference pool has its size again.

With ``give_back: return`` the lent node itself goes back: the job runs on it until it ends (here:
cancelled once the replacement is Ready and the give-back waits for it), then ``gpu-003`` has its
inference labels again, uncordoned and unmarked, out of the NodeSet, the inference pool its size
again, and the replacement joins training as Slurm node ``gpu-001``, resumed.

``pitcrew plan --live`` reads the pools by selector through the emulator (only reads: no patch, no
eviction): a spare carrying the opt-out label and an inference node with other GPUs than the failed
node's are each refused, by name and guard, and nothing is taken; once the inference node's GPUs
match, it is the node a take would choose, the spare named as passed over.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

import pytest
import yaml

from bot.cli import main
from proving_ground.kubernetes.host_slurmds import HostSlurmds
from proving_ground.kubernetes.nodeset import NodeSetStandin
from proving_ground.kubernetes.world import KubeWorld, gpu_fleet, inference_replicas, pod_ready, pool_fleet
from proving_ground.slurm import SlurmCluster
from proving_ground.train_job import read_checkpoint
from tests.e2e.kube_config import slurm_and_kubernetes
from tests.e2e.slurm_engine import open_incident, running_on, wait_for_step
from tests.harness.figures import show_figure
from tests.harness.proc import wait_until
from tests.harness.scenarios import delivery, events, step_result

pytestmark = pytest.mark.slow

NODESET = {"slinky.slurm.net/nodeset": "gpu"}
SPARE = {"pitcrew.dev/pool": "spare"}
INFERENCE = {"pitcrew.dev/pool": "inference", "workload": "vllm"}
POOLS: dict[str, dict[str, Any]] = {
    "spare": {
        "name": "spares",
        "kind": "spare",
        "selector": "pitcrew.dev/pool=spare",
        "join_labels": NODESET,
    },
    "lender": {
        "name": "inference",
        "kind": "lender",
        "selector": "pitcrew.dev/pool=inference",
        "leave_labels": ["workload"],
        "join_labels": NODESET,
    },
}
HOLD = 2.0  # seconds the inference budget refuses the eviction (its other replica not Ready)
REPLACE = 20.0  # seconds before the replacement node exists


def pool_layout(
    kube_world: KubeWorld, slurm: SlurmCluster, labels: dict[str, str], replace_after: float = REPLACE
) -> None:
    """The emulator's nodes for the session's Slurm nodes: ``gpu-001`` and ``gpu-002`` in the
    NodeSet (the gang job's partition), ``gpu-003`` in the pool ``labels`` select; a replacement
    exists ``replace_after`` seconds after it is asked for, Ready a second later."""
    assert slurm.nodes[:3] == ("gpu-001", "gpu-002", "gpu-003"), slurm.nodes
    kube_world.call(lambda e: pool_fleet(e, list(slurm.nodes), NODESET, labels, replace_after=replace_after))


def _labels(world: KubeWorld, name: str) -> dict[str, str]:
    node = world.call(lambda e: e.get("nodes", name))
    return dict(node["metadata"].get("labels") or {}) if node else {}


def _members(world: KubeWorld, labels: dict[str, str]) -> list[str]:
    def pick(e: Any) -> list[str]:
        return sorted(
            o["metadata"]["name"]
            for (plural, _, _), o in e.objects.items()
            if plural == "nodes" and labels.items() <= (o["metadata"].get("labels") or {}).items()
        )

    found: list[str] = world.call(pick)
    return found


@pytest.mark.parametrize("kind", ["spare", "lender"])
def test_a_node_from_a_pool_runs_the_gang_job_long_before_the_replacement(
    slurm: SlurmCluster,
    pitcrew_factory: Any,
    kube_world: KubeWorld,
    host_slurmds: Callable[..., HostSlurmds],
    tmp_path: Any,
    kind: str,
) -> None:
    labels = SPARE if kind == "spare" else INFERENCE
    pool_layout(kube_world, slurm, labels)
    hosts = host_slurmds()
    replicas = (
        kube_world.call(lambda e: inference_replicas(e, "gpu-003", "gpu-002")) if kind == "lender" else []
    )
    site = slurm_and_kubernetes(
        slurm, kube_world, tmp_path / "kube", request_timeout=1.5, replace={"strategy": "cluster-api"}
    )
    config = {**site, "engine": {"poll_interval": "1s"}, "capacity": {"pools": [POOLS[kind]]}}
    try:
        with NodeSetStandin(kube_world, slurm, NODESET) as nodeset:
            assert slurm.node("gpu-003").drained  # not in the NodeSet: no job lands there
            server = pitcrew_factory("k8s-spares", config=config, simulated=False).start()
            job_id = slurm.submit_training(extra=("-N2",))
            assert set(running_on(slurm, job_id).nodes) == {"gpu-001", "gpu-002"}
            wait_for_step(slurm, job_id, 3)
            before = read_checkpoint(slurm.job_dir, job_id)
            incident_id = open_incident(server, delivery("xid79-firing.json", node="gpu-001"))
            alerted = time.monotonic()
            if kind == "lender":  # the budget refuses until the service's other replica is Ready
                wait_until(
                    lambda: any(e.subresource == "eviction" and e.status == 429 for e in kube_world.log()),
                    timeout=60,
                    interval=0.1,
                    what="the inference budget to refuse the eviction",
                )
                time.sleep(HOLD)
                kube_world.call(lambda e: pod_ready(e, "inference", replicas[1]))

            try:
                running = server.wait_event(incident_id, "job_running", timeout=60)
            except Exception as exc:
                raise AssertionError(_debug(server, incident_id, slurm, nodeset)) from exc
            back_after = time.monotonic() - alerted
            job = slurm.job(job_id)
            assert job is not None and job.running and set(job.nodes) == {"gpu-002", "gpu-003"}, job
            assert back_after < REPLACE, (back_after, running)  # before the replacement even exists
            assert not [n for n in _members(kube_world, {}) if n.startswith("gpu-001-")]
            took = step_result(server.incident(incident_id), "capacity")
            assert took["node"] == "gpu-003" and took["slurm_node"] == "gpu-003" and took["joined_at"]
            assert ("gpu-003", "join") in nodeset.moves
            assert NODESET.items() <= _labels(kube_world, "gpu-003").items()
            assert "pitcrew.dev/pool" not in _labels(kube_world, "gpu-003")
            if kind == "lender":
                evictions = [(e.name, e.status) for e in kube_world.log() if e.subresource == "eviction"]
                assert evictions[0] == (replicas[0], 429) and evictions[-1] == (replicas[0], 201), evictions
                assert {name for name, _ in evictions} == {replicas[0]}  # only the lent node's replica
                assert "workload" not in _labels(kube_world, "gpu-003")
            wait_until(
                lambda: read_checkpoint(slurm.job_dir, job_id) > before,
                timeout=30,
                what="training past its checkpoint on the spare",
            )

            final = server.wait_incident(incident_id, "resolved", "failed", timeout=120)
            assert final["state"] == "resolved", final["outcome"]
            [new_node] = [n for n in _members(kube_world, {}) if n.startswith("gpu-001-")]
            assert step_result(final, "give_back")["node"] == new_node
            assert _members(kube_world, labels) == [new_node]  # the pool has its size again
            lent = kube_world.call(lambda e: e.get("nodes", "gpu-003"))
            assert lent is not None
            assert not lent["spec"].get("unschedulable")
            assert not any(
                k.startswith("pitcrew.dev/lent") for k in lent["metadata"].get("annotations") or {}
            )
            actions = [e["data"]["action"] for e in events(final, "action")]
            assert actions.count("capacity_take") == 1 and actions.count("capacity_give_back") == 1, actions
            job = slurm.job(job_id)
            assert job is not None and job.running and set(job.nodes) == {"gpu-002", "gpu-003"}, job
            assert hosts.error is None and hosts.moves == [("gpu-001", "stop"), ("gpu-001", "start")]
            print(f"\n[k8s-spares] {incident_id}: job running again {back_after:.1f}s after the alert; "
                  f"replacement after {REPLACE:.0f}s; {nodeset.moves}")  # fmt: skip
    finally:
        for name in slurm.nodes:  # the session's cluster: every node back in service
            slurm.run("scontrol", "update", f"NodeName={name}", "State=RESUME", check=False)


def test_return_gives_the_lent_inference_node_back_once_the_job_left_it(
    slurm: SlurmCluster,
    pitcrew_factory: Any,
    kube_world: KubeWorld,
    host_slurmds: Callable[..., HostSlurmds],
    tmp_path: Any,
    capsys: pytest.CaptureFixture[str],
) -> None:
    pool_layout(kube_world, slurm, INFERENCE)
    host_slurmds()
    replicas = kube_world.call(lambda e: inference_replicas(e, "gpu-003", "gpu-002"))
    kube_world.call(lambda e: pod_ready(e, "inference", replicas[1]))  # the budget lets one go
    site = slurm_and_kubernetes(
        slurm, kube_world, tmp_path / "kube", request_timeout=1.5, replace={"strategy": "cluster-api"}
    )
    config = {
        **site,
        "engine": {"poll_interval": "1s"},
        "capacity": {"pools": [POOLS["lender"]], "give_back": "return", "return_wait": "5m"},
    }
    try:
        with NodeSetStandin(kube_world, slurm, NODESET) as nodeset:
            server = pitcrew_factory("k8s-return", config=config, simulated=False).start()
            job_id = slurm.submit_training(extra=("-N2",))
            wait_for_step(slurm, job_id, 3)
            incident_id = open_incident(server, delivery("xid79-firing.json", node="gpu-001"))
            try:
                server.wait_event(incident_id, "job_running", timeout=60)
                waiting = server.wait_event(incident_id, "step_waiting", step="give_back", timeout=90)
            except Exception as exc:
                raise AssertionError(_debug(server, incident_id, slurm, nodeset)) from exc
            assert "gpu-003 still runs a job" in waiting["detail"], waiting
            assert _members(kube_world, INFERENCE) == []  # still lent, the replacement Ready
            job = slurm.job(job_id)
            assert job is not None and job.running and set(job.nodes) == {"gpu-002", "gpu-003"}, job
            slurm.run("scancel", job_id)  # the job ends: nothing runs on the lent node any more
            ended = time.monotonic()
            wait_until(
                lambda: _members(kube_world, INFERENCE) == ["gpu-003"],
                timeout=60,
                interval=0.1,
                what="the lent node back in the inference pool",
            )
            back_after = time.monotonic() - ended
            final = server.wait_incident(incident_id, "resolved", "failed", timeout=90)
            assert final["state"] == "resolved", final["outcome"]
            assert step_result(final, "give_back")["node"] == "gpu-003"
            assert _members(kube_world, INFERENCE) == ["gpu-003"]  # the inference pool has its size again
            lent = kube_world.call(lambda e: e.get("nodes", "gpu-003"))
            assert lent is not None
            assert INFERENCE.items() <= lent["metadata"]["labels"].items()
            assert "slinky.slurm.net/nodeset" not in lent["metadata"]["labels"]
            assert not lent["spec"].get("unschedulable")  # inference pods can schedule there again
            assert not any(
                k.startswith("pitcrew.dev/lent") for k in lent["metadata"].get("annotations") or {}
            )
            [replacement] = [n for n in _members(kube_world, {}) if n.startswith("gpu-001-")]
            assert NODESET.items() <= _labels(kube_world, replacement).items()  # it trains
            state = slurm.node("gpu-001")  # served by the replacement, resumed
            assert not state.taken_out, state
            actions = [e["data"]["action"] for e in events(final, "action")]
            assert actions.count("capacity_take") == 1 and actions.count("capacity_give_back") == 1, actions
            show_figure(
                capsys,
                f"[k8s-return] {incident_id}: gpu-003 back in the inference pool {back_after:.1f}s after its job "
                f"ended (poll_interval 1s)",
            )
    finally:
        for name in slurm.nodes:  # the session's cluster: every node back in service
            slurm.run("scontrol", "update", f"NodeName={name}", "State=RESUME", check=False)


def test_plan_live_names_the_node_a_take_would_choose_and_the_guards_that_refused_the_others(
    slurm: SlurmCluster, kube_world: KubeWorld, tmp_path: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    kube_world.call(lambda e: gpu_fleet(e, list(slurm.nodes)))

    def label(name: str, labels: dict[str, str]) -> None:
        def change(e: Any) -> None:
            node = e.get("nodes", name)
            node["metadata"]["labels"].update(labels)
            e.bump(node)

        kube_world.call(change)

    label("gpu-003", {**SPARE, "pitcrew.dev/opt-out": "true"})
    label("gpu-002", {**INFERENCE, "nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB"})
    site = slurm_and_kubernetes(slurm, kube_world, tmp_path / "kube", request_timeout=1.5)
    pools = [POOLS["spare"], POOLS["lender"]]
    config = tmp_path / "pitcrew.yaml"
    config.write_text(
        yaml.safe_dump({**site, "store": {"path": str(tmp_path / "none.db")}, "capacity": {"pools": pools}})
    )
    payload = tmp_path / "xid79.json"
    payload.write_bytes(delivery("xid79-firing.json", node="gpu-001"))

    def plan() -> dict[str, Any]:
        assert main(["plan", str(payload), "--live", "--json", "-c", str(config)]) == 0
        found: dict[str, Any]
        [found] = json.loads(capsys.readouterr().out)
        assert main(["plan", str(payload), "--live", "-c", str(config)]) == 0
        said = [ln.strip() for ln in capsys.readouterr().out.splitlines() if "spare  now:" in ln]
        assert said == [f"spare  {found['capacity'][-1]}"]
        return found

    found = plan()
    choice = found["capacity_choice"]
    assert choice["node"] is None and choice["guards"] == ["opt_out", "gpu_type"], found
    assert found["capacity"][-1] == (
        "now: would take none — no node to take: gpu-003 (spares): opt_out — carries the opt-out label; "
        "gpu-002 (inference): gpu_type — GPU NVIDIA-A100-SXM4-80GB, the failed node has NVIDIA-H100-80GB-HBM3"
    )

    label("gpu-002", {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"})
    found = plan()
    choice = found["capacity_choice"]
    assert (choice["node"], choice["pool"]) == ("gpu-002", "inference"), found
    assert found["capacity"][-1] == (
        "now: would take gpu-002 from lender pool inference; passed over gpu-003: opt_out (carries the "
        "opt-out label)"
    )
    writes = [r for r in kube_world.log() if r.verb not in ("get", "list", "watch")]
    assert writes == []  # read only
    assert INFERENCE.items() <= _labels(kube_world, "gpu-002").items()


def _debug(server: Any, incident_id: str, slurm: SlurmCluster, nodeset: NodeSetStandin) -> str:
    incident = server.incident(incident_id)
    timeline = "\n".join(
        f"{e.get('at')} {e['kind']} {e.get('step')} {e.get('detail')}" for e in incident["events"]
    )
    queue = slurm.run("squeue", "-h", "-o", "%i %T %r %N").stdout
    return f"{timeline}\nsqueue: {queue}\nnodes: {slurm.node_states()}\nnodeset: {nodeset.moves}"
