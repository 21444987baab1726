"""A batch of callers' writes in one transaction; if it fails on one of them, each alone.

SQLite's writer (``bot.store.writer``) and Postgres's group commit of deliveries
(``bot.store.group_commit``) both run the work of many callers in one transaction and answer
each only once it has committed. One caller's bad item (a row the database refuses, a bug)
must fail only that caller: the batch is rolled back and each item runs again in a
transaction of its own, and gets its own result or its own error. A failure of the database
itself (``StoreUnavailable``) is no item's fault: every item of the batch gets it, and once one
item alone meets it the items not yet run get it too, without waiting on the database in turn.

One rule, written once: the stores differ only in how they run a transaction (``Run``).

The callers of a batch that committed are answered by the thread that committed it
(``answer_soon``), at the event loop's next turn: answered by the task that handed the batch over,
each waited one more turn of a loop busy with webhooks, the one that resumes that task.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

from bot import logger
from bot.store.base import StoreUnavailable

log = logger(__name__)

ItemT = TypeVar("ItemT")
ResultT = TypeVar("ResultT")

#: Runs items in one transaction: one result per item, in order, once it has committed; raises if
#: it did not (``StoreUnavailable`` when the database itself failed).
Run = Callable[[Sequence[ItemT]], Awaitable[Sequence[ResultT]]]


async def commit_batch(items: Sequence[ItemT], run: Run[ItemT, ResultT]) -> list[ResultT | Exception]:
    """Each item's result, or the exception it fails with (never raised: each caller hears its own)."""
    try:
        done = await run(items)
    except StoreUnavailable as exc:
        return [exc] * len(items)
    except Exception as exc:
        if len(items) == 1:
            return [exc]
        log.warning(
            "a batch failed; each of its items runs alone", extra={"items": len(items), "error": str(exc)}
        )
    else:
        assert len(done) == len(items), "one result per item"
        return list(done)
    outcomes: list[ResultT | Exception] = []
    for item in items:
        try:
            [result] = await run([item])
        except StoreUnavailable as exc:
            return [*outcomes, *[exc] * (len(items) - len(outcomes))]
        except Exception as exc:
            outcomes.append(exc)
        else:
            outcomes.append(result)
    return outcomes


def answer_soon(
    loop: asyncio.AbstractEventLoop, futures: Sequence[asyncio.Future[Any]], results: Sequence[Any]
) -> None:
    """From the thread that committed a batch: each caller gets its result at ``loop``'s next turn."""

    def settle() -> None:
        for future, result in zip(futures, results, strict=True):
            if not future.done():  # its caller may have gone (a client hung up)
                future.set_result(result)

    with contextlib.suppress(RuntimeError):  # the loop is closed: nobody is waiting
        loop.call_soon_threadsafe(settle)
