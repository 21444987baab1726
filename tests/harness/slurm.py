"""The real Slurm cluster as pytest fixtures; the cluster itself is ``proving_ground.slurm``.

``slurm_cluster`` is one cluster for the whole session (stopped and checked for survivors at
its end); ``slurm`` is that cluster reset to quiet (no jobs, every node IDLE) for each test.
``require_slurm`` skips, or under ``CI=true`` fails, when a Slurm or munge binary is missing.

Which Slurm: ``--slurm 22.05|24.11|26.05|all`` (or ``$PROVING_GROUND_SLURM``). Unset, every test runs on
Debian 12's 22.05 and the tests marked ``every_slurm`` run on 24.11 as well: the fatal-fault
remediation and the Slurm-only hand-over with both backends, the REST-only deployment, both
tracks at once and SIGKILL during them, the storm (a 4-node cluster of the test's version) and
the controller outage with both backends. Those are the paths whose Slurm output changed between
the versions (node states, reasons kept after RESUME, REST v0.0.38 against v0.0.40-42, the
slurmd start time), the one deployment only 24.11 makes possible, and the ones issue #22 names.
The rest (crash safety on the simulator, progress, drain and ownership cases, the watch, spares)
exercise pitcrew's engine against the same reads and are run on 24.11 with ``--slurm 24.11`` or
``all``, not on every CI run. One cluster per version for the session, per pytest-xdist worker
(the tests are grouped by it).
The names tests import from here (``SlurmCluster``, ``TRAIN_JOB`` ...) are the
package's, re-exported so existing imports keep working.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from bot.integrations.slurm import RestScheduler, ScontrolScheduler, SlurmSettings, build_scheduler
from proving_ground.slurm import (
    BINARIES,
    SlurmCluster,
    main,
)
from proving_ground.slurm_root import DEFAULT_VERSION, EVERY, VERSION_ENV, VERSIONS, root_missing
from tests.harness.proc import require_binary, unavailable

__all__ = [
    "BACKENDS",
    "Sched",
    "backend",
    "cloud_node",
    "power_saving",
    "require_slurm",
    "slurm",
    "slurm_cluster",
    "slurm_version",
]


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--slurm",
        choices=[*VERSIONS, "all"],
        default=None,
        help="Slurm the real-Slurm tests run against (default $PROVING_GROUND_SLURM, else 22.05 with the "
        "every_slurm tests on 24.11 too; all: every test on each)",
    )


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "every_slurm: runs against every Slurm version unless --slurm picks one"
    )
    chosen = config.getoption("--slurm")
    if chosen in VERSIONS:
        os.environ[VERSION_ENV] = chosen  # clusters a test starts itself, and the demo, follow it


def versions_for(config: pytest.Config, every_slurm: bool) -> tuple[str, ...]:
    chosen = config.getoption("--slurm") or os.environ.get(VERSION_ENV)
    if chosen == "all":
        return VERSIONS
    if chosen:
        return (chosen,)
    return EVERY if every_slurm else (DEFAULT_VERSION,)


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "slurm_version" not in metafunc.fixturenames:
        return
    versions = versions_for(
        metafunc.config, metafunc.definition.get_closest_marker("every_slurm") is not None
    )
    if len(versions) > 1:
        metafunc.parametrize("slurm_version", versions, indirect=True, scope="session")


def require_slurm(version: str = DEFAULT_VERSION) -> None:
    """Skip (or, under CI=true, fail) when a Slurm or munge binary or the version's root is missing."""
    for binary, package in BINARIES.items():
        require_binary(binary, package)
    problems = [
        *(["the Slurm harness runs slurmd as root"] if os.geteuid() != 0 else []),
        *([missing] if (missing := root_missing(version)) else []),
    ]
    if problems:
        unavailable("; ".join(problems))


@pytest.fixture(scope="session")
def slurm_version(request: pytest.FixtureRequest) -> str:
    """The Slurm version of this test's cluster (a parameter where the test runs on several)."""
    param = getattr(request, "param", None)
    return str(param) if param else versions_for(request.config, every_slurm=False)[0]


@pytest.fixture(scope="session")
def slurm_cluster(slurm_version: str) -> Iterator[SlurmCluster]:
    """One real cluster per version for the whole session; stopped (and checked) at the end."""
    require_slurm(slurm_version)
    run_dir = Path(tempfile.mkdtemp(prefix=f"pitcrew-slurm{slurm_version.replace('.', '')}-"))
    cluster = SlurmCluster(run_dir, version=slurm_version).start()
    try:
        yield cluster
    finally:
        cluster.stop()
        shutil.rmtree(run_dir, ignore_errors=True)


@pytest.fixture
def slurm(slurm_cluster: SlurmCluster) -> SlurmCluster:
    """The session cluster, reset to quiet: no jobs, every node IDLE."""
    slurm_cluster.reset()
    return slurm_cluster


#: Power saving (power_save.shtml) for the cluster's last node: programs that exit 0 (a cloud's
#: would stop and start the instance), idle 2 s before suspend; the other nodes excluded.
POWER_SAVING = (
    "SuspendProgram=/bin/true\nResumeProgram=/bin/true\nSuspendTime=2\nSuspendTimeout=1\n"
    "ResumeTimeout=60\nSuspendExcNodes={others}\n"
)


@pytest.fixture
def power_saving(slurm: SlurmCluster) -> Iterator[str]:
    """Power saving on for the cluster's last node (slurm.conf and ``scontrol reconfigure``);
    yields that node. After: no jobs, slurm.conf as before, the node awake and IDLE."""
    with _power_saving_on(slurm) as node:
        yield node


@pytest.fixture
def idle_on_node_suspend(slurm: SlurmCluster) -> Iterator[str]:
    """``power_saving`` with ``SlurmctldParameters=idle_on_node_suspend``: Slurm makes a node it
    suspends IDLE, whatever took it out (slurm.conf.5)."""
    with _power_saving_on(slurm, "SlurmctldParameters=idle_on_node_suspend\n") as node:
        assert "idle_on_node_suspend" in slurm.run("scontrol", "show", "config").stdout
        yield node


@contextlib.contextmanager
def _power_saving_on(slurm: SlurmCluster, extra: str = "") -> Iterator[str]:
    node, others = slurm.nodes[-1], ",".join(slurm.nodes[:-1])
    before = slurm.conf.read_text()
    slurm.conf.write_text(before + POWER_SAVING.format(others=others) + extra)
    slurm.run("scontrol", "reconfigure")
    try:
        assert "SuspendTime             = 2 sec" in slurm.run("scontrol", "show", "config").stdout
        yield node
    finally:
        _power_saving_off(slurm, node, before)


@pytest.fixture
def cloud_node(slurm: SlurmCluster) -> Iterator[str]:
    """The last node ``State=CLOUD`` with power saving on for it (slurm.conf edited, slurmctld
    restarted: a node's ``State=`` is read at start only); yields the node. After: slurm.conf as
    before, the node IDLE."""
    node, others = slurm.nodes[-1], ",".join(slurm.nodes[:-1])
    before = slurm.conf.read_text()
    cloud = re.sub(rf"(?m)^(NodeName={node} .*)$", r"\1 State=CLOUD", before)
    slurm.conf.write_text(cloud + POWER_SAVING.format(others=others))
    slurm.stop_controller()
    slurm.start_controller()
    try:
        slurm.restart_slurmd(node)  # a CLOUD node starts powered down: its slurmd registers it
        yield node
    finally:
        _power_saving_off(slurm, node, before)


def _power_saving_off(slurm: SlurmCluster, node: str, conf: str) -> None:
    """After ``power_saving`` or ``cloud_node``: no jobs, slurm.conf ``conf`` again, ``node`` awake
    and IDLE. A restart, not ``scontrol reconfigure``: 22.05's power saving thread ends when a
    reconfigure turns it off and never starts again (power_save.c ``start_power_mgr``), so the next
    test's reconfigure would find it gone; a new slurmctld starts with none (and reads ``State=``)."""
    slurm.run("scancel", "--full", "--user=root", check=False)
    slurm.conf.write_text(conf)
    slurm.stop_controller()
    slurm.start_controller()
    if slurm.node(node).states & {"DOWN", "DRAIN"}:
        slurm.run("scontrol", "update", f"NodeName={node}", "State=RESUME")
    slurm.restart_slurmd(node)  # registering ends its power saving states
    slurm.wait_idle()


def power_state(slurm: SlurmCluster, node: str) -> str:
    """``node``'s states as a one-node read shows them (22.05's lists, and its ``scontrol show node``,
    leave a powered-down CLOUD node out), e.g. ``down+cloud+powered_down``."""
    return slurm.run("sinfo", "-h", "-N", "-n", node, "-O", "StateComplete:200").stdout.strip()


def powered_down(slurm: SlurmCluster, node: str) -> bool:
    return "powered_down" in power_state(slurm, node)


#: pitcrew's two Slurm backends, for tests that run each against the real cluster.
BACKENDS = ("scontrol", "rest")
Sched = ScontrolScheduler | RestScheduler


@contextlib.asynccontextmanager
async def backend(slurm: SlurmCluster, name: str) -> AsyncIterator[Sched]:
    """pitcrew's Slurm backend ``name`` (of ``BACKENDS``) over ``slurm``, closed after."""
    sched = build_scheduler(SlurmSettings.model_validate(slurm.settings(name)))
    try:
        yield sched
    finally:
        await sched.aclose()


if __name__ == "__main__":  # python -m tests.harness.slurm, as before the move
    main()
