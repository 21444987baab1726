"""Go's ``time.ParseDuration`` as pitcrew reads it from an annotation a Go controller reads
(Karpenter's ``karpenter.sh/do-not-disrupt``, ``parseDoNotDisrupt``): units ns to h, decimals,
several parts, a sign, a bare ``0``; no days, no bare number, nothing else."""

from __future__ import annotations

from datetime import timedelta

import pytest

from bot.domain.durations import parse_go_duration


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("5m", 300),
        ("1h30m", 5400),
        ("1.5h", 5400),
        ("300ms", 0.3),
        ("2h45m10s", 9910),
        ("0", 0),
        ("-1m", -60),
    ],
)
def test_go_durations_read(text: str, seconds: float) -> None:
    assert parse_go_duration(text) == timedelta(seconds=seconds)


@pytest.mark.parametrize("text", ["", "true", "5", "1d", "m", "5 m", "1h-5m", ".h", "5mx"])
def test_what_go_refuses_is_refused(text: str) -> None:
    with pytest.raises(ValueError):
        parse_go_duration(text)
