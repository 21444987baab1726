"""Every test has a time limit, and one that passes it fails saying where everything was waiting.

pytest-timeout times each test, its setup and teardown included (``timeout_func_only`` stays
false), so a hang in a fixture's teardown is caught like one in the test. This plugin adds:

- per-directory limits (``LIMITS``) under the ``timeout`` of pyproject.toml: an end-to-end test
  waits on real Slurm for minutes, a unit test never should. A test's own
  ``@pytest.mark.timeout(...)`` wins, and so do ``--timeout`` and ``PYTEST_TIMEOUT``
  (``--timeout=0`` to debug);
- what a hang in an asyncio program needs to be understood. When the limit passes, the report
  gives the stack of every thread (the main thread's too: where the event loop was), then every
  pending asyncio task of every event loop with its await chain — each coroutine it is in,
  outermost first, down to what it waits for (a future, or another task by name: who waits for
  whom) — then fails the test (pytest-timeout's ``signal`` method, raised in the main thread), and
  the run goes on with the next test; in a pytest-xdist worker (``scripts/test``) the report goes
  to the worker's stderr, the run's log (its stdout is execnet's ``/dev/null``);
- a second limit: a test still stuck ``timeout_grace`` seconds after it failed (a teardown that hangs
  again, a loop that cannot be closed) gets the report once more and ends the run, exit 1, as
  pytest-timeout's ``thread`` method would: a hung CI job is never the outcome (the servers of
  the session's fixtures are then not stopped: this is the last resort).
"""

from __future__ import annotations

import asyncio
import gc
import os
import signal
import sys
import threading
import traceback
from collections.abc import Callable, Generator, Iterator
from types import FrameType
from typing import Any

import pytest
from _pytest._io import TerminalWriter
from pytest_timeout import is_debugging

from bot.engine.tasks import await_chain

#: Seconds a test may take (setup, call and teardown), by the directory or file it is in; the
#: first prefix that matches wins, and a test elsewhere has the ``timeout`` of pyproject.toml.
LIMITS = (
    ("tests/unit/", 30.0),  # in process, pure: the slowest takes under a second
    ("tests/e2e/", 420.0),  # real Slurm, Prometheus, Alertmanager, the demo: 30-120 s alone
    # One program each, bounded at 600 s by the test itself: the image's pip build, checkov's scan.
    ("tests/packaging/test_image.py", 660.0),
    ("tests/packaging/test_checkov.py", 660.0),
)
#: Seconds a test that timed out may go on hanging before the run is ended (ini ``timeout_grace``).
GRACE = 60.0

_CANCEL = pytest.StashKey[Callable[[], None]]()


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addini(
        "timeout_grace",
        "seconds a test that timed out may go on hanging before the run is ended (tests/harness/timeouts.py)",
        default=str(GRACE),
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if config.getoption("timeout", None) is not None or os.environ.get("PYTEST_TIMEOUT"):
        return  # asked for on the command line: that limit for every test
    for item in items:
        seconds = limit_of(item.nodeid)
        if seconds is not None and item.get_closest_marker("timeout") is None:
            item.add_marker(pytest.mark.timeout(seconds))


def limit_of(nodeid: str) -> float | None:
    """The limit of the test ``nodeid`` by its directory; ``None``: the ``timeout`` ini value."""
    return next((seconds for prefix, seconds in LIMITS if nodeid.startswith(prefix)), None)


@pytest.hookimpl(tryfirst=True)
def pytest_timeout_set_timer(item: pytest.Item, settings: Any) -> bool | None:
    """Arm SIGALRM for ``settings.timeout`` seconds; for the ``thread`` method, or off the main
    thread, pytest-timeout's own timer (its report has the threads, not the tasks)."""
    if settings.method != "signal" or threading.current_thread() is not threading.main_thread():
        return None
    grace = float(item.config.getini("timeout_grace"))

    def stuck(signum: int, frame: FrameType | None) -> None:
        _report(
            item, frame, f"{item.nodeid} still stuck {grace:g}s after it timed out: ending the run", last=True
        )
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(1)

    def expired(signum: int, frame: FrameType | None) -> None:
        __tracebackhide__ = True
        if not settings.disable_debugger_detection and is_debugging():
            return
        _report(item, frame, f"{item.nodeid} timed out after {settings.timeout:g}s")
        signal.signal(signal.SIGALRM, stuck)
        signal.setitimer(signal.ITIMER_REAL, grace)
        pytest.fail(
            f"Timeout (>{settings.timeout:g}s): the stacks of every thread and every pending asyncio "
            "task are printed above",
            pytrace=True,
        )

    def cancel() -> None:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, signal.SIG_DFL)

    item.stash[_CANCEL] = cancel
    signal.signal(signal.SIGALRM, expired)
    signal.setitimer(signal.ITIMER_REAL, settings.timeout)
    return True


@pytest.hookimpl(tryfirst=True)
def pytest_timeout_cancel_timer(item: pytest.Item) -> bool | None:
    """pytest-timeout disarms at the end of the test, and also as soon as a phase fails (for the
    debugger): the limit would then not bind the teardown of a failed test, nor end a teardown
    that hangs after a timeout. The timer set here stays armed until ``pytest_runtest_protocol``
    is over (a debugger stops it anyway: ``is_debugging``)."""
    if _CANCEL not in item.stash:
        return None  # pytest-timeout's own timer, if it set one
    return True


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_protocol(item: pytest.Item) -> Generator[None, object, object]:
    try:
        return (yield)
    finally:
        cancel = item.stash.get(_CANCEL, None)
        if cancel is not None:
            del item.stash[_CANCEL]
            cancel()


def _report(item: pytest.Item, frame: FrameType | None, title: str, *, last: bool = False) -> None:
    """The report on the terminal at once, past pytest's capture (the run may not end well);
    ``last``: with what the test had printed, which nobody will report otherwise."""
    capture = item.config.pluginmanager.getplugin("capturemanager")
    if capture is not None:
        capture.suspend_global_capture(in_=True)
    try:
        # A pytest-xdist worker's stdout is /dev/null (execnet carries the worker's channel on
        # the original): its report goes to its stderr, which is the run's (scripts/test's log).
        in_worker = hasattr(item.config, "workerinput")
        writer = TerminalWriter(sys.stderr) if in_worker else item.config.get_terminal_writer()
        writer.line()
        writer.sep("+", title)
        if last and capture is not None:
            for name, text in zip(("stdout", "stderr"), capture.read_global_capture(), strict=True):
                if text:
                    writer.sep("~", f"captured {name}")
                    writer.write(text)
        writer.write(hang_report(frame))
        writer.sep("+", "end of the timeout report")
        writer.flush()
    finally:
        if capture is not None and not last:
            capture.resume_global_capture()


def hang_report(interrupted: FrameType | None = None) -> str:
    """Every thread's stack, then every pending asyncio task's await chain, as text.

    ``interrupted``: the frame the calling thread was in (a signal handler's ``frame``), shown as
    that thread's stack instead of the report's own frames."""
    return "".join([*_threads(interrupted), *_tasks()])


def _threads(interrupted: FrameType | None) -> Iterator[str]:
    names = {thread.ident: thread for thread in threading.enumerate()}
    for ident, frame in sys._current_frames().items():
        thread = names.get(ident)
        name = thread.name if thread is not None else "<unknown>"
        if ident == threading.get_ident() and interrupted is not None:
            frame = interrupted
        yield f"\n--- thread {name} ({ident}){' daemon' if thread is not None and thread.daemon else ''}\n"
        yield "".join(traceback.format_stack(frame))


def _tasks() -> Iterator[str]:
    for loop in _loops():
        tasks = [t for t in asyncio.all_tasks(loop) if not t.done()]
        state = "running" if loop.is_running() else "not running"
        yield f"\n=== asyncio: {len(tasks)} pending task(s) of {type(loop).__name__} {id(loop):#x} ({state})\n"
        for task in sorted(tasks, key=lambda t: t.get_name()):
            yield describe_task(task)


def _loops() -> list[asyncio.AbstractEventLoop]:
    """Every event loop of the process that is not closed: the main thread's and any other thread's."""
    return [o for o in gc.get_objects() if isinstance(o, asyncio.AbstractEventLoop) and not o.is_closed()]


def describe_task(task: asyncio.Task[Any]) -> str:
    """A task's name, state, await chain (outermost coroutine first) and what it waits for."""
    coro = task.get_coro()
    cancelling = f", cancelled {task.cancelling()} time(s) and still running" if task.cancelling() else ""
    lines = [f"\n- task {task.get_name()!r} ({getattr(coro, '__qualname__', coro)}){cancelling}\n"]
    summary = traceback.StackSummary.extract((frame, frame.f_lineno) for frame in await_chain(coro))
    lines += ["  " + line.replace("\n", "\n  ").rstrip(" ") for line in summary.format()]
    waiter = getattr(task, "_fut_waiter", None)  # the future the task is parked on (CPython)
    if waiter is not None:
        lines.append(f"    waiting for {waiter!r}\n")
    return "".join(lines)
