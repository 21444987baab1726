"""What a Postgres replica's batches expect (``bot.store.expect``): the views their nodes were left
in, brought up to date by the incidents this process moves, and expected less often after misses."""

from __future__ import annotations

from datetime import UTC, datetime

from bot.domain.incident import State
from bot.store.expect import BACKOFF_MAX, Expectations, Expecting, KeyState

VIEW = ("pc-00001", "open", frozenset({"xid79@gpu3"}))
NOW = datetime(2026, 12, 1, tzinfo=UTC)


def _skipped(expectations: Expectations, turns: int) -> list[bool]:
    """For each of the next ``turns`` batches, whether it expects nothing."""
    return [expectations.turn(NOW).nodes is None for _ in range(turns)]


def test_a_miss_skips_batches_doubling_while_misses_come_in_a_row_and_a_hit_resets_it() -> None:
    expectations = Expectations()
    assert _skipped(expectations, 2) == [False, False]
    expectations.missed()
    assert _skipped(expectations, 2) == [True, False]
    expectations.missed()
    assert _skipped(expectations, 3) == [True, True, False]
    expectations.missed()
    assert _skipped(expectations, 5) == [True] * 4 + [False]
    for _ in range(10):
        expectations.missed()
    assert _skipped(expectations, BACKOFF_MAX + 1) == [True] * BACKOFF_MAX + [False]
    hit = Expecting({}, used=True)
    expectations.committed(hit)
    expectations.missed()
    assert _skipped(expectations, 2) == [True, False]
    assert (expectations.hits, expectations.misses) == (1, 14)


def test_a_batch_that_looked_up_teaches_what_it_found_and_does_not_count_as_a_hit() -> None:
    expectations = Expectations()
    expectations.missed()
    expectations.missed()
    looked_up = Expecting(None, seen={"gpu-001": VIEW, "gpu-002": None})
    expectations.committed(looked_up)
    assert expectations.hits == 0
    assert _skipped(expectations, 2) == [True, True]  # two misses: two skipped; a lookup resets nothing
    views = expectations.turn(NOW).nodes
    assert views == {"gpu-001": VIEW, "gpu-002": None}


def test_views_are_kept_for_the_nodes_seen_last() -> None:
    expectations = Expectations(nodes_max=2)
    expectations.learn({"a": None, "b": None})
    expectations.learn({"a": VIEW})
    expectations.learn({"c": None})
    assert dict(expectations.turn(NOW).nodes or {}) == {"a": VIEW, "c": None}


def test_a_move_of_the_expected_incident_is_expected_next() -> None:
    expectations = Expectations()
    expectations.learn({"gpu-001": VIEW, "gpu-002": ("pc-00002", "open", frozenset())})
    expectations.moved("pc-00001", "gpu-001", State.RUNNING)
    expectations.moved("pc-00009", "gpu-002", State.RESOLVED)  # not the incident expected there
    expectations.moved("pc-00003", "gpu-003", State.RUNNING)  # a node never seen: nothing to expect
    views = expectations.turn(NOW).nodes or {}
    assert views == {
        "gpu-001": ("pc-00001", "running", frozenset({"xid79@gpu3"})),
        "gpu-002": ("pc-00002", "open", frozenset()),
    }
    expectations.moved("pc-00001", "gpu-001", State.FAILED)
    assert (expectations.turn(NOW).nodes or {})["gpu-001"] is None


def test_a_batch_expects_the_keys_the_store_knows_at_its_time_and_looks_up_after_a_miss() -> None:
    asked: list[datetime] = []
    known: dict[tuple[str, str], KeyState] = {("fp", "t"): ("firing", "pc-00001")}

    def keys(now: datetime) -> dict[tuple[str, str], KeyState]:
        asked.append(now)
        return known

    expectations = Expectations(keys=keys)
    assert expectations.turn(NOW).keys == known and asked == [NOW]
    expectations.missed()
    skipped = expectations.turn(NOW)
    assert (skipped.nodes, dict(skipped.keys)) == (None, {}) and asked == [NOW]
    assert skipped.recent is expectations.turn(NOW).recent  # one record of recent keys for all
