"""Stopping the service ends every worker, wherever the stop finds it: no shutdown waits for ever.

Cases, in process over real HTTP (aiohttp's ``TestServer``: its ``close()`` runs the
application's cleanup, what ``pitcrew serve`` runs on SIGTERM):

- an observe-mode incident whose alert fires is watched: its worker waits on the incident's
  signal. An alert delivery signals it just as the service stops: 0 to 11 loop iterations into
  the application's cleanup (a task of the test's, started by a cleanup step of the test's
  that runs right before pitcrew's own), so that the engine's stop falls at every point of the
  woken wait's way back. The close ends, and the worker ended cancelled. (Before the fix, a
  signal 2 to 4 iterations in hung it: the worker's wait, ``asyncio.wait_for`` on Python 3.11,
  returned "woken" to the cancelled worker, which went on watching its incident, and
  ``Engine.stop`` waited for it for ever — the hang seen in the teardown of
  ``test_read_api.py::test_a_webhook_is_answered_while_a_read_is_held``.)
- a write reaching the store 0 to 3 iterations after its close began is committed or refused
  with ``StoreUnavailable``, and the close ends. (Before: it stayed in the writer's queue with
  nobody to run it, and its caller waited for ever.)

And ``pitcrew serve`` itself (the CLI, a subprocess, the same cleanup on SIGTERM): with 40
observe-mode incidents watched and deliveries of new alerts for their nodes waking their
workers all the time, SIGTERM ends it with exit 0, in each of two rounds (a restart on the
same store resumes the watching). From outside the process the stop cannot be placed at a loop
iteration: this case passed before the fix too (6 SIGTERMs of 6, in three-round runs); the cases above are the ones
that place it.
"""

from __future__ import annotations

import asyncio
import copy
import json
import signal
import subprocess
import threading
from collections.abc import AsyncIterator, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from aiohttp import ClientSession, web
from aiohttp.test_utils import TestServer

from bot.config import load_config
from bot.engine.engine import Engine
from bot.engine.leadership import Leadership
from bot.engine.tasks import await_chain
from bot.runtime import build_app
from bot.store.base import StoreUnavailable
from bot.store.sqlite import SqliteStore
from bot.web.app import DEPS
from tests.conftest import FIXTURES
from tests.harness.pitcrew import Pitcrew
from tests.harness.proc import wait_until
from tests.harness.timeouts import describe_task
from tests.simulator.serve import WorldFile, simulated_ports

XID79 = (FIXTURES / "alertmanager" / "xid79-firing.json").read_bytes()
#: A close takes well under a second; one that has not ended after this has hung.
HUNG = 30.0


def _engine(app: web.Application) -> Engine:
    """The engine, which runs under the leadership loop (only while this process leads)."""
    leading = [worker for worker in app[DEPS].background if isinstance(worker, Leadership)]
    [engine] = [worker for each in leading for worker in each.workers if isinstance(worker, Engine)]
    return engine


def _task(name: str) -> asyncio.Task[Any] | None:
    return next((t for t in asyncio.all_tasks() if t.get_name() == name and not t.done()), None)


async def _watching(incident: str) -> asyncio.Task[Any]:
    """The incident's worker once it waits on the incident's signal (an observe-mode incident
    whose alert fires is watched until the alert resolves)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + HUNG
    while loop.time() < deadline:
        task = _task(incident)
        if task is not None and any(
            frame.f_code.co_name == "wait" and frame.f_code.co_filename.endswith("bot/engine/signals.py")
            for frame in await_chain(task.get_coro())
        ):
            return task
        await asyncio.sleep(0.01)
    raise AssertionError(f"{incident}'s worker never waited on its signal: {_task(incident)!r}")


@pytest.mark.parametrize("iterations", range(12))
async def test_a_stop_just_after_a_signal_ends_the_watching_worker(tmp_path: Path, iterations: int) -> None:
    (tmp_path / "webhook").write_text("webhook-token\n")
    config = load_config(
        None,
        store={"path": str(tmp_path / "pitcrew.db")},
        server={"auth": {"bearer_token_file": str(tmp_path / "webhook")}},
        engine={"poll_interval": "0.1s"},
    )
    app = build_app(
        config, ports=simulated_ports(config, WorldFile(journal=tmp_path / "j.jsonl")), allow_simulated=True
    )
    engine = _engine(app)
    watched: list[str] = []
    signalling: list[asyncio.Task[None]] = []

    async def signal_later() -> None:
        for _ in range(iterations):
            await asyncio.sleep(0)
        for incident in watched:
            engine.signal(incident)  # what a delivery attaching an alert to the incident does

    async def signal_as_the_service_stops(app: web.Application) -> AsyncIterator[None]:
        # Torn down right before pitcrew's own cleanup (cleanup contexts end in reverse order):
        # the signal comes ``iterations`` loop iterations into pitcrew's cleanup.
        yield
        signalling.append(asyncio.create_task(signal_later()))

    app.cleanup_ctx.append(signal_as_the_service_stops)
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    closing: asyncio.Task[None] | None = None
    try:
        async with ClientSession(base_url=str(server.make_url(""))) as client:
            headers = {"Authorization": "Bearer webhook-token"}
            async with client.post("/api/v1/alerts", data=XID79, headers=headers) as response:
                assert response.status == 200
                [incident] = (await response.json())["opened"]
        worker = await _watching(incident)
        watched.append(incident)
        closing = asyncio.create_task(server.close())
        done, _ = await asyncio.wait({closing}, timeout=HUNG)
        if not done:
            stuck = describe_task(worker)
            while not closing.done():  # let the test end: stop the stuck worker for real
                worker.cancel()
                await asyncio.wait({closing}, timeout=1)
            pytest.fail(f"the server's close never ended: it waited for {incident}'s worker\n{stuck}")
        await closing
        # Ended: cancelled, or (the lease released first at the step-down) stopped by its fence.
        assert worker.done()
        assert not engine.running
    finally:
        if closing is None:
            await server.close()


@pytest.mark.parametrize("iterations", range(4))
async def test_a_write_submitted_as_the_store_closes_is_answered(tmp_path: Path, iterations: int) -> None:
    """A write reaches the store ``iterations`` loop iterations after its close began: it is
    committed, or refused with ``StoreUnavailable``, and the close ends. (Before: a write that
    came after the writer's queue had drained, while the writer stopped, stayed in the queue with
    nobody to run it, and its caller waited for ever.)"""
    store = SqliteStore(tmp_path / "pitcrew.db")
    await store.open()
    now = datetime.now(UTC)
    closing = asyncio.ensure_future(store.close())
    for _ in range(iterations):
        await asyncio.sleep(0)
    writing = asyncio.ensure_future(store.set_switch("pause", {"reason": "drill"}, "alice", now))
    done, _ = await asyncio.wait({writing, closing}, timeout=HUNG)
    for task in (writing, closing):
        while not task.done():  # let the test end: stop what hangs for real
            for each in asyncio.all_tasks():
                if each.get_name() == "pitcrew-store-writer":
                    each.cancel()
            task.cancel()
            await asyncio.wait({task}, timeout=1)
    assert closing in done, "the store's close never ended"
    assert writing in done, "the write was never answered"
    if writing.exception() is not None:
        assert isinstance(writing.exception(), StoreUnavailable)
    else:
        reopened = SqliteStore(tmp_path / "pitcrew.db")
        await reopened.open()
        try:
            assert await reopened.switch("pause") is not None
        finally:
            await reopened.close()


NODES = 40


def _alerts_for_every_node(round_: int) -> bytes:
    """One delivery: a new XID 79 alert (fingerprint of its own) for each of ``NODES`` nodes."""
    body = json.loads(XID79)
    template, body["alerts"] = body["alerts"][0], []
    for number in range(NODES):
        alert = copy.deepcopy(template)
        alert["fingerprint"] = f"{round_:08x}{number:08x}"
        node = f"gpu-node-{number:03d}"
        alert["labels"] = {**alert["labels"], "node": node, "Hostname": node}
        body["alerts"].append(alert)
    return json.dumps(body).encode()


def _all_watched(server: Pitcrew) -> bool:
    incidents = server.incidents()
    return len(incidents) == NODES and all(
        any(e["kind"] == "watching" for e in server.incident(i["id"])["events"]) for i in incidents
    )


def _sigterm_during_deliveries(server: Pitcrew, rounds: Iterator[int]) -> int:
    """SIGTERM once deliveries of new alerts for every node are being answered; its exit code."""
    stop, answered = threading.Event(), [0]

    def keep_delivering() -> None:
        while not stop.is_set():
            try:
                status, _ = server.post_alerts(_alerts_for_every_node(next(rounds)))
            except OSError:  # the server has closed its port
                return
            answered[0] += status == 200

    storm = threading.Thread(target=keep_delivering, name="deliveries")
    storm.start()
    try:
        wait_until(lambda: answered[0] >= 3, timeout=HUNG, what="deliveries answered")
        assert server.process is not None
        server.process.send_signal(signal.SIGTERM)
        try:
            return server.process.wait(timeout=HUNG)
        except subprocess.TimeoutExpired:
            pytest.fail(
                f"pitcrew serve still running {HUNG:g}s after SIGTERM:\n{server.log.read_text()[-3000:]}"
            )
    finally:
        stop.set()
        storm.join()


@pytest.mark.slow
def test_pitcrew_serve_ends_on_sigterm_while_deliveries_wake_its_workers(pitcrew_factory: Any) -> None:
    server: Pitcrew = pitcrew_factory("serve", simulated=False)
    rounds = iter(range(1, 1_000_000))
    for round_ in range(2):
        server.start()
        if round_ == 0:
            status, answer = server.post_alerts(_alerts_for_every_node(0))
            assert status == 200 and len(answer["opened"]) == NODES, answer
        wait_until(lambda: _all_watched(server), timeout=HUNG, what=f"{NODES} incidents watched")
        code = _sigterm_during_deliveries(server, rounds)
        assert code == 0, f"round {round_}:\n{server.log.read_text()[-3000:]}"
        server.process = None
