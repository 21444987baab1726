"""One error vocabulary: ``Reason`` is closed, required, and the only thing an error's reason can be.

Cases: a reason is required; a string that is no member is refused when the error is made, one
that is a member becomes it; the values are short snake_case label values, one per member; the
metric's ``reason`` label takes exactly the members, for every system, before anything failed,
and refuses anything else. What the code itself may write (the source scan and ``mypy``) is in
``tests/codebase/test_error_vocabulary.py``.
"""

from __future__ import annotations

import re

import pytest
from prometheus_client import CollectorRegistry

from bot.engine.errors import PermanentError, PitcrewError, Reason, TransientError
from bot.engine.metrics import SYSTEMS, Metrics


@pytest.mark.parametrize("kind", [TransientError, PermanentError])
def test_a_reason_is_required(kind: type[PitcrewError]) -> None:
    with pytest.raises(TypeError, match="reason"):
        kind("no reason given")  # type: ignore[call-arg]


@pytest.mark.parametrize("kind", [TransientError, PermanentError, PitcrewError])
def test_a_string_that_is_no_member_is_refused(kind: type[PitcrewError]) -> None:
    with pytest.raises(ValueError, match="ratelimited"):
        kind("Slack said ratelimited", reason="ratelimited")  # type: ignore[arg-type]
    made = kind("a member's value", reason="timeout")  # type: ignore[arg-type]
    assert made.reason is Reason.TIMEOUT


def test_the_values_are_bounded_label_values() -> None:
    values = [r.value for r in Reason]
    assert len(values) == len(set(values)) == len(Reason)
    assert all(re.fullmatch(r"[a-z][a-z_]{1,23}", v) for v in values), values
    assert all(str(r) == r.value and f"{r}" == r.value for r in Reason)  # a StrEnum: the value is the label


def test_the_metric_label_set_is_the_enum_for_every_system_before_any_error() -> None:
    metrics = Metrics(CollectorRegistry())
    [family] = [m for m in metrics.registry.collect() if m.name == "pitcrew_integration_errors"]
    samples = [s for s in family.samples if s.name == "pitcrew_integration_errors_total"]
    assert {s.labels["system"] for s in samples} == set(SYSTEMS)
    for system in SYSTEMS:
        reasons = [s.labels["reason"] for s in samples if s.labels["system"] == system]
        assert sorted(reasons) == sorted(r.value for r in Reason), system
    assert all(s.value == 0 for s in samples)
    metrics.integration_error("notifier", Reason.RATE_LIMITED)
    assert (
        metrics.registry.get_sample_value(
            "pitcrew_integration_errors_total", {"system": "notifier", "reason": "rate_limited"}
        )
        == 1
    )
    with pytest.raises(ValueError):
        metrics.integration_error("notifier", "ratelimited")  # type: ignore[arg-type]
    after = {
        (s.labels["system"], s.labels["reason"])
        for m in metrics.registry.collect()
        if m.name == "pitcrew_integration_errors"
        for s in m.samples
    }
    assert after == {(system, r.value) for system in SYSTEMS for r in Reason}
