"""The code speaks one error vocabulary: read from the source, not run.

Cases: every ``TransientError``/``PermanentError``/``PitcrewError`` made in ``bot`` and
``proving_ground`` names its reason as a ``Reason`` member, never a string written there (the
tests' simulated far side, ``tests/simulator``, is held to it by CI's ``mypy --strict``);
``mypy --strict`` (its API, in this process) refuses a written string, even a member's value, a
missing reason and an unknown member. (The vocabulary itself is unit-tested in
``tests/unit/test_errors.py``.)
"""

from __future__ import annotations

import ast
import re
from pathlib import Path
from typing import cast

from mypy import api as mypy

from bot.engine.errors import Reason

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
    assert {m.attr for m in members if cast(ast.Name, m.value).id == "Reason"} <= set(Reason.__members__)


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
