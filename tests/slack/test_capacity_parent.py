"""The parent message says which node was lent to the stalled job and where from, or why none.

Cases: the last capacity word wins (a take, then its give-back); a refusal names the guards; an
incident that took nothing and said nothing shows no capacity line; the line is in the blocks.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from bot.integrations.slack import messages
from bot.integrations.slack.messages import ParentView
from bot.integrations.slack.parent import capacity_word
from bot.store.base import Event

AT = datetime(2026, 1, 1, tzinfo=UTC)


def _event(seq: int, kind: str, detail: str, **data: str) -> Event:
    return Event(
        kind=kind, detail=detail, data=data, seq=seq, incident_id="pc-1", at=AT + timedelta(seconds=seq)
    )


def test_the_last_capacity_word_is_shown() -> None:
    took = "took gpu-spare-01 from pool spares: gpu-spare-01 from spare pool spares"
    back = "gpu-node-01 joined pool spares: whole again after 600s"
    events = [
        _event(1, "action", "Slurm node gpu-node-01 set DOWN", action="slurm_down"),
        _event(2, "action", took, action="capacity_take"),
        _event(3, "step_finished", "capacity ok"),
    ]
    assert capacity_word(events) == took
    assert capacity_word([*events, _event(4, "action", back, action="capacity_give_back")]) == back
    refused = "no node to take: spares: min_idle — 1 idle, keeps at least 1"
    waits = capacity_word([_event(1, "capacity_none", f"job 100 waits for the repair: {refused}")])
    assert waits is not None and waits.endswith(refused)
    assert capacity_word(events[:1]) is None


def test_the_parent_shows_the_capacity_line() -> None:
    base = {
        "incident_id": "pc-1",
        "node": "gpu-node-01",
        "title": "gpu-node-01: XID 79",
        "lines": (),
        "severity": "critical",
        "mode": "auto",
        "plan": "notify → capacity → close",
        "gpu": "3",
        "state": "running",
        "status": "step 3/10",
    }
    shown = messages.parent(ParentView(**base, capacity="took gpu-spare-01 from pool spares"))  # type: ignore[arg-type]
    assert "*Capacity:* took gpu-spare-01 from pool spares" in repr(shown.blocks)
    assert "Capacity" not in repr(messages.parent(ParentView(**base)).blocks)  # type: ignore[arg-type]
