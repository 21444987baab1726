"""One error vocabulary: ``Reason`` is closed, required, and the only thing an error's reason can be.

Cases: every ``TransientError``/``PermanentError``/``PitcrewError`` made in ``bot`` and
``proving_ground`` names its reason as a ``Reason`` member, never a string written there (the
tests' simulated far side, ``tests/simulator``, is held to it by CI's ``mypy --strict``); a
reason is required; a string that is no member is
refused when the error is made, one that is a member becomes it; the values are short snake_case
label values, one per member; the metric's ``reason`` label takes exactly the members, for every
system, before anything failed, and refuses anything else; ``mypy --strict`` (its API, in this
process) refuses a written string, even a member's value, a missing reason and an unknown member.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest
from mypy import api as mypy
from prometheus_client import CollectorRegistry

from bot.engine.errors import PermanentError, PitcrewError, Reason, TransientError
from bot.engine.metrics import SYSTEMS, Metrics

REPO = Path(__file__).resolve().parents[2]
ERRORS = {"TransientError", "PermanentError", "PitcrewError"}


def _raised_reasons() -> list[tuple[str, ast.expr | None]]:
    """Each construction of one of the errors in ``bot`` and ``proving_ground``: where, and the
    expression given as its reason (``None``: none given)."""
    found = []
    for path in sorted([*(REPO / "bot").rglob("*.py"), *(REPO / "proving_ground").rglob("*.py")]):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if not isinstance(node, ast.Call):
                continue
            name = node.func.id if isinstance(node.func, ast.Name) else getattr(node.func, "attr", "")
            if name in ERRORS:
                reason = next((k.value for k in node.keywords if k.arg == "reason"), None)
                found.append((f"{path.relative_to(REPO)}:{node.lineno}", reason))
    return found


def test_every_error_in_bot_names_a_member_never_a_written_string() -> None:
    raised = _raised_reasons()
    assert len(raised) > 60  # the scan sees the adapters' errors (not an empty walk)
    missing = [where for where, reason in raised if reason is None]
    written = [where for where, reason in raised if isinstance(reason, ast.Constant | ast.JoinedStr)]
    assert not missing, f"errors without a reason: {missing}"
    assert not written, f"reasons written as strings, not Reason members: {written}"
    members = [r for _, r in raised if isinstance(r, ast.Attribute) and isinstance(r.value, ast.Name)]
    assert {m.attr for m in members if m.value.id == "Reason"} <= set(Reason.__members__)


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


TYPED = """\
from bot.engine.errors import PermanentError, Reason, TransientError

TransientError("a member", reason=Reason.TIMEOUT, retry_after=3)
TransientError("a member's value, written out", reason="timeout")
PermanentError("a far side's own code", reason="ratelimited")
PermanentError("no reason at all")
PermanentError("no such member", reason=Reason.RATELIMITED)
"""


def test_mypy_strict_refuses_anything_but_a_member(tmp_path: Path) -> None:
    (tmp_path / "raises.py").write_text(TYPED)
    out, err, status = mypy.run(
        [
            "--strict",
            "--no-error-summary",
            "--cache-dir",
            str(tmp_path / "cache"),
            str(tmp_path / "raises.py"),
        ]
    )
    assert status == 1, out + err
    lines = {int(m[1]): m[2] for m in re.finditer(r"raises\.py:(\d+): error: .*\[([a-z-]+)\]", out)}
    assert lines == {4: "arg-type", 5: "arg-type", 6: "call-arg", 7: "attr-defined"}, out
