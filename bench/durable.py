"""The durable baseline of ``bench/ingest.py``: the bare handler, plus an acknowledgement that
survives a crash, and nothing of pitcrew.

Each delivery is parsed as JSON, queued, and answered 200 only once the transaction holding it
committed. One writer takes what is queued (up to ``BATCH`` deliveries: group commit, as
pitcrew's SQLite writer and its Postgres deliveries, ``bot.store.group_commit``, do) and commits
it in one transaction into one table — on SQLite (WAL, ``synchronous`` as pitcrew's store is
run; the transaction on the event loop, as pitcrew's writer runs deliveries: a thread waits for
the interpreter and a core after every call) or on PostgreSQL (one connection, ``executemany`` in
a pipeline). Its throughput is the honest limit of an acknowledgement that survives a
crash on that database; pitcrew's ratio to it is the figure the ingest benchmark reports.

    python bench/durable.py PORT sqlite PATH [SYNCHRONOUS]
    python bench/durable.py PORT postgres URL PASSWORD_FILE
"""

from __future__ import annotations

import asyncio
import sqlite3
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import psycopg
from aiohttp import web

from bot.store.group_commit import BATCH  # as many deliveries to a commit as pitcrew on Postgres

TABLE = "CREATE TABLE IF NOT EXISTS deliveries (id INTEGER PRIMARY KEY, body TEXT NOT NULL)"
PG_TABLE = "CREATE TABLE IF NOT EXISTS deliveries (id BIGSERIAL PRIMARY KEY, body TEXT NOT NULL)"

Commit = Callable[[list[str]], Awaitable[None]]


def sqlite_committer(path: Path, synchronous: str) -> Commit:
    conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute(f"PRAGMA synchronous={synchronous.upper()}")
    conn.execute(TABLE)

    def write(bodies: list[str]) -> None:
        conn.execute("BEGIN IMMEDIATE")
        conn.executemany("INSERT INTO deliveries (body) VALUES (?)", [(b,) for b in bodies])
        conn.execute("COMMIT")

    async def commit(bodies: list[str]) -> None:
        write(bodies)  # on the event loop, as pitcrew's writer commits deliveries

    return commit


async def postgres_committer(url: str, password_file: Path) -> Commit:
    password = password_file.read_text().strip()
    conn = await psycopg.AsyncConnection.connect(url, password=password, autocommit=True)
    await conn.execute(PG_TABLE)

    async def commit(bodies: list[str]) -> None:
        async with conn.transaction(), conn.cursor() as cursor:
            await cursor.executemany("INSERT INTO deliveries (body) VALUES (%s)", [(b,) for b in bodies])

    return commit


async def _ok(request: web.Request) -> web.Response:
    return web.json_response({"status": "ok"})


async def _empty(request: web.Request) -> web.Response:
    return web.Response(text="")


def app(make: Callable[[], Awaitable[Commit]]) -> web.Application:
    queue: asyncio.Queue[tuple[str, asyncio.Future[None]]] = asyncio.Queue()

    async def writer(commit: Commit) -> None:
        while True:
            batch = [await queue.get()]
            while len(batch) < BATCH and not queue.empty():
                batch.append(queue.get_nowait())
            try:
                await commit([body for body, _ in batch])
            except Exception as exc:  # answered 503: the sender redelivers
                for _, done in batch:
                    done.set_exception(exc)
            else:
                for _, done in batch:
                    done.set_result(None)

    async def handler(request: web.Request) -> web.Response:
        await request.json()
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        await queue.put((await request.text(), done))
        try:
            await done
        except Exception:
            return web.json_response({"error": "not stored"}, status=503)
        return web.json_response({"status": "ok"})

    async def background(application: web.Application) -> AsyncIterator[None]:
        task = asyncio.create_task(writer(await make()))
        yield
        task.cancel()

    application = web.Application(client_max_size=4 * 1024 * 1024)
    application.router.add_post("/api/v1/alerts", handler)
    application.router.add_get("/healthz", _ok)
    application.router.add_get("/metrics", _empty)
    application.cleanup_ctx.append(background)
    return application


def main(argv: list[str]) -> None:
    port, kind, target, *rest = argv

    async def make() -> Commit:
        if kind == "sqlite":
            return sqlite_committer(Path(target), rest[0] if rest else "full")
        return await postgres_committer(target, Path(rest[0]))

    web.run_app(app(make), host="127.0.0.1", port=int(port), print=None, access_log=None)


if __name__ == "__main__":
    main(sys.argv[1:])
