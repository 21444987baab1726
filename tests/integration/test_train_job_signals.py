"""The proving ground's training job, run as Slurm runs it, under a storm of "checkpoint now".

Case: a storm of SIGUSR1 (two thousand, as fast as they can be sent) is one "checkpoint now": the
job saves at the end of the step under way and holds, and stops on SIGTERM. Its handler sets a
flag, not a ``threading.Event``: an Event's ``set`` takes the Event's lock, and a second signal
landing inside the first handler waited for that lock for ever, the job hung before its checkpoint.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from proving_ground.proc import stop_process
from proving_ground.train_job import read_checkpoint, read_events, read_progress


def test_a_storm_of_checkpoint_signals_is_one_checkpoint(tmp_path: Path) -> None:
    env = {
        **os.environ,
        "PITCREW_JOB_DIR": str(tmp_path),
        "SLURM_JOB_ID": "7",
        "SLURMD_NODENAME": "gpu-node-01",
        "PITCREW_TRAIN_INTERVAL": "0.05",
        "PITCREW_CKPT_EVERY": "100000",  # no checkpoint of its own
    }
    argv = [sys.executable, "-m", "proving_ground.train_job"]
    with subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) as proc:
        try:
            deadline = time.monotonic() + 15
            while ((read_progress(tmp_path, "7") or {}).get("step", 0)) < 3:
                assert time.monotonic() < deadline, "the job made no 3 steps in 15 s"
                time.sleep(0.05)
            for _ in range(2000):
                proc.send_signal(signal.SIGUSR1)
            deadline = time.monotonic() + 10
            while not [e for e in read_events(tmp_path, "7") if " CHECKPOINT " in e]:
                assert time.monotonic() < deadline, "no checkpoint 10 s after the signals: the job hung"
                time.sleep(0.05)
            saved = read_checkpoint(tmp_path, "7")
            assert saved >= 3 and saved == (read_progress(tmp_path, "7") or {}).get("step")
            assert len([e for e in read_events(tmp_path, "7") if " CHECKPOINT " in e]) == 1
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(timeout=10) == 143
        finally:
            stop_process(proc)
