"""SIGKILL of a real pitcrew process at every boundary of taking a node from a Kubernetes pool and
giving it back, on real Slurm and the Kubernetes API emulator together (the cluster of
``test_kubernetes_spares``: a gang job on ``gpu-001``/``gpu-002``, ``gpu-003`` in the pool, XID 79 on
``gpu-001``, the replacement Ready after ``REPLACE`` seconds, ``give_back: refill``).

The emulator kills pitcrew from inside the API server the moment the request of one boundary
arrives (``Crash``), either before serving it (the write never lands) or serving it after the kill
(it lands, pitcrew never hears): the take's patch of the pool node (its mark, the pool's labels
off), the eviction of a lender's inference pod, the patch putting the NodeSet's labels on it, and
the give-back's patches — the replacement joining the pool, the lent node's mark coming off.
pitcrew is started again on the same store. For each: the incident resolves; no write is made
twice (a label patch the resumed step sends again is idempotent, and the only one); the take and
the give-back are each audited once; the job runs on ``gpu-002``+``gpu-003``; no node is in two places
(the lent node in the NodeSet and out of the pool, the replacement in the pool and out of the
NodeSet); none is left cordoned or marked lent, no Slurm node DOWN or drained by pitcrew; the pool
has its size again.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from bot.domain.ownership import lent_to
from proving_ground.kubernetes.faults import Fault
from proving_ground.kubernetes.host_slurmds import HostSlurmds
from proving_ground.kubernetes.nodeset import NodeSetStandin
from proving_ground.kubernetes.world import KubeWorld, inference_replicas, pod_ready
from proving_ground.slurm import SlurmCluster
from tests.e2e.kube_config import slurm_and_kubernetes
from tests.e2e.slurm_engine import open_incident, running_on, wait_for_step
from tests.e2e.test_kubernetes_spares import (
    INFERENCE,
    NODESET,
    POOLS,
    SPARE,
    _debug,
    _members,
    pool_layout,
)
from tests.harness.figures import show_figure
from tests.harness.pitcrew import Crash
from tests.harness.scenarios import delivery, events, step_result

pytestmark = pytest.mark.slow
#: Seconds before the replacement exists (``test_kubernetes_spares``' 20 s proves the job runs before
#: it; here the take need only have begun: its intent is stored when the requeued job's
#: ``BeginTime`` passes, ~6 s after DOWN). A replacement Ready while the take of a killed pitcrew
#: is still unfinished makes ``give_back`` wait for it ("the take ... is under way").
REPLACE = 14.0


@dataclass(frozen=True)
class Boundary:
    """One request of the take or the give-back, and the pool it is seen with."""

    kind: str
    verb: str
    resource: str
    subresource: str | None = None
    #: The node (or pod) the request names; ``None`` with ``prefix``: the replacement, named later.
    name: str | None = "gpu-003"
    prefix: str | None = None
    #: Matching requests before it (the lent node is patched three times: lend, join, unmark).
    skip: int = 0
    #: Successful writes of this kind to this target in a run nobody killed.
    writes: int = 3
    #: A label patch: after the kill the resumed step sends it again (a merge patch, idempotent);
    #: every other write the resumed step finds done and does not repeat.
    relabel: bool = False

    def target(self, name: str | None) -> bool:
        return name == self.name if self.prefix is None else (name or "").startswith(self.prefix)


BOUNDARIES = {
    "lend": Boundary("spare", "patch", "nodes"),
    "evict": Boundary("lender", "create", "pods", "eviction", name="vllm-7d9f8-0", writes=1),
    "join": Boundary("spare", "patch", "nodes", skip=1, relabel=True),
    # The replacement's first patch is wait_ready's claim of it; the second puts the pool's labels on.
    "refill": Boundary(
        "spare", "patch", "nodes", name=None, prefix="gpu-001-", skip=1, writes=2, relabel=True
    ),
    "unmark": Boundary("spare", "patch", "nodes", skip=2),
}
WHEN = ("before", "after")
TAKE = [(name, when) for name in ("lend", "evict", "join") for when in WHEN]
GIVE_BACK = [(name, when) for name in ("refill", "unmark") for when in WHEN]
assert sorted(TAKE + GIVE_BACK) == sorted((name, when) for name in BOUNDARIES for when in WHEN)
Fixtures = tuple[SlurmCluster, Any, KubeWorld, Path, pytest.CaptureFixture[str]]


def _boundaries(cases: list[tuple[str, str]]) -> pytest.MarkDecorator:
    return pytest.mark.parametrize(("boundary", "when"), cases, ids=[f"{b}-{w}" for b, w in cases])


class SigkillAtEveryBoundary:
    """The test; each subclass names its boundaries. Two, so that pytest-xdist's ``--dist
    loadscope`` (scripts/test) gives the take and the give-back a worker each: the ten cases take
    six minutes, all of it waiting on real timers."""

    def test_sigkill_at_every_boundary_leaves_each_node_in_one_place(
        self,
        slurm: SlurmCluster,
        pitcrew_factory: Any,
        kube_world: KubeWorld,
        tmp_path: Path,
        boundary: str,
        when: str,
        capsys: pytest.CaptureFixture[str],
    ) -> None:
        _sigkill_at(boundary, when, (slurm, pitcrew_factory, kube_world, tmp_path, capsys))


@_boundaries(TAKE)
class TestTake(SigkillAtEveryBoundary):
    """The take: the lend patch, a lender pod's eviction, the NodeSet's labels on the lent node."""


@_boundaries(GIVE_BACK)
class TestGiveBack(SigkillAtEveryBoundary):
    """The give-back: the replacement joining the pool, the lent node's mark coming off."""


def _sigkill_at(boundary: str, when: str, fixtures: Fixtures) -> None:
    slurm, pitcrew_factory, kube_world, tmp_path, capsys = fixtures
    at = BOUNDARIES[boundary]
    labels = SPARE if at.kind == "spare" else INFERENCE
    pool_layout(kube_world, slurm, labels, replace_after=REPLACE)
    if at.kind == "lender":  # the service's other replica is Ready: its budget lets one go
        replicas = kube_world.call(lambda e: inference_replicas(e, "gpu-003", "gpu-002"))
        kube_world.call(lambda e: pod_ready(e, "inference", replicas[1]))
    site = slurm_and_kubernetes(
        slurm, kube_world, tmp_path / "kube", request_timeout=1.5, replace={"strategy": "cluster-api"}
    )
    config = {
        **site,
        "engine": {"poll_interval": "1s"},
        "capacity": {"pools": [POOLS[at.kind]]},
        "store": {"lease": {"ttl": "2s", "renew_every": "0.5s"}},  # the restart acts once it lapses
    }
    try:
        with NodeSetStandin(kube_world, slurm, NODESET) as nodeset, HostSlurmds(kube_world, slurm) as hosts:
            server = pitcrew_factory("k8s-spares-crash", config=config, simulated=False).start()
            crash = Crash(server)
            fault = Fault(
                503 if when == "before" else None,
                verb=at.verb,
                resource=at.resource,
                subresource=at.subresource,
                name=at.name,
                name_prefix=at.prefix,
                skip=at.skip,
                before=crash.fire,
            )
            kube_world.call(lambda e: e.faults.add(fault))
            job_id = slurm.submit_training(extra=("-N2",))
            assert set(running_on(slurm, job_id).nodes) == {"gpu-001", "gpu-002"}
            wait_for_step(slurm, job_id, 3)
            incident_id = open_incident(server, delivery("xid79-firing.json", node="gpu-001"))
            alerted = time.monotonic()
            crash.wait(f"the {boundary} request", timeout=120)
            server.start()
            try:
                final = server.wait_incident(incident_id, "resolved", "failed", timeout=150)
                assert final["state"] == "resolved", final["outcome"]
                resolved_after = time.monotonic() - alerted
            except Exception as exc:
                raise AssertionError(_debug(server, incident_id, slurm, nodeset)) from exc

            seen = [
                (e.name, e.status)
                for e in kube_world.log()
                if (e.verb, e.resource, e.subresource) == (at.verb, at.resource, at.subresource)
            ]
            written = [
                status for name, status in seen if at.target(name) and status is not None and status < 300
            ]
            assert len(written) == at.writes + (when == "after" and at.relabel), seen  # nothing done twice
            actions = [e["data"]["action"] for e in events(final, "action")]
            assert actions.count("capacity_take") == 1 and actions.count("capacity_give_back") == 1, actions
            assert step_result(final, "capacity")["node"] == "gpu-003"
            job = slurm.job(job_id)
            assert job is not None and job.running and set(job.nodes) == {"gpu-002", "gpu-003"}, job
            [replacement] = [n for n in _members(kube_world, {}) if n.startswith("gpu-001-")]
            assert _members(kube_world, labels) == [replacement]  # the pool has its size again
            assert _members(kube_world, NODESET) == ["gpu-002", "gpu-003"]  # nobody in two places
            for node in kube_world.call(lambda e: [o for (p, _, _), o in e.objects.items() if p == "nodes"]):
                name = node["metadata"]["name"]
                assert not node["spec"].get("unschedulable"), name
                assert lent_to(node["metadata"].get("annotations") or {}) is None, name
            for name in ("gpu-002", "gpu-003"):
                state = slurm.node(name)
                assert not state.taken_out, (name, state)
            assert hosts.error is None and hosts.moves == [("gpu-001", "stop"), ("gpu-001", "start")]
            for name in slurm.nodes:
                state = slurm.node(name)
                # No node keeps pitcrew's reason; on 24.11 a resumed one keeps it as history (in service).
                held = not slurm.keeps_reason_on_resume or state.taken_out
                assert not (held and state.reason.startswith("pitcrew:")), (name, state)
            show_figure(
                capsys,
                f"[k8s-spares-crash] {boundary}-{when}: {incident_id} resolved {resolved_after:.1f}s after the "
                f"alert across the SIGKILL (replacement after {REPLACE:.0f}s); {at.verb} {at.resource}: {seen}",
            )
    finally:
        for name in slurm.nodes:  # the session's cluster: every node back in service
            slurm.run("scontrol", "update", f"NodeName={name}", "State=RESUME", check=False)
