"""slurm-operator's preStop DOWN, on real Slurm: kept when the same Slurm node's slurmd registers
again, relabelled by the operator's undrain, and returned by pitcrew's RESUME.

From slurm-operator v1.2.0 the slurmd container's preStop hook runs ``scontrol update
nodename=$(hostname) state=down reason='slurm-operator: Pod is terminating'``
(``internal/builder/workerbuilder/worker_app.go``). A reboot in place or a StatefulSet-mode
NodeSet's replica made again starts a slurmd under the same name. Slurm returns a DOWN node when
its slurmd registers only under ``ReturnToService=2``; under 1 only one it set DOWN "Not
responding" (node_mgr.c ``validate_node_specs``); a dynamic node (``slurmd -Z``) whose record is
still there takes the same path (proc_req.c: ``find_node_record2``, no
``create_dynamic_reg_node``). The operator's undrain (``MakeNodeUndrain``: UNDRAIN with reason
``slurm-operator: Pod (<ns>/<pod>) was uncordoned``) clears DRAIN only and takes the reason:
the DOWN stays.

Cases, on a cluster with a NodeSet per ``ReturnToService`` (0, Slurm's default and the operator's
chart's; 1; 2), a static node and a dynamic one: drained by the operator (its prefix), DOWN by the
hook (the drain a flag on it), slurmd stopped and started again under the same name: under 0 and
1 still DOWN with the hook's reason, known as such by ``slinky_prestop_down``; the operator's
UNDRAIN leaves it DOWN, relabelled, still known; pitcrew's RESUME (both backends) puts it back in
service. Under 2 Slurm returns it (DRAIN kept), the UNDRAIN puts it in service.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from bot.domain.ownership import SLINKY_PRESTOP_REASON, slinky_prestop_down
from proving_ground.proc import eventually
from proving_ground.slurm import SlurmCluster
from tests.harness.slurm import BACKENDS, backend, require_slurm

pytestmark = pytest.mark.slow

NODESET = "slurm-worker-gpu"
DYNAMIC = "kube-gpu-009"
UNDRAIN_REASON = f"slurm-operator: Pod (slurm/{NODESET}-0) was uncordoned"


@pytest.fixture(params=[0, 1, 2], ids=lambda r: f"ReturnToService={r}")
def cluster(request: pytest.FixtureRequest, slurm_version: str) -> Iterator[SlurmCluster]:
    require_slurm(slurm_version)
    run_dir = Path(tempfile.mkdtemp(prefix="pitcrew-slurm-prestop-"))
    started = SlurmCluster(
        run_dir, version=slurm_version, nodeset=NODESET, return_to_service=request.param
    ).start()
    try:
        started.start_dynamic(DYNAMIC)
        yield started
    finally:
        started.stop()
        shutil.rmtree(run_dir, ignore_errors=True)


@pytest.mark.parametrize("name", ["static", "dynamic"])
@pytest.mark.parametrize("backend_name", BACKENDS)
async def test_the_prestop_down_outlives_a_same_name_registration_until_resumed(
    cluster: SlurmCluster, name: str, backend_name: str
) -> None:
    node = cluster.nodes[0] if name == "static" else DYNAMIC
    update = ("scontrol", "update", f"NodeName={node}")
    cluster.run(*update, "State=DRAIN", "Reason=slurm-operator: Node (kube-1) was cordoned")
    cluster.run(*update, "State=DOWN", f"Reason={SLINKY_PRESTOP_REASON}")  # the preStop hook
    cluster.stop_slurmd(node)
    cluster.start_slurmd_again(node)
    again = cluster.node(node)
    async with backend(cluster, backend_name) as scheduler:

        async def back() -> bool:
            return (await scheduler.node(node)).in_service

        if cluster.return_to_service == 2:  # Slurm returns it itself; the operator's UNDRAIN ends it
            assert not again.down and again.drained, again
            # UNDRAIN asks the slurmd to register again (``_require_node_reg``): NOT_RESPONDING a moment.
            cluster.run(*update, "State=UNDRAIN", f"Reason={UNDRAIN_REASON}")
            await eventually(back, timeout=10, what=f"{node} in service")
            return
        assert again.down and again.drained and again.reason == SLINKY_PRESTOP_REASON, again
        assert "NOT_RESPONDING" not in again.states, again  # its slurmd is registered
        cluster.run(*update, "State=UNDRAIN", f"Reason={UNDRAIN_REASON}")  # the operator's undrain
        undrained = await scheduler.node(node)
        assert undrained.down and not undrained.drained and undrained.reason == UNDRAIN_REASON, undrained
        assert slinky_prestop_down(undrained.reason)

        await scheduler.resume(node)
        await eventually(back, timeout=10, what=f"{node} in service")
