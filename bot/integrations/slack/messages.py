"""Every Slack message pitcrew posts, built with ``slack_sdk.models.blocks`` and kept inside Slack's limits.

Pure: plain data in, ``Message`` (fallback text + blocks as dicts) out; no I/O. Limits (fixtures
``limits.md``): 50 blocks, section text 3000, field text 2000, header 150, button text 75, context
10 elements, unique action ids, and all the text together within ``BLOCKS_TEXT``. Whatever the
input — a timeline of a thousand lines, a node name of ten thousand characters — the message
fits: texts are clipped, long line lists are cut with a pointer to ``pitcrew incidents show``.
Buttons carry only the incident id as their value.

Everything that reaches these functions as ``str`` is text from outside (Slurm job names and users,
alert descriptions, node names, step details, what a person typed) and is **escaped** before it goes
into mrkdwn: Slack reads ``&``, ``<`` and ``>`` as control characters, so an unescaped job named
``<!channel>`` would notify the whole channel and ``<https://evil.example|Approve>`` would be a link
dressed as pitcrew's (docs.slack.dev/messaging/formatting-message-text, "Escaping text"). pitcrew's
own markup — bold, code, a mention of a Slack user, a link it builds — is ``Mrkdwn`` and passes
unchanged. Escaping comes first, clipping second (the limits count the escaped text), and a clip
never cuts through an entity or a ``<…>`` sequence. ``plain_text`` (headers, button labels) is not
parsed by Slack and is not escaped.
"""

from __future__ import annotations

import hashlib
import re
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
#: All the text of one message's blocks together. Slack refuses more with ``msg_blocks_too_long``
#: however small each part is; the limit is undocumented (12,000 characters "with a buffer for block
#: containers", say Slack's developers in slackapi/bolt-js#2867), so pitcrew keeps well below it.
BLOCKS_TEXT = 10_000
#: What a text is never clipped below to make the message fit.
CLIPPED_TEXT = 200

APPROVE, REJECT, ROLLBACK = "pitcrew_approve", "pitcrew_reject", "pitcrew_rollback"
#: The line a parent shows when it continues an earlier one, by why: a person (or a retention
#: policy) deleted that one, or Slack no longer lets pitcrew edit it (the workspace's edit window
#: closed on it), so it would go on showing an old state.
MOVED = {
    "deleted": (
        ":information_source: This incident's earlier message was deleted in Slack; "
        "its thread continues here (earlier replies stay with the deleted message)."
    ),
    "uneditable": (
        ":information_source: This incident's earlier message can no longer be edited in Slack, so it "
        "shows an old state; its thread continues here (earlier replies stay in the earlier thread)."
    ),
}
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
    #: Why this parent continues the incident's thread from an earlier one (a key of ``MOVED``):
    #: ``deleted`` or ``uneditable``; ``None`` for the incident's first parent.
    replaces: str | None = None
    #: The node lent to the stalled job and where from, or why none (the ``capacity`` step's last word).
    capacity: str | None = None


class Mrkdwn(str):
    """Text that is mrkdwn already: pitcrew's own markup around escaped text (``escape`` keeps it)."""

    __slots__ = ()


def escape(text: str) -> Mrkdwn:
    """``text`` from outside as mrkdwn that shows it as it is: ``&`` ``<`` ``>`` as entities."""
    if isinstance(text, Mrkdwn):
        return text
    return Mrkdwn(text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;"))


#: What a clip must not cut through: an entity, a mention or a link.
_UNIT = re.compile(r"&(?:amp|lt|gt);|<[^<>]*>")
_USER_ID = re.compile(r"[UW][A-Z0-9]{2,20}")


def clip(text: str, limit: int) -> str:
    """``text`` within ``limit`` characters, marked where it was cut (never inside an entity or a
    ``<…>`` sequence: the cut moves back to its start). Mrkdwn in, mrkdwn out."""
    if len(text) <= limit:
        return text
    cut = limit - 1
    for unit in _UNIT.finditer(text, max(0, cut - 4000)):
        if unit.start() >= cut:
            break
        if unit.end() > cut:
            cut = unit.start()
            break
    clipped = text[:cut] + "…"
    return Mrkdwn(clipped) if isinstance(text, Mrkdwn) else clipped


def md(text: str, limit: int) -> Mrkdwn:
    """Text from outside, escaped, then clipped to ``limit``."""
    return Mrkdwn(clip(escape(text), limit))


def mention(user_id: str) -> Mrkdwn:
    """A Slack user as a mention; anything that is not a user id is shown as text."""
    if _USER_ID.fullmatch(user_id):
        return Mrkdwn(f"<@{user_id}>")
    return escape(user_id)


def link(url: str, label: str) -> Mrkdwn:
    """A link pitcrew builds (Grafana, a runbook). The address may come from outside (an alert's
    ``runbook_url``): only http(s), with ``&`` escaped and ``|`` ``<`` ``>`` percent-encoded, so it
    can neither end the link early nor relabel it; anything else is shown as text."""
    if not url.startswith(("https://", "http://")):
        return escape(f"{label}: {url}")
    safe = url.replace("&", "&amp;").replace("|", "%7C").replace("<", "%3C").replace(">", "%3E")
    return Mrkdwn(f"<{safe}|{escape(label)}>")


def show(incident_id: str) -> Mrkdwn:
    return Mrkdwn(f"`pitcrew incidents show {md(incident_id, 100)}`")


def _lines(lines: Sequence[str], limit: int, incident_id: str | None, budget: int = SECTION_TEXT) -> str:
    """Bullet lines, at most ``limit`` of them and ``budget`` characters, with a pointer for the rest."""
    shown: list[str] = []
    used = 0
    for number, line in enumerate(lines):
        item = "• " + md(line, 500)
        rest = len(lines) - number
        tail = f"\n… {rest} more" + (f": {show(incident_id)}" if incident_id else "")
        if number >= limit or used + len(item) + 1 + len(tail) > budget:
            shown.append(tail.strip())
            break
        shown.append(item)
        used += len(item) + 1
    return Mrkdwn(clip(Mrkdwn("\n".join(shown)), budget))


def _section(text: str) -> SectionBlock:
    """A section of mrkdwn that its callers built from escaped parts."""
    return SectionBlock(text=MarkdownTextObject(text=clip(text or " ", SECTION_TEXT)))


def _dicts(blocks: Sequence[Block]) -> list[dict[str, Any]]:
    out = [b.to_dict() for b in blocks[:MAX_BLOCKS]]
    _within_total(out)
    return out


def _text_objects(node: Any) -> list[dict[str, Any]]:
    if isinstance(node, dict):
        own = (
            [node]
            if node.get("type") in {"mrkdwn", "plain_text"} and isinstance(node.get("text"), str)
            else []
        )
        return own + [t for value in node.values() for t in _text_objects(value)]
    if isinstance(node, list):
        return [t for value in node for t in _text_objects(value)]
    return []


def _within_total(blocks: list[dict[str, Any]]) -> None:
    """Clip the longest mrkdwn texts, each as ``clip`` does, until all the text together is within
    ``BLOCKS_TEXT``: each part within its own limit, a parent full of long parts was refused whole."""
    texts = _text_objects(blocks)
    excess = sum(len(t["text"]) for t in texts) - BLOCKS_TEXT
    clippable = [t for t in texts if t["type"] == "mrkdwn"]
    while excess > 0 and clippable:
        longest = max(clippable, key=lambda t: len(t["text"]))
        before = len(longest["text"])
        if before <= CLIPPED_TEXT:
            break
        longest["text"] = clip(longest["text"], max(CLIPPED_TEXT, before - excess))
        excess -= before - len(longest["text"])


def _button(action_id: str, label: str, incident_id: str, style: str | None, confirm: str) -> ButtonElement:
    return ButtonElement(
        text=PlainTextObject(text=label),
        action_id=action_id,
        value=clip(incident_id, 2000),
        style=style,
        confirm=ConfirmObject(
            title=PlainTextObject(text=f"{label}?"),
            text=MarkdownTextObject(text=clip(confirm, 300)),  # built from escaped parts
            confirm=PlainTextObject(text=label),
            deny=PlainTextObject(text="Cancel"),
            style="danger" if style == "danger" else None,
        ),
    )


def buttons(incident_id: str, offer: Sequence[str], version: str = "") -> ActionsBlock | None:
    """The buttons offered, in a block whose id names this ``version`` of the message: Slack asks
    for a new ``block_id`` each time a message is updated (Block Kit reference, ``block_id``)."""
    made = []
    short = md(incident_id, 60)
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
    return ActionsBlock(block_id=f"actions-{len(made)}-{version}"[:255], elements=made) if made else None


def parent(view: ParentView) -> Message:
    """The incident's parent message: what broke, what pitcrew will do, where it is, who decided."""
    blocks: list[Block] = [
        HeaderBlock(text=PlainTextObject(text=clip(view.title or view.node, HEADER_TEXT))),
        *([ContextBlock(elements=[MarkdownTextObject(text=MOVED[view.replaces])])] if view.replaces else []),
        _section(_lines(view.lines, 12, view.incident_id)),
        SectionBlock(
            fields=[
                MarkdownTextObject(text=clip(f"*Node*\n{escape(view.node)}", FIELD_TEXT)),
                MarkdownTextObject(text=clip(f"*GPU*\n{escape(view.gpu or '-')}", FIELD_TEXT)),
                MarkdownTextObject(text=clip(f"*Mode*\n{escape(view.mode)}", FIELD_TEXT)),
                MarkdownTextObject(text=clip(f"*Plan*\n{escape(view.plan)}", FIELD_TEXT)),
            ]
        ),
    ]
    if view.jobs:
        blocks.append(_section("*Affected Slurm jobs*\n" + _lines(view.jobs, 10, view.incident_id, 2800)))
    blocks.append(_section(f"*Status:* {md(view.state, 100)} — {escape(view.status)}"))
    if view.capacity:
        blocks.append(_section(clip(f"*Capacity:* {escape(view.capacity)}", 3000)))
    if view.decisions:
        recent = view.decisions[-(CONTEXT_ELEMENTS - 1) :]
        elements = [
            MarkdownTextObject(
                text=clip(
                    f"{escape(d.what)} by {escape(d.actor)} at {d.at.strftime('%Y-%m-%d %H:%M:%S UTC')}", 500
                )
            )
            for d in recent
        ]
        if len(view.decisions) > len(recent):
            elements.insert(
                0, MarkdownTextObject(text=f"{len(view.decisions) - len(recent)} earlier decisions")
            )
        blocks.append(ContextBlock(elements=elements))
    links = [f"incident {md(view.incident_id, 100)}: {show(view.incident_id)}"]
    if view.grafana and len(view.grafana) <= 1500:  # a link is whole or absent, never clipped
        links.append(link(view.grafana, "Grafana dashboard"))
    if view.runbook and len(view.runbook) <= 1000:
        links.append(link(view.runbook, "Runbook"))
    blocks.append(ContextBlock(elements=[MarkdownTextObject(text=clip(" · ".join(links), 3000))]))
    actions = buttons(view.incident_id, view.offer, hashlib.sha256(repr(view).encode()).hexdigest()[:12])
    if actions is not None:
        blocks.append(actions)
    return Message(md(f"{view.title} — {view.state}", FALLBACK_TEXT), _dicts(blocks))


def reply(title: str, lines: Sequence[str], incident_id: str | None) -> Message:
    """A threaded reply: a step outcome, a decision, a notice of the incident."""
    blocks: list[Block] = [_section(f"*{md(title, 500)}*")]
    if lines:
        blocks.append(_section(_lines(lines, TIMELINE_LINES, incident_id)))
    return Message(md(title, FALLBACK_TEXT), _dicts(blocks))


def summary(title: str, lines: Sequence[str], incident_id: str | None) -> Message:
    """The final summary (broadcast to the channel): the timeline and time to recovery."""
    blocks: list[Block] = [
        HeaderBlock(text=PlainTextObject(text=clip(title, HEADER_TEXT))),
        _section(_lines(lines, TIMELINE_LINES, incident_id)),
    ]
    if incident_id:
        blocks.append(ContextBlock(elements=[MarkdownTextObject(text=f"Full timeline: {show(incident_id)}")]))
    return Message(md(title, FALLBACK_TEXT), _dicts(blocks))


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
    # Nodes, not incidents: a node can have several in one storm (its exporter down beside its XID).
    nodes = len({entry.node for entry in entries})
    counted = f"{nodes} node{'s' * (nodes != 1)}"
    if nodes != len(entries):
        counted += f", {len(entries)} incidents"
    title = f"GPU fault storm: {counted} within {window} (mode {mode})"
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
                    "`pitcrew incidents show &lt;id&gt;`; `/pitcrew status &lt;node&gt;`."
                )
            ]
        ),
    ]
    return Message(md(title, FALLBACK_TEXT), _dicts(blocks))


def channel_notice(title: str, lines: Sequence[str], severity: str) -> Message:
    """A notice about pitcrew as a whole (the breaker opened): a top-level channel message."""
    mark = {"critical": ":rotating_light: ", "warning": ":warning: "}.get(severity, "")
    return reply(Mrkdwn(mark + escape(title)), lines, None)
