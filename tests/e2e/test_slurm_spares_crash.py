"""SIGKILL of a real pitcrew process at every boundary of taking a spare and giving it back, on a
real Slurm cluster whose spares wait in a reservation (the cluster of ``test_slurm_spares``).

pitcrew runs Slurm's own ``scontrol`` through a wrapper in ``slurm.bin_dir`` that, on the
reservation update it is told to (the take is the first, the give-back the second), SIGKILLs
pitcrew — its parent — either before passing the update on (Slurm never saw it) or after
Slurm applied it (pitcrew never heard). pitcrew is started again on the same store. For each
of the four boundaries: the incident resolves; Slurm applied exactly two reservation updates
(nothing done twice); the take and the give-back are each audited once; the job runs on the
spare; the reservation is whole (two spares) at the end; no node is left DOWN or drained.
"""

from __future__ import annotations

import shutil
import stat
from pathlib import Path
from typing import Any

import pytest

from proving_ground.slurm import SlurmCluster
from tests.e2e.slurm_engine import open_incident
from tests.e2e.test_slurm_spares import _debug as timeline
from tests.e2e.test_slurm_spares import four_nodes, gang_job, reserved, spares
from tests.harness.proc import wait_until
from tests.harness.scenarios import delivery, events, step_result

pytestmark = pytest.mark.slow
__all__ = ["four_nodes", "spares"]  # fixtures, shared with test_slurm_spares

POOL = {"name": "spares", "kind": "spare", "reservation": "spares"}
BOUNDARIES = [("take", "before"), ("take", "after"), ("give", "before"), ("give", "after")]


def _wrapped(slurm: SlurmCluster, where: Path, nth: int, when: str) -> Path:
    """``where`` as ``slurm.bin_dir``: ``squeue`` as is, ``scontrol`` killing its caller on the
    ``nth`` reservation update, ``when`` it reaches Slurm (``before``/``after``)."""
    where.mkdir()
    real = {p: str(slurm.bin_dir / p) if slurm.bin_dir else shutil.which(p) for p in ("scontrol", "squeue")}
    assert all(real.values()), real
    (where / "squeue").symlink_to(str(real["squeue"]))
    kill = 'kill -9 "$PPID"'
    before = f"{kill}; exit 137" if when == "before" else ":"
    after = kill if when == "after" else ":"
    script = f"""#!/bin/sh
case "$*" in
  *update*ReservationName=*)
    n=$(( $(cat {where}/calls 2>/dev/null || echo 0) + 1 )); echo "$n" > {where}/calls
    if [ "$n" = {nth} ] && [ ! -e {where}/fired ]; then
      touch {where}/fired
      {before}
      {real["scontrol"]} "$@"; rc=$?; echo "$*" >> {where}/applied
      {after}
      exit $rc
    fi
    {real["scontrol"]} "$@"; rc=$?; echo "$*" >> {where}/applied; exit $rc ;;
esac
exec {real["scontrol"]} "$@"
"""
    wrapper = where / "scontrol"
    wrapper.write_text(script)
    wrapper.chmod(wrapper.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return where


def _start(factory: Any, slurm: SlurmCluster, bin_dir: Path) -> Any:
    settings = slurm.pitcrew_settings("scontrol", command_timeout=5, bin_dir=str(bin_dir))
    settings["integrations"] = {"scheduler": "slurm", "cluster": "none"}
    return factory(
        "crash",
        config={
            "mode": "auto",
            "guards": {"breaker": {"max_nodes": 10, "max_fraction": 1.0}},
            "engine": {"poll_interval": "1s"},
            "capacity": {"pools": [POOL]},
            "store": {"lease": {"ttl": "2s", "renew_every": "0.5s"}},  # the restart acts once it lapses
            **settings,
        },
        simulated=False,
    ).start()


def _killed_then_restarted(server: Any, where: Path) -> None:
    wait_until(lambda: (where / "fired").exists(), timeout=90, what="the wrapper's SIGKILL")
    assert server.process is not None
    server.process.wait(timeout=10)
    assert server.process.returncode == -9
    server.process = None
    server.start()


@pytest.mark.parametrize(("phase", "when"), BOUNDARIES, ids=[f"{p}-{w}" for p, w in BOUNDARIES])
def test_sigkill_at_every_boundary_of_take_and_give_back_leaves_the_pool_whole(
    spares: SlurmCluster, pitcrew_factory: Any, tmp_path: Path, phase: str, when: str
) -> None:
    slurm = spares
    where = _wrapped(slurm, tmp_path / "bin", 1 if phase == "take" else 2, when)
    server = _start(pitcrew_factory, slurm, where)
    job_id, node = gang_job(slurm)
    incident_id = open_incident(server, delivery("xid79-firing.json", node=node))
    if phase == "take":
        _killed_then_restarted(server, where)
    try:
        server.wait_event(incident_id, "job_running", timeout=90)
    except Exception as exc:
        raise AssertionError(_debug(server, incident_id, slurm)) from exc
    slurm.restart_slurmd(node)  # the humans' repair
    if phase == "give":
        _killed_then_restarted(server, where)
    final = server.wait_incident(incident_id, "resolved", timeout=120)

    applied = (where / "applied").read_text().splitlines()
    assert len(applied) == 2, applied  # one take, one give-back: nothing done twice
    actions = [e["data"]["action"] for e in events(final, "action")]
    assert actions.count("capacity_take") == 1 and actions.count("capacity_give_back") == 1, actions
    assert step_result(final, "capacity")["node"] == "gpu-003"
    assert reserved(slurm) == {"gpu-004", node}  # whole again: two spares, one of them the repaired node
    job = slurm.job(job_id)
    assert job is not None and job.running and set(job.nodes) == {"gpu-002", "gpu-003"}, job
    for name in ("gpu-001", "gpu-002", "gpu-003", "gpu-004"):
        state = slurm.node(name)
        assert not state.taken_out, (name, state)


def _debug(server: Any, incident_id: str, slurm: SlurmCluster) -> str:
    queue = slurm.run("squeue", "-h", "-o", "%i %T %r %N").stdout
    nodes = slurm.run("sinfo", "-h", "-N", "-o", "%N %T %E").stdout
    return f"{timeline(server, incident_id)}\nsqueue:\n{queue}\nsinfo:\n{nodes}\n{reserved(slurm)}"
