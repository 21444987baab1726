"""``bot.store.repeats`` in memory: what is a repeat, and how counts leave for the database."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from bot.domain.alerts import dedupe_key
from bot.store.repeats import PRUNE_SLACK, RepeatMemory

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


def test_a_flush_in_chunks_takes_the_keys_counted_first_and_a_failed_chunk_keeps_only_its_own() -> None:
    memory = RepeatMemory()
    keys = {fp: dedupe_key(fp, T0) for fp in ("fp-e", "fp-c", "fp-a", "fp-d", "fp-b")}
    memory.remember({key: ("firing", None) for key in keys.values()})
    for fp in keys:  # counted e, c, a, d, b
        assert memory.count([(fp, T0, "firing")], T0) == 1
    assert memory.count([("fp-e", T0, "firing")], T0) == 1  # counted again: still the first counted
    first = memory.take(2)
    # The keys counted first, not the smallest: each chunk is a transaction of its own, and its
    # one statement locks its rows in key order (``rows``), so chunks need no order among them.
    assert [row[2] for row in first] == ["fp-c", "fp-e"]  # in key order within the chunk
    assert [row[1] for row in first] == [1, 2]
    assert set(memory.seen) == {keys["fp-a"], keys["fp-d"], keys["fp-b"]}
    memory.flushed(committed=True)
    second = memory.take(2)
    assert [row[2] for row in second] == ["fp-a", "fp-d"]
    memory.flushed(committed=False)  # this chunk failed: only its counts come back
    assert set(memory.seen) == {keys["fp-a"], keys["fp-d"], keys["fp-b"]}
    assert all(n == 1 for _, n in memory.seen.values())
    assert [row[2] for row in memory.take(10)] == ["fp-a", "fp-b", "fp-d"]  # fewer left: all, in key order
    assert memory.seen == {}


def test_only_a_delivery_that_changes_nothing_remembered_is_counted() -> None:
    memory = RepeatMemory()
    memory.remember({dedupe_key("fp-f", T0): ("firing", None), dedupe_key("fp-r", T0): ("resolved", None)})
    assert memory.count([("fp-f", T0, "resolved")], T0) is None  # a resolution goes to the database
    assert memory.count([("fp-f", T0, "firing"), ("fp-x", T0, "firing")], T0) is None  # one unknown
    assert memory.seen == {}  # nothing counted of a delivery memory cannot answer whole
    assert memory.count([("fp-r", T0, "firing"), ("fp-f", T0, "firing")], T0) == 2  # a stale firing too
    memory.forget([dedupe_key("fp-r", T0)])
    assert memory.count([("fp-r", T0, "firing")], T0) is None


def test_memory_never_answers_for_an_alert_retention_could_have_removed() -> None:
    """Retention removes only alerts stored before its cut-off (now - retention), which started at
    most the intake's clock skew after that: memory answers for later starts only, and the database
    for the rest, whichever replica pruned (``bot.store.repeats``)."""
    keep = timedelta(days=180)
    now = T0 + timedelta(days=400)
    edge = now - keep + PRUNE_SLACK  # the latest start an alert retention removed can have
    starts = {"old": T0, "edge": edge, "after": edge + timedelta(microseconds=1), "new": now}
    keys = {name: dedupe_key(name, at) for name, at in starts.items()}
    for retention, answered in ((keep, {"after", "new"}), (None, set(starts))):
        memory = RepeatMemory(retention=retention)
        memory.remember({key: ("firing", "pc-00001") for key in keys.values()})
        trusted = memory.trusted(now)
        assert {name for name, key in keys.items() if trusted.get(key) is not None} == answered
        assert {name for name, key in keys.items() if key in trusted} == answered
        assert set(trusted) == {keys[name] for name in answered} and len(trusted) == len(answered)
        for name, at in starts.items():
            counted = memory.count([(name, at, "firing")], now)
            assert counted == (1 if name in answered else None), (retention, name)
    # The earliest start trusted is rounded up to the minute: trusting a little less, never more.
    memory = RepeatMemory(retention=keep)
    half = now + timedelta(seconds=30)  # its exact edge is half a minute after ``edge``
    near, past = edge + timedelta(seconds=45), edge + timedelta(seconds=61)
    memory.remember({dedupe_key(name, at): ("firing", None) for name, at in (("near", near), ("past", past))})
    assert memory.count([("near", near, "firing")], half) is None
    assert memory.count([("past", past, "firing")], half) == 1
    # Later, an alert that was recent enough ages out of what memory answers for.
    memory = RepeatMemory(retention=keep)
    memory.remember({keys["new"]: ("firing", None)})
    assert memory.count([("new", now, "firing")], now + keep) is None
    # A retention longer than the calendar: nothing is that old, memory answers for every key.
    ancient = RepeatMemory(retention=timedelta(days=999_999))
    ancient.remember({keys["old"]: ("firing", None)})
    assert ancient.count([("old", T0, "firing")], now) == 1
