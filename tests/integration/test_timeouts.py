"""A test that hangs fails at its time limit, saying where every thread and every task waits.

Each case runs deliberately hanging tests in a pytest of their own (pytester, a subprocess) with
``tests.harness.timeouts`` and a 2 s limit:

- a test whose body hangs (awaiting a task that waits for a thread that never answers) fails
  with the timeout; the report has every thread's stack (the stuck thread's by name, the main
  thread's at the event loop) and every pending asyncio task with its await chain, down to
  the coroutine each waits in; the run goes on: the next test passes; the same in a
  pytest-xdist worker (``scripts/test``), whose report comes on the run's stderr;
- a fixture whose teardown hangs (it stops a worker that swallows its cancellation once, the
  shape of the shutdown hang in tests/integration/test_shutdown_hang.py) is caught in teardown
  too: the test passed, its teardown errors with the report (the teardown awaiting the worker,
  the worker back in its wait);
- a worker that swallows every cancellation keeps even the event loop's closing stuck: the
  report comes again ``timeout_grace`` seconds later and the run ends, exit 1.

The per-directory limits: a unit test has 30 s, an end-to-end test 420 s,
a test elsewhere the ``timeout`` of pyproject.toml (180 s, setup and teardown included).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.harness import timeouts

REPO = Path(__file__).resolve().parents[2]
LIMITS = [
    *("-p", "tests.harness.timeouts", "-p", "no:cloudcoil", "--timeout=2", "-o", "timeout_grace=2"),
    *("-o", "asyncio_mode=auto", "-o", "asyncio_default_fixture_loop_scope=function"),
]

HANGS = """
import asyncio
import threading

stuck = threading.Event()


def hold():
    stuck.wait()  # the thread the read waits for, which never answers


async def held_read():
    answer = asyncio.get_running_loop().create_future()
    threading.Thread(target=hold, name="holder", daemon=True).start()
    await answer


async def test_the_body_hangs():
    read = asyncio.create_task(held_read(), name="read")
    await read


def test_the_next_test_runs():
    stuck.set()
"""

TEARDOWN = """
import asyncio

import pytest


async def swallows_cancellation(times):
    while True:
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            if times == 0:
                raise
            times -= 1


@pytest.fixture
async def service(request):
    worker = asyncio.create_task(swallows_cancellation(request.param), name="stubborn-worker")
    yield worker
    worker.cancel()
    await worker


@pytest.mark.parametrize("service", [SWALLOWS], indirect=True)
async def test_the_teardown_hangs(service):
    await asyncio.sleep(0)
"""


@pytest.fixture
def isolated(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> pytest.Pytester:
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
    monkeypatch.delenv("PYTEST_TIMEOUT", raising=False)
    monkeypatch.delenv("PYTEST_ADDOPTS", raising=False)
    return pytester


def test_a_hanging_test_fails_with_every_thread_and_task(isolated: pytest.Pytester) -> None:
    isolated.makepyfile(test_hangs=HANGS)
    result = isolated.runpytest_subprocess(*LIMITS, timeout=120)
    result.assert_outcomes(failed=1, passed=1)
    has_the_hang_report(result.stdout.str())


def test_a_hang_in_an_xdist_worker_is_reported_in_the_runs_output(isolated: pytest.Pytester) -> None:
    """scripts/test spreads each shard over pytest-xdist workers, whose stdout execnet sends to
    /dev/null: the report comes on the worker's stderr, which is the run's."""
    isolated.makepyfile(test_hangs=HANGS)
    result = isolated.runpytest_subprocess(*LIMITS, "-n", "1", timeout=120)
    result.assert_outcomes(failed=1, passed=1)
    has_the_hang_report(result.stdout.str() + result.stderr.str())


def has_the_hang_report(out: str) -> None:
    assert "test_hangs.py::test_the_body_hangs timed out after 2s" in out
    assert "Timeout (>2s): the stacks of every thread and every pending asyncio task" in out
    # Every thread: the one stuck by name, the executor's, and the main one in the event loop.
    assert "--- thread holder (" in out
    assert "in hold\n    stuck.wait()" in out
    assert "--- thread MainThread (" in out and "in run_until_complete" in out
    # Every pending task, with its await chain and what it waits for: who waits for whom.
    assert "- task 'read' (held_read)" in out
    assert "in held_read\n" in out
    assert "in test_the_body_hangs\n" in out
    assert "waiting for <Task pending name='read'" in out


@pytest.mark.parametrize(("swallows", "ends"), [(1, "with an error"), (1000, "the run")])
def test_a_hang_in_a_fixture_teardown_is_caught(isolated: pytest.Pytester, swallows: int, ends: str) -> None:
    isolated.makepyfile(test_teardown=TEARDOWN.replace("SWALLOWS", str(swallows)))
    result = isolated.runpytest_subprocess(*LIMITS, timeout=120)
    out = result.stdout.str()
    assert "test_the_teardown_hangs[" in out and "timed out after 2s" in out
    # The teardown's await chain: the fixture's finaliser awaiting the worker, and the worker,
    # cancelled once already, back in its sleep.
    assert "in service\n" in out and "await worker" in out
    assert "- task 'stubborn-worker' (swallows_cancellation), cancelled 1 time(s) and still running" in out
    if ends == "with an error":
        result.assert_outcomes(passed=1, errors=1)
        assert "still stuck" not in out
    else:
        # pytest-asyncio cancels the worker again to close its loop, in vain: the second limit.
        assert "still stuck 2s after it timed out: ending the run" in out
        assert result.ret == 1
        assert "passed" not in out.splitlines()[-1]


@pytest.mark.parametrize(
    ("nodeid", "seconds"),
    [
        ("tests/unit/test_fleet.py::test_x", 30),
        ("tests/engine/test_metrics.py::test_x[a]", None),  # a thousand incidents: 50 s under load
        ("tests/e2e/test_demo.py::test_x", 420),
        ("tests/integration/test_webhook.py::test_x", None),  # pyproject.toml's timeout
        ("tests/slack/test_inbound.py::test_x", None),
        ("tests/packaging/test_image.py::test_x", 660),  # its pip build may take 600 s
        ("tests/packaging/test_manifests.py::test_x", None),
    ],
)
def test_each_directory_has_its_limit(nodeid: str, seconds: float | None) -> None:
    assert timeouts.limit_of(nodeid) == seconds


def test_this_suite_runs_under_the_limits(request: pytest.FixtureRequest) -> None:
    assert request.config.getini("timeout") == "180"
    assert request.config.getini("timeout_func_only") is False  # setup and teardown count
    assert request.node.get_closest_marker("timeout") is None  # tests/integration: pyproject's
