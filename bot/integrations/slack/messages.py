"""Every Slack message pitcrew posts, built with ``slack_sdk.models.blocks`` and kept inside Slack's limits.

Pure: plain data in, ``Message`` (fallback text + blocks as dicts) out; no I/O. Limits (fixtures
``limits.md``): 50 blocks, section text 3000, field text 2000, header 150, button text 75, context
10 elements, unique action ids. Whatever the input — a timeline of a thousand lines, a node name of
ten thousand characters — the message fits: texts are clipped, long line lists are cut with a
pointer to ``pitcrew incidents show``. Buttons carry only the incident id as their value.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from slack_sdk.models.blocks import (
    ActionsBlock,
    Block,
    ButtonElement,
    ConfirmObject,
    ContextBlock,
    DividerBlock,
    HeaderBlock,
    MarkdownTextObject,
    PlainTextObject,
    SectionBlock,
)

MAX_BLOCKS = 50
SECTION_TEXT = 3000
FIELD_TEXT = 2000
HEADER_TEXT = 150
CONTEXT_ELEMENTS = 10
#: Fallback text (notifications, screen readers): Slack truncates at 40,000; we keep it short.
FALLBACK_TEXT = 3000
#: Lines of a timeline shown in one reply before pointing to the CLI.
TIMELINE_LINES = 40

APPROVE, REJECT, ROLLBACK = "pitcrew_approve", "pitcrew_reject", "pitcrew_rollback"
ACTIONS = (APPROVE, REJECT, ROLLBACK)


@dataclass(frozen=True, slots=True)
class Message:
    text: str
    blocks: list[dict[str, Any]]


@dataclass(frozen=True, slots=True)
class Decision:
    """Who did what when, as the parent message shows it."""

    actor: str
    what: str
    at: datetime


@dataclass(frozen=True, slots=True)
class ParentView:
    """What the incident's parent message shows now (built by the destination from the store)."""

    incident_id: str
    node: str
    title: str
    lines: tuple[str, ...]
    severity: str
    mode: str
    plan: str
    gpu: str
    state: str
    status: str
    grafana: str | None = None
    runbook: str | None = None
    decisions: tuple[Decision, ...] = ()
    offer: tuple[str, ...] = ()
    jobs: tuple[str, ...] = field(default=())


def clip(text: str, limit: int) -> str:
    """``text`` within ``limit`` characters, marked where it was cut."""
    return text if len(text) <= limit else text[: limit - 1] + "…"


def show(incident_id: str) -> str:
    return f"`pitcrew incidents show {clip(incident_id, 100)}`"


def _lines(lines: Sequence[str], limit: int, incident_id: str | None, budget: int = SECTION_TEXT) -> str:
    """Bullet lines, at most ``limit`` of them and ``budget`` characters, with a pointer for the rest."""
    shown: list[str] = []
    used = 0
    for number, line in enumerate(lines):
        item = "• " + clip(line, 500)
        rest = len(lines) - number
        tail = f"\n… {rest} more" + (f": {show(incident_id)}" if incident_id else "")
        if number >= limit or used + len(item) + 1 + len(tail) > budget:
            shown.append(tail.strip())
            break
        shown.append(item)
        used += len(item) + 1
    return clip("\n".join(shown), budget)


def _section(text: str) -> SectionBlock:
    return SectionBlock(text=MarkdownTextObject(text=clip(text or " ", SECTION_TEXT)))


def _dicts(blocks: Sequence[Block]) -> list[dict[str, Any]]:
    out = [b.to_dict() for b in blocks[:MAX_BLOCKS]]
    return out


def _button(action_id: str, label: str, incident_id: str, style: str | None, confirm: str) -> ButtonElement:
    return ButtonElement(
        text=PlainTextObject(text=label),
        action_id=action_id,
        value=clip(incident_id, 2000),
        style=style,
        confirm=ConfirmObject(
            title=PlainTextObject(text=f"{label}?"),
            text=MarkdownTextObject(text=clip(confirm, 300)),
            confirm=PlainTextObject(text=label),
            deny=PlainTextObject(text="Cancel"),
            style="danger" if style == "danger" else None,
        ),
    )


def buttons(incident_id: str, offer: Sequence[str]) -> ActionsBlock | None:
    made = []
    short = clip(incident_id, 60)
    if "approve" in offer:
        made.append(
            _button(APPROVE, "Approve", incident_id, "primary", f"Run the playbook of {short} on the node?")
        )
    if "reject" in offer:
        made.append(_button(REJECT, "Reject", incident_id, "danger", f"Stop {short}: nothing will be done."))
    if "rollback" in offer:
        made.append(
            _button(
                ROLLBACK,
                "Rollback",
                incident_id,
                "danger",
                f"Undo, in reverse, what pitcrew did for {short} (only what it did itself)?",
            )
        )
    return ActionsBlock(block_id=f"actions-{len(made)}", elements=made) if made else None


def parent(view: ParentView) -> Message:
    """The incident's parent message: what broke, what pitcrew will do, where it is, who decided."""
    blocks: list[Block] = [
        HeaderBlock(text=PlainTextObject(text=clip(view.title or view.node, HEADER_TEXT))),
        _section(_lines(view.lines, 12, view.incident_id)),
        SectionBlock(
            fields=[
                MarkdownTextObject(text=clip(f"*Node*\n{view.node}", FIELD_TEXT)),
                MarkdownTextObject(text=clip(f"*GPU*\n{view.gpu or '-'}", FIELD_TEXT)),
                MarkdownTextObject(text=clip(f"*Mode*\n{view.mode}", FIELD_TEXT)),
                MarkdownTextObject(text=clip(f"*Plan*\n{view.plan}", FIELD_TEXT)),
            ]
        ),
    ]
    if view.jobs:
        blocks.append(_section("*Affected Slurm jobs*\n" + _lines(view.jobs, 10, view.incident_id, 2800)))
    blocks.append(_section(f"*Status:* {clip(view.state, 100)} — {view.status}"))
    if view.decisions:
        recent = view.decisions[-(CONTEXT_ELEMENTS - 1) :]
        elements = [
            MarkdownTextObject(
                text=clip(f"{d.what} by {d.actor} at {d.at.strftime('%Y-%m-%d %H:%M:%S UTC')}", 500)
            )
            for d in recent
        ]
        if len(view.decisions) > len(recent):
            elements.insert(
                0, MarkdownTextObject(text=f"{len(view.decisions) - len(recent)} earlier decisions")
            )
        blocks.append(ContextBlock(elements=elements))
    links = [f"incident {clip(view.incident_id, 100)}: {show(view.incident_id)}"]
    if view.grafana:
        links.append(f"<{clip(view.grafana, 1500)}|Grafana dashboard>")
    if view.runbook:
        links.append(f"<{clip(view.runbook, 1000)}|Runbook>")
    blocks.append(ContextBlock(elements=[MarkdownTextObject(text=clip(" · ".join(links), 3000))]))
    actions = buttons(view.incident_id, view.offer)
    if actions is not None:
        blocks.append(actions)
    return Message(clip(f"{view.title} — {view.state}", FALLBACK_TEXT), _dicts(blocks))


def reply(title: str, lines: Sequence[str], incident_id: str | None) -> Message:
    """A threaded reply: a step outcome, a decision, a notice of the incident."""
    blocks: list[Block] = [_section(f"*{clip(title, 500)}*")]
    if lines:
        blocks.append(_section(_lines(lines, TIMELINE_LINES, incident_id)))
    return Message(clip(title, FALLBACK_TEXT), _dicts(blocks))


def summary(title: str, lines: Sequence[str], incident_id: str | None) -> Message:
    """The final summary (broadcast to the channel): the timeline and time to recovery."""
    blocks: list[Block] = [
        HeaderBlock(text=PlainTextObject(text=clip(title, HEADER_TEXT))),
        _section(_lines(lines, TIMELINE_LINES, incident_id)),
    ]
    if incident_id:
        blocks.append(ContextBlock(elements=[MarkdownTextObject(text=f"Full timeline: {show(incident_id)}")]))
    return Message(clip(title, FALLBACK_TEXT), _dicts(blocks))


@dataclass(frozen=True, slots=True)
class DigestEntry:
    incident_id: str
    node: str
    fault: str
    state: str
    held_by_breaker: bool


def digest(entries: Sequence[DigestEntry], window: str, mode: str) -> Message:
    """One channel message for a storm, updated as nodes join it (never one message per node)."""
    held = [e for e in entries if e.held_by_breaker]
    faults: dict[str, int] = {}
    for entry in entries:
        faults[entry.fault] = faults.get(entry.fault, 0) + 1
    title = f"GPU fault storm: {len(entries)} nodes within {window} (mode {mode})"
    blocks: list[Block] = [
        HeaderBlock(text=PlainTextObject(text=clip(title, HEADER_TEXT))),
        _section(
            "*Faults*\n"
            + _lines([f"{count}x {name}" for name, count in sorted(faults.items())], 20, None, 2900)
        ),
        _section(
            "*Circuit breaker held back*\n"
            + (_lines([f"{e.node} ({e.incident_id})" for e in held], 30, None, 2800) if held else "nothing")
        ),
        DividerBlock(),
        _section(
            "*Nodes*\n"
            + _lines([f"{e.node} — {e.fault} — {e.state} ({e.incident_id})" for e in entries], 40, None)
        ),
        ContextBlock(
            elements=[
                MarkdownTextObject(
                    text="One message for the whole storm, updated as nodes join. Each incident: "
                    "`pitcrew incidents show <id>`; `/pitcrew status <node>`."
                )
            ]
        ),
    ]
    return Message(clip(title, FALLBACK_TEXT), _dicts(blocks))


def channel_notice(title: str, lines: Sequence[str], severity: str) -> Message:
    """A notice about pitcrew as a whole (the breaker opened): a top-level channel message."""
    mark = {"critical": ":rotating_light: ", "warning": ":warning: "}.get(severity, "")
    return reply(f"{mark}{title}", lines, None)
