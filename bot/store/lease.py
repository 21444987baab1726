"""One actor per store: the leadership lease and the fence every engine write passes.

Two pitcrew processes on one store (a Deployment scaled to 2, a second ``serve`` started by
hand) must not both run playbooks, or every DOWN, cordon and replacement reaches the far side
twice. The store holds one ``leadership`` row: who leads (``holder``), since when, until when
(``expires_at``), and an ``epoch`` that grows by one at every change of hands — a fencing token.

* **acquire** takes the row when it is free or expired (or already ours), raising the epoch;
* **renew** extends it only while holder *and* epoch still match;
* **release** (graceful shutdown) lets it lapse at once, so a standby takes over without
  waiting out the TTL.

Expiry is judged by the store's clock alone (SQLite: the machine's clock, shared by every
process on it; Postgres: the database's ``now()``), never by the clock of the process asking,
so clock skew between processes cannot make two of them think they lead.

A ``Fence`` is what a process leads with: its holder id and the epoch it acquired. The store's
fenced view (``Store.fenced``) checks, inside each write's own transaction, that the row still
carries that holder and epoch, and raises ``Deposed`` when it does not — a process that was
paused past its lease and replaced can therefore persist no intent, and so makes no call to a far
side after the one that replaced it began. The fence also refuses locally, without asking the
store, once the lease could have lapsed: renewals failed for longer than it may lead on (the
lease's TTL less one renewal interval, measured on the process's monotonic clock from the start
of the last successful renewal).
"""

from __future__ import annotations

import os
import secrets
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime


class Deposed(RuntimeError):
    """This process does not hold the store's lease (never did, lost it, or it may have lapsed):
    it must stop acting at once and stand by. Never retried: only a new acquisition ends it."""


@dataclass(frozen=True, slots=True)
class Lease:
    """The leadership row as the store read it, with the store's clock at that moment."""

    holder: str
    epoch: int
    acquired_at: datetime
    renewed_at: datetime
    expires_at: datetime
    #: The store's clock when the row was read (expiry is judged against it, not the reader's).
    now: datetime

    @property
    def expired(self) -> bool:
        return self.expires_at <= self.now


def holder_id() -> str:
    """Who a process is in the leadership row: hostname, pid and a random part (a restarted
    process with a reused pid, or a pod with a reused name, is still someone else)."""
    return f"{socket.gethostname()}/{os.getpid()}/{secrets.token_hex(4)}"


class Fence:
    """The holder and epoch this process leads with, or nothing while it stands by.

    ``token`` is asked before every fenced write; ``Deposed`` when not leading or when the
    lease may have lapsed by the local clock. ``on_deposed`` is called (once per term) the first
    time the store refuses a write, so the process steps down without waiting for its next renewal.
    """

    def __init__(self, holder: str, *, monotonic: Callable[[], float] = time.monotonic) -> None:
        self.holder = holder
        self._monotonic = monotonic
        self.epoch: int | None = None
        self._valid_until = float("-inf")
        self._on_deposed: list[Callable[[str], None]] = []
        self._told = False

    def on_deposed(self, callback: Callable[[str], None]) -> None:
        self._on_deposed.append(callback)

    def grant(self, epoch: int, valid_until: float) -> None:
        """Lead with ``epoch`` until ``valid_until`` (monotonic) unless extended."""
        self.epoch, self._valid_until, self._told = epoch, valid_until, False

    def extend(self, valid_until: float) -> None:
        self._valid_until = max(self._valid_until, valid_until)

    def revoke(self) -> None:
        self.epoch, self._valid_until = None, float("-inf")

    @property
    def leading(self) -> bool:
        return self.epoch is not None and self._monotonic() < self._valid_until

    def token(self) -> tuple[str, int]:
        """``(holder, epoch)`` to check in the write's transaction; ``Deposed`` if not leading."""
        epoch = self.epoch
        if epoch is None:
            raise Deposed(f"{self.holder} is standing by: only the leader writes")
        if self._monotonic() >= self._valid_until:
            self.deposed(f"lease of epoch {epoch} not renewed in time: it may have lapsed")
            raise Deposed(f"{self.holder}: the lease of epoch {epoch} may have lapsed (renewals failed)")
        return self.holder, epoch

    def deposed(self, why: str) -> None:
        """The store (or the local clock) says this term is over: tell the leadership loop, once."""
        if self._told:
            return
        self._told = True
        for callback in self._on_deposed:
            callback(why)
