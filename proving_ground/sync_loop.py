"""A stand-in that keeps one side of the proving ground in step with another on a thread of its own.

The slurmd stand-ins (``kubernetes.slurmd_pods``, ``kubernetes.host_slurmds``, the simulator's
machines in ``tests``) each look at what pitcrew changed on one far side and make the real Slurm
cluster follow, every ``interval`` seconds (``sync``). An error ends the loop and is kept for the
test to say (``error``), not lost in a thread.
"""

from __future__ import annotations

import threading
from typing import Any, Self


class SyncLoop:
    def __init__(self, name: str, interval: float) -> None:
        self.interval = interval
        self.error: BaseException | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    def sync(self) -> None:
        """One look, and what follows from it."""
        raise NotImplementedError

    def start(self) -> Self:
        """Start the loop (once: a second start changes nothing)."""
        if self._thread.ident is None:
            self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread.ident is not None:
            self._thread.join(timeout=30)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *_: Any) -> None:
        self.stop()

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self.sync()
            except BaseException as exc:  # said by the test (``error``), not lost in a thread
                self.error = exc
                return
