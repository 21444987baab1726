"""``cancel_and_wait``: the one rule for stopping a worker's task; ``wait_ended``: waiting for a
task someone else runs.

Cases: nothing to stop; a running task is cancelled and has ended when the call returns; a task that
failed on its own is not hidden from its owner by a stop (its error is raised); the caller's own
cancellation while it waits for a slow-to-end task is passed on, never swallowed. Waiting for a task
run by someone else: its cancellation by its owner is swallowed; the waiter's own cancellation is
passed on and leaves the task running (the engine's rollback waits so for a rollback already under
way; before, it swallowed a shutdown's cancellation and went on).
"""

from __future__ import annotations

import asyncio
import contextlib

import pytest

from bot.engine.tasks import cancel_and_wait, wait_ended


async def test_nothing_to_stop() -> None:
    await cancel_and_wait(None)


async def test_a_running_task_is_cancelled_and_has_ended() -> None:
    task = asyncio.create_task(asyncio.sleep(3600))
    await asyncio.sleep(0)
    await cancel_and_wait(task)
    assert task.cancelled()


async def test_a_task_that_failed_on_its_own_says_so() -> None:
    async def fail() -> None:
        raise RuntimeError("boom")

    task = asyncio.create_task(fail())
    await asyncio.sleep(0)
    with pytest.raises(RuntimeError, match="boom"):
        await cancel_and_wait(task)


async def test_the_callers_own_cancellation_is_passed_on() -> None:
    ended = asyncio.Event()
    release = asyncio.Event()

    async def slow_to_end() -> None:
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            await release.wait()  # takes its time to clean up
            ended.set()
            raise

    worker = asyncio.create_task(slow_to_end())
    await asyncio.sleep(0)
    stopper = asyncio.create_task(cancel_and_wait(worker))
    await asyncio.sleep(0)
    stopper.cancel()  # the shutdown itself is cancelled while it waits
    release.set()
    with pytest.raises(asyncio.CancelledError):
        await stopper
    with contextlib.suppress(asyncio.CancelledError):
        await worker
    assert ended.is_set() and worker.cancelled()


async def test_waiting_for_another_owners_task() -> None:
    owned = asyncio.create_task(asyncio.sleep(3600))
    waiter = asyncio.create_task(wait_ended(owned))
    await asyncio.sleep(0)
    owned.cancel()  # its owner stops it: the waiter just sees it ended
    await waiter
    assert owned.cancelled()

    release = asyncio.Event()
    running = asyncio.create_task(release.wait())
    waiter = asyncio.create_task(wait_ended(running))
    await asyncio.sleep(0)
    waiter.cancel()  # the waiter is cancelled (a shutdown): passed on, the task goes on
    with pytest.raises(asyncio.CancelledError):
        await waiter
    assert not running.done()
    release.set()
    await running
