"""The store's reads run here: one reader thread with its own connection, never on the event loop.

Why: a read is SQL plus decoding rows into records in Python, and an incident with 10,000
alerts took a second to read; on the event loop that was a second in which no webhook was
answered (ten concurrent reads held a webhook for 5.8 s). Here the loop hands the whole read
— query and decoding — to the thread and gets the records back once. In WAL mode the reader
never waits for the writer, nor the writer for it. One thread, not a pool: reads queue
behind each other instead of taking the GIL from the event loop in parallel, and the API's
pages (``bot.store.base.PAGE_MAX``) keep each read short, so nothing waits behind one for long.

The queries themselves (``bot.store.queries``) are operations ``SqliteStore`` drives over this
connection; this module owns only the thread, the connection and the cursor format of alert pages.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import json
import sqlite3
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TypeVar

from bot.store.base import BadCursor, StoreUnavailable

T = TypeVar("T")
Query = Callable[[sqlite3.Connection], T]


class Reader:
    def __init__(self, path: Path) -> None:
        self.path = path
        self._executor: ThreadPoolExecutor | None = None
        self._conn: sqlite3.Connection | None = None  # used in the reader thread only

    async def open(self) -> None:
        """Connect in the reader thread (the database exists: the writer created and migrated it)."""
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="pitcrew-store-reader")
        await asyncio.get_running_loop().run_in_executor(self._executor, self._connect)

    def _connect(self) -> None:
        conn = sqlite3.connect(self.path, isolation_level=None)
        conn.row_factory = sqlite3.Row
        conn.execute("PRAGMA query_only=ON")
        conn.execute("PRAGMA busy_timeout=10000")
        self._conn = conn

    async def close(self) -> None:
        """Reads already queued finish first; later ones get ``StoreUnavailable``."""
        executor, self._executor = self._executor, None
        if executor is None:
            return
        try:
            await asyncio.get_running_loop().run_in_executor(executor, self._disconnect)
        finally:
            executor.shutdown(wait=True)

    def _disconnect(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.close()

    async def run(self, query: Query[T]) -> T:
        """``query(connection)`` in the reader thread; its result."""
        executor = self._executor
        if executor is None:
            raise StoreUnavailable("store is not open")
        return await asyncio.get_running_loop().run_in_executor(executor, self._call, query)

    def _call(self, query: Query[T]) -> T:
        if self._conn is None:
            raise StoreUnavailable("store is not open")
        return query(self._conn)


# Alert pages are ordered by (first_seen, fingerprint, starts_at): the cursor is that key of the
# last alert of a page, opaque to clients (base64url of a JSON list, no padding).
AlertKey = tuple[str, str, str]
_NOT_A_CURSOR = "not a cursor of this list: pass the next-page cursor the page before gave"


def alert_cursor(key: AlertKey) -> str:
    return base64.urlsafe_b64encode(json.dumps(list(key)).encode()).decode().rstrip("=")


def alert_key(cursor: str) -> AlertKey:
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        key = json.loads(raw)
    except (binascii.Error, ValueError) as exc:
        raise BadCursor(_NOT_A_CURSOR) from exc
    if not (isinstance(key, list) and len(key) == 3 and all(isinstance(part, str) for part in key)):
        raise BadCursor(_NOT_A_CURSOR)
    return key[0], key[1], key[2]


def event_key(cursor: str) -> int:
    if not cursor.isdecimal() or not cursor.isascii():
        raise BadCursor(_NOT_A_CURSOR)
    return int(cursor)
