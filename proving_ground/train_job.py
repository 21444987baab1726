#!/usr/bin/env python3
"""A checkpointing "training" job for the proving ground, and how tests read its progress.

Submitted with ``sbatch --requeue --open-mode=append`` (see ``proving_ground.slurm``). Every
second it completes one step and writes, atomically, under ``$PITCREW_JOB_DIR``:

* ``ckpt/<job>.step`` — the checkpoint: the last checkpointed step, written every
  ``PITCREW_CKPT_EVERY`` steps (default 1) and at once on SIGUSR1 (``scancel --signal=USR1
  --batch``: "checkpoint now", before a planned drain), after which it holds (as a job told it is
  about to be preempted) until it is stopped. After a requeue the job starts again from this
  value, which is the whole point: progress survives the fault.
* ``progress/<job>.json`` — step, job id, Slurm node, restart count, the step it resumed
  from and timestamps, for tests.
* ``metrics/<job>.prom`` — the step as a Prometheus sample; ``ProgressServer`` serves every
  job's file at ``/metrics`` so a real Prometheus can run the PromQL progress check.
* ``events/<job>.log`` — one line per start, per SIGTERM and per checkpoint asked by SIGUSR1, a
  history across restarts.

Only the standard library: the file runs as a batch script under whatever Python the
submitter's PATH gives. It must not touch anything outside its job directory.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

METRIC = "pitcrew_train_step"
#: The last checkpointed step, beside the step (a checkpoint-before-drain waits for it to move).
CHECKPOINT_METRIC = "pitcrew_train_checkpoint_step"
_HELP = {
    METRIC: "Last completed step of the stand-in training job.",
    CHECKPOINT_METRIC: "Last checkpointed step of the stand-in training job.",
}


def _write(path: Path, text: str) -> None:
    # A half-written checkpoint after SIGKILL would lose the progress we are proving.
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def train(
    job_dir: Path, job_id: str, node: str, restarts: int, steps: int, interval: float, every: int = 1
) -> int:
    for sub in ("ckpt", "progress", "metrics", "events"):
        (job_dir / sub).mkdir(parents=True, exist_ok=True)
    ckpt = job_dir / "ckpt" / f"{job_id}.step"
    step = int(ckpt.read_text()) if ckpt.exists() and ckpt.read_text().strip() else 0
    resumed_from, started = step, time.time()
    events = job_dir / "events" / f"{job_id}.log"

    def event(kind: str) -> None:
        with events.open("a") as fh:
            fh.write(f"{time.time():.3f} {kind} node={node} restarts={restarts} step={step}\n")

    def on_term(signum: int, frame: object) -> None:
        event("SIGTERM")
        sys.exit(143)

    # A flag, not a threading.Event: a handler's Event.set takes the Event's lock, and a second
    # signal landing inside the first handler would wait for that lock for ever.
    asked: list[bool] = []

    def on_usr1(signum: int, frame: object) -> None:
        asked.append(True)  # written after the step under way, as a framework would at a step boundary

    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGUSR1, on_usr1)
    event("START")
    saved = step
    while step < steps:
        time.sleep(interval)
        step += 1
        hold = bool(asked)
        if step % every == 0 or hold:
            _write(ckpt, f"{step}\n")
            saved = step
        progress = {
            "job_id": job_id,
            "node": node,
            "restart_count": restarts,
            "step": step,
            "resumed_from": resumed_from,
            "started_at": started,
            "updated_at": time.time(),
        }
        _write(job_dir / "progress" / f"{job_id}.json", json.dumps(progress) + "\n")
        labels = f'{{job_id="{job_id}",node="{node}"}}'
        _write(
            job_dir / "metrics" / f"{job_id}.prom",
            f"{METRIC}{labels} {step}\n{CHECKPOINT_METRIC}{labels} {saved}\n",
        )
        if hold:
            event("CHECKPOINT")
            # Told it is about to be taken off the node: it saved, and trains no further here
            # (what it learned after the checkpoint would only be redone).
            while True:
                time.sleep(interval)
    event("DONE")
    return 0


def read_progress(job_dir: Path, job_id: str) -> dict[str, Any] | None:
    """The job's last progress record, or ``None`` before its first step."""
    try:
        data = json.loads((job_dir / "progress" / f"{job_id}.json").read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def read_checkpoint(job_dir: Path, job_id: str) -> int:
    """The last checkpointed step (0 before the first)."""
    try:
        return int((job_dir / "ckpt" / f"{job_id}.step").read_text())
    except (OSError, ValueError):
        return 0


def read_events(job_dir: Path, job_id: str) -> list[str]:
    try:
        return (job_dir / "events" / f"{job_id}.log").read_text().splitlines()
    except OSError:
        return []


def exposition(job_dir: Path) -> str:
    """Every job's samples, each family under one HELP/TYPE header and together (Prometheus rejects
    repeated headers and a family split by another)."""
    lines = [
        line
        for p in sorted((job_dir / "metrics").glob("*.prom"))
        for line in p.read_text().splitlines()
        if line
    ]
    out = []
    for name, words in _HELP.items():
        out += [f"# HELP {name} {words}", f"# TYPE {name} gauge"]
        out += [line for line in lines if line.startswith(name + "{")]
    return "\n".join(out) + "\n"


class ProgressServer:
    """Serves ``exposition(job_dir)`` at ``http://127.0.0.1:<port>/metrics`` from a thread."""

    def __init__(self, job_dir: Path, port: int = 0) -> None:
        directory = job_dir

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                if self.path.split("?")[0] != "/metrics":
                    self.send_error(404)
                    return
                body = exposition(directory).encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:
                return

        self._server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self._thread = threading.Thread(
            target=self._server.serve_forever, name="progress-server", daemon=True
        )

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}/metrics"

    def start(self) -> ProgressServer:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)


def main() -> int:
    env = os.environ
    return train(
        job_dir=Path(env["PITCREW_JOB_DIR"]),
        job_id=env["SLURM_JOB_ID"],
        node=env.get("SLURMD_NODENAME", "unknown"),
        restarts=int(env.get("SLURM_RESTART_COUNT", "0") or 0),
        steps=int(env.get("PITCREW_TRAIN_STEPS", "600")),
        interval=float(env.get("PITCREW_TRAIN_INTERVAL", "1.0")),
        every=max(1, int(env.get("PITCREW_CKPT_EVERY", "1"))),
    )


if __name__ == "__main__":
    sys.exit(main())
