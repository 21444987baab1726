"""Slurm unreachable: the controller stops mid-incident, then comes back.

Cases (both backends):
* with slurmctld stopped, reads and node updates raise ``TransientError`` within the
  configured timeout, so the engine's step retries inside its budget and then escalates;
* nothing is lost: the DRAIN set before the outage survives the restart (StateSaveLocation);
* after the controller is back the same calls succeed, so the incident can continue.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable

import pytest

from bot.domain.ownership import is_pitcrew_reason, slurm_reason
from bot.engine.errors import TransientError
from bot.engine.ports import Scheduler
from bot.integrations.slurm import RestScheduler, SlurmSettings, build_scheduler
from proving_ground.slurm import SlurmCluster
from tests.harness.figures import show_figure

pytestmark = pytest.mark.slow
TIMEOUT = 2.0
REASON = slurm_reason("inc-outage", "XID 79 gpu1")


@pytest.mark.parametrize("backend", ["scontrol", "rest"])
async def test_controller_outage_is_transient_and_recoverable(
    slurm: SlurmCluster, backend: str, capsys: pytest.CaptureFixture[str]
) -> None:
    settings = slurm.settings(backend) | {"command_timeout": TIMEOUT, "request_timeout": TIMEOUT}
    sched = build_scheduler(SlurmSettings.model_validate(settings))
    try:
        if isinstance(sched, RestScheduler):
            await sched.api()  # discovered while healthy, as in a running service
        await sched.drain("gpu-003", REASON)

        slurm.stop_controller()
        try:
            timings = {
                "node": await _transient(lambda: sched.node("gpu-001")),
                "job": await _transient(lambda: sched.job("1")),
                "jobs_on_node": await _transient(lambda: sched.jobs_on_node("gpu-001")),
                "down": await _transient(lambda: sched.down("gpu-001", REASON)),
            }
        finally:
            slurm.start_controller()

        kept = await sched.node("gpu-003")
        assert kept.drained
        assert kept.reason == REASON
        await sched.down("gpu-001", REASON)  # the step that failed now succeeds
        assert is_pitcrew_reason((await sched.node("gpu-001")).reason)
    finally:
        await sched.aclose()
    shown = ", ".join(f"{op} {seconds:.2f}s" for op, seconds in timings.items())
    show_figure(capsys, f"\n[slurm {backend}: controller down → TransientError after] {shown}")


async def _transient(call: Callable[[], Awaitable[object]]) -> float:
    started = time.monotonic()
    with pytest.raises(TransientError) as caught:
        await call()
    elapsed = time.monotonic() - started
    assert caught.value.reason in {"timeout", "slurm_unreachable"}
    assert elapsed < TIMEOUT + 1.5
    return elapsed


@pytest.mark.parametrize("backend", ["scontrol", "rest"])
def test_both_backends_implement_the_port(slurm_cluster: SlurmCluster, backend: str) -> None:
    assert isinstance(
        build_scheduler(SlurmSettings.model_validate(slurm_cluster.settings(backend))), Scheduler
    )
