"""The engine's waits end on their event, on their limit, or on a cancellation — always.

Cases: ``RealTimer.wait`` says True when the event is set and False when the limit passes; a
wait cancelled in the very loop iteration that sets its event ends cancelled, whichever of the
two comes first within that iteration (``asyncio.wait_for`` on Python 3.11 returned True
there, and the worker so woken went on as if never stopped: ``Engine.stop`` then waited for
ever, see tests/integration/test_shutdown_hang.py). The node track stopped while it stops its
job track ends cancelled too.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from bot.engine.signals import RealTimer
from bot.engine.tasks import cancel_and_wait


async def parked(task: asyncio.Task[Any]) -> None:
    """Until ``task`` waits on its event (a couple of loop iterations)."""
    for _ in range(100):
        if task.done():
            break
        await asyncio.sleep(0)
        if task._fut_waiter is not None:  # type: ignore[attr-defined]
            return
    raise AssertionError(f"{task!r} never parked")


async def test_a_wait_ends_on_its_event_or_its_limit() -> None:
    timer, event = RealTimer(), asyncio.Event()
    assert not await timer.wait(event, 0.01)
    event.set()
    assert await timer.wait(event, 30)


@pytest.mark.parametrize("order", ["set-then-cancel", "cancel-then-set"])
async def test_a_wait_cancelled_as_its_event_is_set_ends_cancelled(order: str) -> None:
    event = asyncio.Event()
    waiting = asyncio.create_task(RealTimer().wait(event, 30))
    await parked(waiting)
    if order == "set-then-cancel":
        event.set()
        waiting.cancel()
    else:
        waiting.cancel()
        event.set()
    with pytest.raises(asyncio.CancelledError):
        await waiting


@pytest.mark.parametrize("iterations", range(4))
async def test_a_wait_cancelled_soon_after_its_event_is_set_ends_cancelled(iterations: int) -> None:
    """The event set, then the cancellation ``iterations`` loop iterations later: a stop that comes
    while the woken wait is still on its way back must still stop it."""
    event = asyncio.Event()
    waiting = asyncio.create_task(RealTimer().wait(event, 30))
    await parked(waiting)
    event.set()
    for _ in range(iterations):
        await asyncio.sleep(0)
    if waiting.done():
        assert waiting.result() is True  # woken before the stop came: nothing to lose
        return
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting


async def test_stopping_the_job_track_does_not_swallow_the_node_tracks_own_stop() -> None:
    """The node track stops its job track (``bot.engine.tasks.cancel_and_wait``) and is stopped by the engine while it
    waits for the job track to end: it ends cancelled, instead of going on (the job track's
    ``CancelledError`` taken for its own). A job track that ends on cancellation also ends the
    stop quietly when nobody stops the node track."""
    released = asyncio.Event()

    async def job_track() -> None:
        try:
            await asyncio.Event().wait()
        finally:
            await released.wait()  # its cleanup takes a while: a far-side call being cancelled

    async def node_track(job: asyncio.Task[None]) -> str:
        await cancel_and_wait(job)
        return "went on"

    job = asyncio.create_task(job_track())
    await asyncio.sleep(0)
    node = asyncio.create_task(node_track(job))
    await parked(node)
    node.cancel()  # the engine's stop, while the node track waits for the job track
    released.set()
    with pytest.raises(asyncio.CancelledError):
        await node
    assert job.cancelled()

    quiet = asyncio.create_task(job_track())
    await asyncio.sleep(0)
    assert await node_track(quiet) == "went on"
