"""A batch of callers' writes in one transaction; if it fails on one of them, each alone.

SQLite's writer (``bot.store.writer``) and Postgres's group commit of deliveries
(``bot.store.group_commit``) both run the work of many callers in one transaction and answer
each only once it has committed. One caller's bad item (a row the database refuses, a bug)
must fail only that caller: the batch is rolled back and each item runs again in a
transaction of its own, and gets its own result or its own error. A failure of the database
itself (``StoreUnavailable``) is no item's fault: every item of the batch gets it, and once one
item alone meets it the items not yet run get it too, without waiting on the database in turn.

One rule, written once: the stores differ only in how they run a transaction (``Run``).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import TypeVar

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
