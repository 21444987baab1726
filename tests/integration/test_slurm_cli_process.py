"""Slurm's command-line tools as processes: none outlives the call that started it.

Cases: ``scontrol`` that never answers is killed at the command timeout and the call is a
transient ``timeout``; a call cancelled while ``scontrol`` runs (a step cancelled on shutdown or by
a rollback) kills it too. The ``scontrol`` here is a script standing in for a hung one: it writes
its pid and sleeps.
"""

from __future__ import annotations

import asyncio
import os
import stat
from pathlib import Path

import pytest

from bot.engine.errors import Reason, TransientError
from bot.integrations.slurm.cli import ScontrolScheduler


def _hung_scontrol(bin_dir: Path) -> Path:
    pid_file = bin_dir / "scontrol.pid"
    script = bin_dir / "scontrol"
    script.write_text(f"#!/bin/sh\necho $$ > {pid_file}\nexec sleep 600\n")
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return pid_file


async def _started(pid_file: Path) -> int:
    for _ in range(500):
        if pid_file.exists() and pid_file.read_text().strip():
            return int(pid_file.read_text())
        await asyncio.sleep(0.01)
    raise AssertionError("scontrol never started")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie is gone for our purposes only once reaped: the call waits for it.
    return Path(f"/proc/{pid}").exists()


async def test_a_hung_scontrol_is_killed_at_the_timeout(tmp_path: Path) -> None:
    pid_file = _hung_scontrol(tmp_path)
    slurm = ScontrolScheduler(bin_dir=tmp_path, command_timeout=0.5)
    with pytest.raises(TransientError) as caught:
        await slurm.node("gpu-001")
    assert caught.value.reason is Reason.TIMEOUT
    assert "no answer in 0.5s" in str(caught.value)
    assert not _alive(int(pid_file.read_text()))


async def test_a_cancelled_call_kills_its_scontrol(tmp_path: Path) -> None:
    pid_file = _hung_scontrol(tmp_path)
    slurm = ScontrolScheduler(bin_dir=tmp_path, command_timeout=60)
    call = asyncio.create_task(slurm.node("gpu-001"))
    pid = await _started(pid_file)
    assert _alive(pid)
    call.cancel()
    with pytest.raises(asyncio.CancelledError):
        await call
    assert not _alive(pid)
