"""Test configuration shared by every suite.

Fixture plugins live in ``tests/harness``; each module there owns one far side, but
``tests.harness.timeouts``: every test's time limit, and the report of a test that passes it.
"""

from __future__ import annotations

import signal
import threading
from pathlib import Path

import pytest

#: Real captured data (Alertmanager, dcgm-exporter, Slurm), copied from the shared captures;
#: each folder has a README saying how it was captured.
FIXTURES = Path(__file__).resolve().parent / "fixtures"

pytest_plugins: list[str] = [
    "tests.harness.slurm",
    "tests.harness.prometheus",
    "tests.harness.postgres",
    "tests.harness.pgbouncer",
    "tests.harness.stores",
    "tests.harness.files",
    "tests.harness.pitcrew",
    "tests.harness.kubernetes",
    "tests.harness.standins",
    "tests.harness.netns",
    "tests.harness.timeouts",
    "pytester",  # tests/integration/test_timeouts.py runs hanging tests in a pytest of their own
]

#: ``--shard``: the suite in two halves that run at once (``scripts/test``), each spread over
#: pytest-xdist workers by test file. The end-to-end tests (real Slurm, Prometheus, Alertmanager,
#: the demo) spend most of their time waiting on Slurm's and pitcrew's own timers, so running them
#: beside the rest, several at a time, keeps two cores busy. Every test is in exactly one shard, by
#: its path (a new test needs no entry here): ``e2e`` is ``tests/e2e`` and the real-Slurm integration
#: tests (``WAITING_ON_SLURM``), ``rest`` the others.
SHARDS = ("e2e", "rest")
#: Beside ``tests/e2e``: the integration tests against a real Slurm cluster, which wait on its timers
#: as the end-to-end tests do (a node powered down, a job requeued); in ``rest`` they made that shard
#: the longer one by two minutes (a CI run: rest 838 s, e2e 714 s).
WAITING_ON_SLURM = ("tests/e2e/", "tests/integration/test_slurm_")


def shard_of(nodeid: str) -> str:
    return "e2e" if nodeid.startswith(WAITING_ON_SLURM) else "rest"


#: Folders whose test files run on one xdist worker, in collection order: their last test reads what
#: the others recorded in this process (``tests/slack/test_manifest.py``: the Slack scopes pitcrew
#: was seen calling, which every Slack test records).
TOGETHER = ("tests/slack/",)


#: Test files (or folders) that take a worker longest, measured (``--durations``): handed out first,
#: so that none of them starts last and holds its shard up alone at the end. The image build waits
#: on PyPI for minutes on a slow network and has few tests, so xdist's own order (most tests first)
#: put it last. Only the order changes; every test still runs in its shard.
SLOW_FIRST = (
    "tests/e2e/test_demo.py",  # one unit: its demos share "the running demo" (--click, --stop)
    "tests/e2e/test_kubernetes_spares_crash.py",
    "tests/e2e/test_replica_crash.py",
    "tests/e2e/test_slurm_spares_crash.py",
    "tests/e2e/test_slurm_spares.py",
    "tests/e2e/test_slurm_tracks.py",
    "tests/e2e/test_crash_safety.py",
    "tests/e2e/test_storm_replicas.py",
    "tests/e2e/test_fencing.py",
    "tests/e2e/test_lemon_nodes.py",
    "tests/e2e/test_slinky_same_name.py",
    "tests/e2e/test_slinky_new_name.py",
    "tests/integration/test_slurm_power_saving.py",
    "tests/integration/test_slurm_resumption.py",
    "tests/packaging/test_image.py",
    "tests/slack/",
    "tests/engine/test_metrics.py",
    "tests/integration/test_approvals.py",
    "tests/integration/test_store_loss.py",
    "tests/grafana/test_annotation_delivery.py",
)


#: Test files whose cases are handed out one by one instead of as one unit: each case is long (a SIGKILL
#: and a restart on real Slurm) and needs nothing of the file but the worker's own Slurm cluster, so
#: one worker running all of them in a row would end its shard alone.
ONE_BY_ONE = (
    "tests/e2e/test_kubernetes_spares_crash.py",
    "tests/e2e/test_replica_crash.py",
    "tests/e2e/test_slurm_spares_crash.py",
)


def _slow_rank(item: pytest.Item) -> int:
    return next(
        (rank for rank, path in enumerate(SLOW_FIRST) if item.nodeid.startswith(path)), len(SLOW_FIRST)
    )


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object:
    """``--dist loadscope`` (a test file to a worker), but each ``TOGETHER`` folder as one unit, handed
    out in collection order (``SLOW_FIRST`` first, see ``pytest_collection_modifyitems``) rather than
    by number of tests."""
    from xdist.scheduler import LoadScopeScheduling

    config.option.loadscopereorder = False

    class Scheduling(LoadScopeScheduling):  # type: ignore[misc]  # xdist ships no type hints
        def _split_scope(self, nodeid: str) -> str:
            if nodeid.startswith(ONE_BY_ONE):
                return nodeid
            folder = next((f for f in TOGETHER if nodeid.startswith(f)), None)
            return folder or super()._split_scope(nodeid)

    return Scheduling(config, log)


def _terminate_as_interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def pytest_configure(config: pytest.Config) -> None:
    """SIGTERM ends the run as Ctrl-C does: the tests' teardown stops every server they started
    (Slurm daemons, Prometheus, demos). ``scripts/test`` stops its shards with it; a CI runner's
    cancel sends it too; and a run started in the background has SIGINT ignored."""
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _terminate_as_interrupt)


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--shard",
        choices=SHARDS,
        default=None,
        help="run one of the two halves of the suite (scripts/test runs both at once)",
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    shard = config.getoption("--shard")
    if shard is None:
        return
    keep = [i for i in items if shard_of(i.nodeid) == shard]
    dropped = [i for i in items if shard_of(i.nodeid) != shard]
    if dropped:
        config.hook.pytest_deselected(items=dropped)
    items[:] = sorted(keep, key=_slow_rank)  # stable: a file's tests keep their order
