"""Whether a Slurm node's slurmd started again since a reboot or replacement (``slurmd_started_again``).

Cases: another start time than the one Slurm reported before the repair, earlier or later, is a new
slurmd (whatever the clocks: the times are the slurmd host's, compared with each other only); the
same one is not; Slurm reporting none now cannot tell; a Slurm node not read before (a successor's
new name) is a new record; none reported before and one now is new. An intent persisted by an older
pitcrew (nothing read before) falls back on the second it was issued, else cannot tell. The record
read before the repair round-trips through the store's codec, and an older intent without it decodes.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from bot.domain.jobs import SlurmdSeen, SlurmNodeState, slurmd_started_again
from bot.engine.steps.repair import RebootResult
from bot.store import codec

OLD = datetime(2026, 12, 1, 8, 0, 0, tzinfo=UTC)
ISSUED = datetime(2026, 12, 7, 9, 0, 0, 400_000, tzinfo=UTC)


def node(started: datetime | None, name: str = "gpu-001") -> SlurmNodeState:
    return SlurmNodeState(name, frozenset({"DOWN", "DRAIN"}), slurmd_started_at=started)


@pytest.mark.parametrize(
    ("started", "before", "expected"),
    [
        (OLD, (SlurmdSeen("gpu-001", OLD),), False),
        (ISSUED, (SlurmdSeen("gpu-001", OLD),), True),
        # A slurmd host whose clock runs behind pitcrew's: still another start time.
        (ISSUED - timedelta(seconds=5), (SlurmdSeen("gpu-001", OLD),), True),
        (OLD - timedelta(days=1), (SlurmdSeen("gpu-001", OLD),), True),
        (None, (SlurmdSeen("gpu-001", OLD),), None),
        (OLD, (SlurmdSeen("gpu-009", OLD),), True),  # not served before: a new record
        (OLD, (SlurmdSeen("gpu-001", None),), True),  # Slurm reported none before the repair
        (None, (SlurmdSeen("gpu-001", None),), None),
    ],
    ids=[
        "same",
        "later",
        "behind-pitcrews-clock",
        "earlier",
        "none-now",
        "new-record",
        "none-before",
        "none-both",
    ],
)
def test_another_start_time_than_before_the_repair_is_a_new_slurmd(
    started: datetime | None, before: tuple[SlurmdSeen, ...], expected: bool | None
) -> None:
    assert slurmd_started_again(node(started), before, since=ISSUED) is expected


@pytest.mark.parametrize(
    ("started", "since", "expected"),
    [
        (ISSUED.replace(microsecond=0), ISSUED, True),  # Slurm keeps whole seconds
        (ISSUED - timedelta(seconds=1), ISSUED, False),
        (ISSUED, None, None),
        (None, ISSUED, None),
    ],
    ids=["same-second", "before", "no-time", "none-now"],
)
def test_an_older_pitcrews_intent_falls_back_on_when_it_was_issued(
    started: datetime | None, since: datetime | None, expected: bool | None
) -> None:
    assert slurmd_started_again(node(started), None, since) is expected


def test_the_start_times_read_before_the_repair_are_stored_with_its_intent() -> None:
    result = RebootResult(issuing=True, issued_at=ISSUED, slurmd_before=(SlurmdSeen("gpu-001", OLD),))
    assert codec.decode_record(RebootResult, codec.encode_record(result)) == result
    older = {k: v for k, v in codec.encode_record(result).items() if k != "slurmd_before"}
    assert codec.decode_record(RebootResult, older).slurmd_before is None
