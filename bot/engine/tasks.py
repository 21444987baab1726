"""Stopping a background task: one rule for every worker pitcrew owns (outbox, leadership, Socket Mode).

A worker's ``stop`` cancels its task and waits until it has ended. The task's own cancellation is
expected and swallowed; a cancellation of the *caller* while it waits is not (Python 3.11's
``Task.cancelling``): swallowing it too would turn a shutdown that was asked to stop into one that
goes on, which is how a stop gets lost.
"""

from __future__ import annotations

import asyncio
import gc
import inspect
from types import FrameType
from typing import Any


async def cancel_and_wait(task: asyncio.Task[Any] | None) -> None:
    """Cancel ``task`` (if any and still running) and wait until it has ended."""
    if task is None:
        return
    task.cancel()
    await _ended(task)


async def wait_ended(task: asyncio.Task[Any]) -> None:
    """Wait until ``task``, which someone else runs, has ended, without cancelling it when the
    caller is cancelled (shielded); its own cancellation is swallowed, the caller's is not."""
    await _ended(asyncio.shield(task))


async def _ended(awaited: asyncio.Future[Any]) -> None:
    try:
        await awaited
    except asyncio.CancelledError:
        current = asyncio.current_task()
        if current is not None and current.cancelling():
            raise


def await_chain(coro: Any) -> list[FrameType]:
    """The frames of ``coro`` and of what it awaits, down the chain, outermost first: coroutines,
    generators and async generators (an ``async with`` or ``async for`` step into the generator
    it drives). ``Task.get_stack`` shows a suspended task's outermost frame only; where a task
    that does not end is stuck is at the bottom of this chain."""
    frames: list[FrameType] = []
    seen: set[int] = set()
    while coro is not None and id(coro) not in seen:
        seen.add(id(coro))
        frame = _first(coro, "cr_frame", "gi_frame", "ag_frame")
        if frame is None:
            break
        frames.append(frame)
        awaited = _first(coro, "cr_await", "gi_yieldfrom", "ag_await")
        if type(awaited).__name__ in ("async_generator_asend", "async_generator_athrow"):
            # ``await agen.asend(...)`` (``async for``, ``async with`` over a generator): the step
            # object does not name its generator, but it refers to it.
            awaited = next((r for r in gc.get_referents(awaited) if inspect.isasyncgen(r)), None)
        coro = awaited
    return frames


def _first(obj: Any, *names: str) -> Any:
    for name in names:
        value = getattr(obj, name, None)
        if value is not None:
            return value
    return None
