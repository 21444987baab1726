"""Every reference a destination keeps of an incident is one retention removes with it: read from
the source, not run.

Cases: every key ``bot`` passes to the store's ``outbox_ref``/``set_outbox_ref`` is made by
``incident_ref`` (typed: ``mypy --strict`` holds its ``what`` to ``INCIDENT_REFS``, which retention
deletes by), ``link_key``, or is the digest's own (``PREFIX`` + a message ts, ``"digest"``), never
an f-string or concatenation of its own: ``parent:`` and ``replaced:`` were written that way and
outlived every pruned incident.
"""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
STORE_CALLS = {"outbox_ref", "set_outbox_ref"}
#: Keys that belong to no incident: the digest's (a storm's message, by its ts) and the current one.
NOT_AN_INCIDENT = {"digest"}


def _keys() -> list[tuple[str, ast.expr]]:
    found = []
    for path in sorted((REPO / "bot").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr in STORE_CALLS
                and len(node.args) >= 2
            ):
                found.append((f"{path.relative_to(REPO)}:{node.lineno}", node.args[1]))
    return found


def _made_right(key: ast.expr) -> bool:
    if isinstance(key, ast.Call) and isinstance(key.func, ast.Name):
        return key.func.id in {"incident_ref", "link_key"}
    if isinstance(key, ast.Constant):
        return key.value in NOT_AN_INCIDENT
    if isinstance(key, ast.BinOp) and isinstance(key.left, ast.Name):
        return key.left.id == "PREFIX"  # bot.integrations.slack.digest: "digest:" + the message's ts
    return isinstance(key, ast.Name)  # a key made above, checked where it is made


def test_destinations_key_an_incidents_references_only_as_retention_knows_them() -> None:
    keys = _keys()
    assert len(keys) > 15  # the scan sees the destinations' calls (not an empty walk)
    wrong = [where for where, key in keys if not _made_right(key)]
    assert not wrong, f"outbox_refs keys not made by incident_ref: {wrong}"
