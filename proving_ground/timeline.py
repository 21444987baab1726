"""The demo's live timeline: one line per milestone as it happens, a progress indicator on every wait.

Owns how the story is told, not what happens: the run calls ``mark`` when it sees a milestone
and ``waiting`` around every wait. On an interactive terminal the wait is a rich spinner with
the seconds elapsed; elsewhere (CI logs, pipes) it is one plain ``… waiting for X`` line and a
``still waiting`` line every ``heartbeat`` seconds, so a log always shows progress.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import IO, Any

#: The milestones of a recovery, in the order the story tells them.
MILESTONES = {
    "fault": "fault injected",
    "firing": "alert firing (Prometheus)",
    "webhook": "webhook received (pitcrew)",
    "notified": "Slack thread opened",
    "approval": "waiting for approval",
    "approved": "approved",
    "slurm_down": "Slurm node DOWN",
    "cordon": "Kubernetes node cordoned",
    "drain": "Kubernetes node drained",
    "reset_gpu": "GPU reset",
    "reboot": "node rebooted",
    "replace": "replacement requested",
    "node_ready": "replacement Ready, slurmd registered again",
    "job_running": "job RUNNING elsewhere",
    "job_progress": "job past its checkpoint",
    "closed": "incident closed",
}


@dataclass(frozen=True, slots=True)
class Mark:
    key: str
    at: float  # Unix time
    detail: str

    @property
    def label(self) -> str:
        return MILESTONES.get(self.key, self.key)


class Timeline:
    """Milestones relative to a start time, printed as they come."""

    def __init__(
        self, out: IO[str] | None = None, *, rich: bool | None = None, heartbeat: float = 10.0
    ) -> None:
        self.out = out or sys.stdout
        self.rich = self.out.isatty() if rich is None else rich
        self.heartbeat = heartbeat
        self.marks: list[Mark] = []
        self.t0: float | None = None
        self._console: Any = None
        if self.rich:
            from rich.console import Console

            self._console = Console(file=self.out, highlight=False)

    # ------------------------------------------------------------------ output
    def say(self, text: str, style: str = "") -> None:
        if self._console is not None:
            self._console.print(text, style=style or None, markup=False)
        else:
            print(text, file=self.out, flush=True)

    def mark(self, key: str, detail: str = "", at: float | None = None) -> Mark:
        """Record a milestone (once per key: the first sighting wins) and print it."""
        existing = self.at(key)
        if existing is not None:
            return next(m for m in self.marks if m.key == key)
        when = time.time() if at is None else at
        if self.t0 is None:
            self.t0 = when
        m = Mark(key, when, detail)
        self.marks.append(m)
        clock = datetime.fromtimestamp(when, UTC).strftime("%H:%M:%S.%f")[:-3]
        line = f"  {clock}  +{when - self.t0:7.2f}s  {m.label}" + (f" — {detail}" if detail else "")
        self.say(line, "bold green" if key in {"job_progress", "closed"} else "")
        return m

    def at(self, key: str) -> float | None:
        return next((m.at for m in self.marks if m.key == key), None)

    def between(self, start: str, end: str) -> float | None:
        a, b = self.at(start), self.at(end)
        return None if a is None or b is None else b - a

    @contextmanager
    def waiting(self, what: str) -> Iterator[None]:
        """A progress indicator for the duration of one wait."""
        began = time.monotonic()
        if self._console is not None:
            with self._console.status(f"waiting for {what}…") as status:
                stop = threading.Event()

                def tick() -> None:
                    while not stop.wait(0.5):
                        status.update(f"waiting for {what}… {time.monotonic() - began:.0f}s")

                ticker = threading.Thread(target=tick, daemon=True)
                ticker.start()
                try:
                    yield
                finally:
                    stop.set()
                    ticker.join()
            return
        self.say(f"  … waiting for {what}")
        stop = threading.Event()

        def beat() -> None:
            while not stop.wait(self.heartbeat):
                self.say(f"  … still waiting for {what} ({time.monotonic() - began:.0f}s)")

        beater = threading.Thread(target=beat, daemon=True)
        beater.start()
        try:
            yield
        finally:
            stop.set()
            beater.join()
