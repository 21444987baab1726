"""The operator's replacement command (``kubernetes.replace.strategy: command``), run as a real
process: its output on exit 0, a permanent failure naming the last lines otherwise, a transient
one when it outlives its limit (and it is killed); a step stopped while it runs is stopped, the
command left to finish. (The limit is ``asyncio.timeout``, not ``asyncio.wait_for``, which on
Python 3.11 swallows a cancellation that comes as the command ends; that race is shown where it
hit, the store's pool, in ``test_store_contract.py``.)"""

from __future__ import annotations

import asyncio
import sys
import time
from pathlib import Path

import pytest

from bot.engine.errors import PermanentError, Reason, TransientError
from bot.integrations.kubernetes.replace import run_command

PY = sys.executable


async def test_the_output_of_a_command_that_succeeds() -> None:
    argv = [PY, "-c", "import os; print(os.environ['PITCREW_NODE'], os.environ['PITCREW_ACTION'])"]
    assert (await run_command(argv, "gpu-007", "pc-00001", "replace", 10)).split() == ["gpu-007", "replace"]


async def test_a_command_that_fails_is_a_permanent_failure_naming_its_last_lines() -> None:
    argv = [PY, "-c", "import sys; print('a'); print('b'); print('no quota left'); sys.exit(3)"]
    with pytest.raises(PermanentError, match=r"exited 3: a \| b \| no quota left") as failed:
        await run_command(argv, "gpu-007", "pc-00001", "replace", 10)
    assert failed.value.reason is Reason.COMMAND_FAILED


async def test_a_command_past_its_limit_is_killed_and_may_be_tried_again() -> None:
    began = time.monotonic()
    with pytest.raises(TransientError, match=r"timed out after 0\.3s") as failed:
        await run_command([PY, "-c", "import time; time.sleep(30)"], "gpu-007", "pc-00001", "replace", 0.3)
    assert failed.value.reason is Reason.TIMEOUT
    assert time.monotonic() - began < 10  # killed, not waited out


async def test_a_step_stopped_while_its_command_runs_is_stopped(tmp_path: Path) -> None:
    """The step ends at once; the command itself runs to its end (a provider's action is not
    killed halfway)."""
    done = tmp_path / "done"
    # The command runs long (2 s) so the step's end is seen before it even on a loaded machine: with
    # 0.3 s a test woken late could find the command already done.
    script = f"import pathlib, time; time.sleep(2); pathlib.Path({str(done)!r}).touch()"
    running = asyncio.create_task(run_command([PY, "-c", script], "gpu-007", "pc-00001", "replace", 10))
    await asyncio.sleep(0.1)
    running.cancel()
    with pytest.raises(asyncio.CancelledError):
        await running
    assert not done.exists()
    deadline = time.monotonic() + 10
    while not done.exists():
        assert time.monotonic() < deadline, "the command was not left to finish"
        await asyncio.sleep(0.05)
    await asyncio.sleep(0.1)  # its pipes closed and it reaped before the loop ends
