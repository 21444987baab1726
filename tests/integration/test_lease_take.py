"""A lease taken after a long wait is led on, not stepped down from at the first write.

Real time and a real PostgreSQL database. The lease has lapsed; another session holds the row
(``FOR SHARE``, as a write of a leader frozen inside its transaction does until the server ends
it), so the standby's take waits there longer than a term may be acted on without renewal. The
term it writes starts when its transaction began — already lapsed, in the store and by the
fence's clock — so before, the process led on a lapsed grant: its first fenced write was refused
and it stepped down and took the row again. Now the take is renewed at once: when the workers
start, the fence leads and the row is not expired.
"""

from __future__ import annotations

import asyncio
from datetime import timedelta

import psycopg
from prometheus_client import CollectorRegistry

from bot.engine.leadership import Leadership
from bot.engine.metrics import Metrics
from bot.store.lease import Fence
from bot.store.postgres import PostgresStore
from tests.harness.postgres import PostgresDatabase

TTL = timedelta(seconds=2)
RENEW = timedelta(seconds=1)  # a term may be acted on for TTL - RENEW = 1 s after a renewal began


class Started:
    def __init__(self, fence: Fence, store: PostgresStore) -> None:
        self._fence = fence
        self._store = store
        self.seen: asyncio.Future[tuple[bool, bool]] = asyncio.get_running_loop().create_future()

    async def start(self) -> None:
        lease = await self._store.lease()
        if not self.seen.done():
            self.seen.set_result((self._fence.leading, lease is not None and not lease.expired))

    async def stop(self) -> None:
        return None


async def test_a_take_that_waited_past_the_term_is_renewed_before_leading(
    postgres_db: PostgresDatabase,
) -> None:
    store = PostgresStore(postgres_db.url, password_file=postgres_db.password_file)
    await store.open()
    fence = Fence("pitcrew-b")
    worker = Started(fence, store)
    leadership = Leadership(store, fence, [worker], Metrics(CollectorRegistry()), ttl=TTL, renew_every=RENEW)
    password = postgres_db.password_file.read_text().strip()
    try:
        await store.acquire_lease("pitcrew-a", TTL)
        await store.release_lease("pitcrew-a", 1)  # lapsed: free to take
        with psycopg.connect(postgres_db.url, password=password) as holder:
            holder.execute("SELECT * FROM leadership WHERE id = 1 FOR SHARE")
            await leadership.start()
            await asyncio.sleep(2.5)  # the take waits on the row past the 1 s a term may be acted on
            assert not worker.seen.done()
        leading, live = await asyncio.wait_for(worker.seen, 10)
        assert leading, "led on a grant that had lapsed while the take waited"
        assert live, "the store's row was already expired when the process began to lead"
        lease = await store.lease()
        assert lease is not None and (lease.holder, lease.epoch) == ("pitcrew-b", 2)
    finally:
        await leadership.stop()
        await store.close()
