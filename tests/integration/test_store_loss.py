"""The store's files lost or unwritable under a running ``pitcrew serve``: a 200 is never lost.

Each case runs the real ``pitcrew serve`` with its store in a directory of its own, while one
thread delivers alerts for a new node after another and another polls ``/readyz``, each
request stamped when it was sent:

- the directory deleted (``rm -rf``): every delivery sent afterwards — new alerts, and a
  redelivery of alerts stored before — gets 503, never 200; the first ``/readyz`` asked
  afterwards, and every later one, is 503; after a restart (a new, empty store) the refused
  deliveries are redelivered and stored.
- the directory moved away: the same; moved back, a restart finds every delivery that got 200.
- the directory and its files made read-only (``chattr +i``, which binds root too): the same;
  writable again, a restart finds every delivery that got 200.
- disk full (the store on a 16 MiB tmpfs, filled up): deliveries get 503 (SQLite's
  SQLITE_FULL), and from the first of them every ``/readyz`` is 503; with room again
  ``/readyz`` turns 200, deliveries get 200, and a restart finds every delivery that got 200.
- a read-only database file at start: pitcrew serves, the webhook answers 503 and ``/readyz``
  503; writable again, a restart takes the redelivery and still has what was stored before.
- in process, the commit itself is checked: an engine write (which does not pass the
  webhook's check) committed into a file no longer at the store's path fails; with the file
  back in place the next write succeeds and the store is ready again.

How fast ``/readyz`` turned is printed (``-s``), not asserted: the design makes it exact —
every readiness check looks at the files itself, so the first check after the loss fails.
"""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from bot.store.base import NewEvent, StoreUnavailable
from bot.store.sqlite import SqliteStore
from tests.harness.pitcrew import Pitcrew
from tests.harness.proc import unavailable, wait_until
from tests.harness.scenarios import delivery


@dataclass
class Flow:
    """Deliveries for a new node each, one after another, and /readyz polls, each stamped."""

    server: Pitcrew
    gap: float = 0.02  # seconds between deliveries
    deliveries: list[tuple[float, str, int]] = field(default_factory=list)  # (sent, node, status)
    answered: dict[str, float] = field(default_factory=dict)  # node -> when its delivery was answered
    polls: list[tuple[float, float, int]] = field(default_factory=list)  # (sent, answered, status)
    bodies: dict[str, bytes] = field(default_factory=dict)
    _stop: threading.Event = field(default_factory=threading.Event)
    _threads: list[threading.Thread] = field(default_factory=list)

    def __enter__(self) -> Flow:
        self._threads = [threading.Thread(target=self._deliver), threading.Thread(target=self._poll)]
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=60)

    def _deliver(self) -> None:
        number = 0
        while not self._stop.is_set():
            number += 1
            node = f"gpu-{number:04d}"
            self.bodies[node] = body = delivery(node=node)
            sent = time.monotonic()
            status, _ = self.server.post_alerts(body)
            self.answered[node] = time.monotonic()
            self.deliveries.append((sent, node, status))
            time.sleep(self.gap)

    def _poll(self) -> None:
        while not self._stop.is_set():
            sent = time.monotonic()
            status, _ = self.server.request("GET", "/readyz")
            self.polls.append((sent, time.monotonic(), status))
            time.sleep(0.01)

    def wait(self, deliveries: int, after: float = 0.0) -> None:
        """Until ``deliveries`` deliveries and three polls sent after ``after`` were answered."""
        wait_until(
            lambda: (
                sum(sent > after for sent, _, _ in self.deliveries) >= deliveries
                and sum(sent > after for sent, _, _ in self.polls) >= 3
            ),
            timeout=60,
            what=f"{deliveries} deliveries after the change",
        )

    def acknowledged(self) -> set[str]:
        return {node for _, node, status in self.deliveries if status == 200}

    def statuses_after(self, moment: float) -> set[int]:
        return {status for sent, _, status in self.deliveries if sent > moment}

    def readiness_after(self, moment: float) -> list[tuple[float, float, int]]:
        return [poll for poll in self.polls if poll[0] > moment]


def _report(case: str, moment: float, polls: list[tuple[float, float, int]]) -> None:
    turned = next(answered for _, answered, status in polls if status == 503)
    print(f"\n{case}: /readyz 503 {1000 * (turned - moment):.1f} ms after the change")


def _fill(path: Path) -> None:
    """Write zeros to ``path`` until the filesystem has no room left (ENOSPC)."""
    with path.open("wb", buffering=0) as out, contextlib.suppress(OSError):
        while True:
            out.write(b"\0" * 4096)


def _stored(server: Pitcrew) -> set[str]:
    return {incident["node"] for incident in server.incidents()}


@pytest.fixture
def state_server(pitcrew_factory: Callable[..., Pitcrew], tmp_path: Path) -> Iterator[tuple[Pitcrew, Path]]:
    """The real ``pitcrew serve`` with its store in ``state/`` (config and tokens elsewhere)."""
    state = tmp_path / "pitcrew" / "state"
    server = pitcrew_factory(
        config={
            "store": {"path": str(state / "pitcrew.db")},
            "integrations": {"journal_path": str(tmp_path / "dry-run-journal.jsonl")},
        },
        simulated=False,
    )
    yield server, state
    server.stop()


@pytest.fixture
def small_fs(tmp_path: Path) -> Iterator[Callable[[Path], None]]:
    """Mount a 16 MiB tmpfs on a directory (root only); unmounted at teardown. Tests ask for it
    before the server, so that the server has stopped by then."""
    mounted: list[Path] = []

    def mount(path: Path) -> None:
        path.mkdir(parents=True, exist_ok=True)
        done = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", "size=16m", "tmpfs", str(path)], capture_output=True
        )
        if done.returncode != 0:
            unavailable(f"cannot mount a tmpfs (needs root): {done.stderr.decode().strip()}")
        mounted.append(path)

    yield mount
    for path in mounted:
        if subprocess.run(["umount", str(path)], capture_output=True).returncode != 0:
            subprocess.run(["umount", "-l", str(path)], capture_output=True)


def _lose(server: Pitcrew, flow: Flow, change: Callable[[], Any], case: str) -> float:
    """Deliveries flow, ``change`` happens; every delivery and /readyz afterwards is 503."""
    flow.wait(10)
    change()
    moment = time.monotonic()
    flow.wait(10, after=moment)
    assert flow.statuses_after(moment) == {503}, flow.deliveries
    polls = flow.readiness_after(moment)
    assert [status for _, _, status in polls] == [503] * len(polls), polls
    _report(case, moment, polls)
    return moment


def test_deleted_directory_acknowledges_nothing(state_server: tuple[Pitcrew, Path]) -> None:
    server, state = state_server
    server.start()
    with Flow(server) as flow:
        _lose(server, flow, lambda: shutil.rmtree(state), "directory deleted")
        before = next(node for _, node, status in flow.deliveries if status == 200)
        status, _ = server.post_alerts(flow.bodies[before])  # a redelivery of alerts stored before
        assert status == 503
    refused = [node for _, node, status in flow.deliveries if status == 503]
    server.stop()
    server.start()  # the directory is gone: a new, empty store
    for node in refused:  # Alertmanager redelivers what it was refused
        assert server.post_alerts(flow.bodies[node])[0] == 200
    server.stop()
    server.start()
    assert set(refused) <= _stored(server)


def test_moved_directory_keeps_every_acknowledged_delivery(state_server: tuple[Pitcrew, Path]) -> None:
    server, state = state_server
    server.start()
    moved = state.with_name("state.moved")
    with Flow(server) as flow:
        _lose(server, flow, lambda: state.rename(moved), "directory moved")
    server.stop()
    moved.rename(state)
    server.start()
    acknowledged = flow.acknowledged()
    assert acknowledged and acknowledged <= _stored(server)


def test_read_only_directory_keeps_every_acknowledged_delivery(
    immutable: Callable[..., None], state_server: tuple[Pitcrew, Path]
) -> None:
    server, state = state_server
    server.start()
    files = [state / "pitcrew.db", state / "pitcrew.db-wal", state]
    with Flow(server) as flow:
        _lose(server, flow, lambda: immutable(*files), "directory made read-only")
    server.stop()
    immutable(*files, on=False)
    server.start()
    acknowledged = flow.acknowledged()
    assert acknowledged and acknowledged <= _stored(server)


def test_disk_full_turns_readiness(
    small_fs: Callable[[Path], None], state_server: tuple[Pitcrew, Path]
) -> None:
    server, state = state_server
    small_fs(state)
    server.start()
    filler = state / "filler"
    with Flow(server, gap=0.05) as flow:
        flow.wait(5)
        _fill(filler)
        wait_until(
            lambda: 503 in flow.statuses_after(float("-inf")),
            timeout=60,
            what="a delivery refused for lack of room",
        )
        # From the first refusal's answer on: a poll sent while that delivery was still being
        # written may rightly have been answered 200.
        refused = min(flow.answered[node] for _, node, status in flow.deliveries if status == 503)
        flow.wait(5, after=refused)
        polls = flow.readiness_after(refused)
        assert [status for _, _, status in polls] == [503] * len(polls), polls
        _report("disk full", refused, polls)
        filler.unlink()
        wait_until(
            lambda: server.request("GET", "/readyz")[0] == 200, timeout=30, what="/readyz 200 with room"
        )
        recovered = time.monotonic()
        flow.wait(5, after=recovered)
        assert 200 in flow.statuses_after(recovered)
    assert "database or disk is full" in server.log.read_text()
    server.stop()
    server.start()
    acknowledged = flow.acknowledged()
    assert acknowledged <= _stored(server)


def test_read_only_database_at_start_is_not_ready(
    immutable: Callable[..., None], state_server: tuple[Pitcrew, Path]
) -> None:
    server, state = state_server
    server.start()
    assert server.post_alerts(delivery(node="gpu-before"))[0] == 200
    server.stop()
    immutable(state / "pitcrew.db")
    server.start(ready=False)
    body = delivery(node="gpu-after")
    status, answer = server.post_alerts(body)
    assert status == 503, answer
    assert server.request("GET", "/readyz")[0] == 503
    assert server.incidents()  # what was stored before is still served
    server.stop()
    immutable(state / "pitcrew.db", on=False)
    server.start()
    assert server.post_alerts(body)[0] == 200
    assert {"gpu-before", "gpu-after"} <= _stored(server)


async def test_a_commit_into_a_moved_file_fails(tmp_path: Path) -> None:
    state, moved = tmp_path / "state", tmp_path / "moved"
    store = SqliteStore(state / "pitcrew.db")
    await store.open()
    try:
        now = datetime.now(UTC)
        await store.record(None, NewEvent("before"), now)
        state.rename(moved)
        with pytest.raises(StoreUnavailable, match="is gone: a restart would not find this write"):
            await store.record(None, NewEvent("moved"), now)
        assert not await store.ping()
        moved.rename(state)
        await store.record(None, NewEvent("back"), now)
        assert await store.ping()
        assert [e.kind for e in await store.events_since(0)] == ["before", "moved", "back"]
    finally:
        await store.close()
