"""``bot.store.repeats`` in memory: what is a repeat, and how counts leave for the database."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from bot.domain.alerts import dedupe_key
from bot.store.repeats import RepeatMemory

T0 = datetime(2026, 12, 2, 9, 0, tzinfo=UTC)


def test_counts_leave_in_key_order_and_a_failed_flush_keeps_them() -> None:
    memory = RepeatMemory()
    keys = {fp: dedupe_key(fp, T0) for fp in ("fp-c", "fp-a", "fp-b")}
    memory.remember({key: ("firing", "pc-00001") for key in keys.values()})
    for fp in keys:  # counted in another order than the keys'
        assert memory.count([(fp, T0, "firing")], T0) == 1
    taken = memory.take()
    # Two replicas' flushes lock the same rows in the same order (shared mode lets both run).
    assert [row[2] for row in taken] == ["fp-a", "fp-b", "fp-c"]
    assert memory.seen == {} and set(memory.flushing) == set(keys.values())

    later = T0 + timedelta(seconds=1)
    assert memory.count([("fp-a", T0, "firing")], later) == 1  # while the flush commits
    memory.flushed(committed=False)
    assert memory.flushing == {}
    stamp_later = memory.seen[keys["fp-a"]][0]
    assert memory.seen[keys["fp-a"]] == (stamp_later, 2) and stamp_later > taken[0][0]
    assert memory.seen[keys["fp-b"]] == (taken[1][0], 1)
    memory.take()
    memory.flushed(committed=True)
    assert memory.seen == {} and memory.flushing == {}


def test_only_a_delivery_that_changes_nothing_remembered_is_counted() -> None:
    memory = RepeatMemory()
    memory.remember({dedupe_key("fp-f", T0): ("firing", None), dedupe_key("fp-r", T0): ("resolved", None)})
    assert memory.count([("fp-f", T0, "resolved")], T0) is None  # a resolution goes to the database
    assert memory.count([("fp-f", T0, "firing"), ("fp-x", T0, "firing")], T0) is None  # one unknown
    assert memory.seen == {}  # nothing counted of a delivery memory cannot answer whole
    assert memory.count([("fp-r", T0, "firing"), ("fp-f", T0, "firing")], T0) == 2  # a stale firing too
    memory.forget([dedupe_key("fp-r", T0)])
    assert memory.count([("fp-r", T0, "firing")], T0) is None
