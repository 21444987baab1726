"""A batch of callers' writes in one transaction; if it fails on one of them, each alone.

SQLite's writer (``bot.store.writer``) and Postgres's group commit of deliveries
(``bot.store.group_commit``) both run the work of many callers in one transaction and answer
each only once it has committed. One caller's bad item (a row the database refuses, a bug)
must fail only that caller: the batch is rolled back and each item runs again in a
transaction of its own, and gets its own result or its own error. A failure of the database
itself (``StoreUnavailable``) is no item's fault: every item of the batch gets it, and once one
item alone meets it the items not yet run get it too, without waiting on the database in turn.

One rule, written once: the stores differ only in how they run a transaction (``Run``). SQLite's
writer runs a batch through ``commit_batch``; Postgres's group commit runs its batch in the store's
writes themselves and, if it fails on one of its items, hands them to ``each_alone``.

The callers of a batch that committed are answered by the thread that committed it
(``answer_soon``), at the event loop's next turn, or at once if that thread is the loop's: answered
by the task that handed the batch over, each waited one more turn of a loop busy with webhooks, the
one that resumes that task.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

from bot import logger
from bot.store.base import StoreUnavailable

log = logger(__name__)

#: The engine's writes one transaction takes at most, in either store (SQLite's writer,
#: ``bot.store.writer``, beside the deliveries it takes; Postgres's writes,
#: ``bot.store.postgres._Writes.write``): a delivery that comes meanwhile waits for that
#: transaction, so its length is bounded.
ENGINE_WRITES = 16

ItemT = TypeVar("ItemT")
ResultT = TypeVar("ResultT")

#: Called in the thread that committed a batch, with one result per item, in order.
Answer = Callable[[Sequence[Any]], None]
#: Runs items in one transaction: one result per item, in order, once it has committed; raises if
#: it did not (``StoreUnavailable`` when the database itself failed). Once committed, the thread
#: that committed hands the results to the ``Answer``, if there is one.
Run = Callable[[Sequence[ItemT], Answer | None], Awaitable[Sequence[ResultT]]]


async def commit_batch(
    items: Sequence[ItemT], run: Run[ItemT, ResultT], futures: Sequence[asyncio.Future[Any]] | None = None
) -> list[ResultT | Exception]:
    """Each item's result, or the exception it fails with (never raised: each caller hears its own).
    ``futures``: the items' callers; if the whole batch commits, the thread that committed it
    answers them (``answer_soon``); items run alone after it failed are answered by our caller."""
    answer = None
    if futures is not None:
        answer = _answering(asyncio.get_running_loop(), futures)
    try:
        done = await run(items, answer)
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
    return await each_alone(items, run)


async def each_alone(items: Sequence[ItemT], run: Run[ItemT, ResultT]) -> list[ResultT | Exception]:
    """Each item in a transaction of its own, after their batch failed on one of them: its result or
    its exception; once the database itself fails (``StoreUnavailable``), the rest get that too."""
    outcomes: list[ResultT | Exception] = []
    for item in items:
        try:
            [result] = await run([item], None)
        except StoreUnavailable as exc:
            return [*outcomes, *[exc] * (len(items) - len(outcomes))]
        except Exception as exc:
            outcomes.append(exc)
        else:
            outcomes.append(result)
    return outcomes


def settle(futures: Sequence[asyncio.Future[Any]], outcomes: Sequence[Any]) -> None:
    """Each caller its own outcome: an exception is raised in it, anything else is its result. A
    caller that has gone (a client hung up) is skipped."""
    for future, outcome in zip(futures, outcomes, strict=True):
        if not future.done():
            if isinstance(outcome, BaseException):
                future.set_exception(outcome)
            else:
                future.set_result(outcome)


def answer_soon(
    loop: asyncio.AbstractEventLoop, futures: Sequence[asyncio.Future[Any]], results: Sequence[Any]
) -> None:
    """From the thread that committed a batch: each caller gets its result at ``loop``'s next turn."""

    def settle() -> None:
        for future, result in zip(futures, results, strict=True):
            if not future.done():  # its caller may have gone (a client hung up)
                future.set_result(result)

    if _running() is loop:  # committed on the loop itself: at once, no turn to wait for
        settle()
        return
    with contextlib.suppress(RuntimeError):  # the loop is closed: nobody is waiting
        loop.call_soon_threadsafe(settle)


def _running() -> asyncio.AbstractEventLoop | None:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:  # a thread without a loop
        return None


def _answering(loop: asyncio.AbstractEventLoop, futures: Sequence[asyncio.Future[Any]]) -> Answer:
    """``answer_soon`` for a batch's callers; one that fails is logged and never turns a committed
    batch into a failed one (its items would run again): the batch's task answers them instead."""

    def answer(results: Sequence[Any]) -> None:
        try:
            answer_soon(loop, futures, results)
        except Exception:
            log.exception("could not answer a committed batch from the thread that committed it")

    return answer
