"""Stopping a background task: one rule for every worker pitcrew owns (outbox, leadership, Socket Mode).

A worker's ``stop`` cancels its task and waits until it has ended. The task's own cancellation is
expected and swallowed; a cancellation of the *caller* while it waits is not (Python 3.11's
``Task.cancelling``): swallowing it too would turn a shutdown that was asked to stop into one that
goes on, which is how a stop gets lost.
"""

from __future__ import annotations

import asyncio
from typing import Any


async def cancel_and_wait(task: asyncio.Task[Any] | None) -> None:
    """Cancel ``task`` (if any and still running) and wait until it has ended."""
    if task is None:
        return
    task.cancel()
    try:
        await task
    except asyncio.CancelledError:
        current = asyncio.current_task()
        if current is not None and current.cancelling():
            raise
