"""mrkdwn as Slack reads it: the control sequences inside ``<…>``, the three entities, and what a person sees.

Slack treats ``&``, ``<`` and ``>`` as control characters in mrkdwn (the top-level ``text`` of a message
and every ``mrkdwn`` text object): ``<@U…>`` mentions a user, ``<#C…>`` a channel, ``<!channel>``,
``<!here>``, ``<!everyone>`` and ``<!subteam^S…>`` notify many people, and ``<url|label>`` is a link whose
label hides its address. Text meant as text must be sent with ``&amp;`` ``&lt;`` ``&gt;`` in their place
(docs.slack.dev/messaging/formatting-message-text, "Escaping text"). ``plain_text`` objects are not parsed
for either (Block Kit text object reference). Pure: no I/O.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_TOKEN = re.compile(r"<([^<>]*)>")
_ENTITY = re.compile(r"&(amp|lt|gt);")
#: What a link's target is when the app means a link: an address with a scheme.
_ADDRESS = re.compile(r"(?:[a-z][a-z0-9+.-]*://|mailto:|tel:)", re.IGNORECASE)
#: Special mentions that notify a whole channel or workspace, not one person.
BROADCASTS = frozenset({"!channel", "!here", "!everyone"})


@dataclass(frozen=True, slots=True)
class Control:
    """One ``<…>`` sequence: its raw form, what it is, and where it starts in the text."""

    raw: str
    kind: str  # "user", "channel", "broadcast", "usergroup", "special", "link"
    target: str
    label: str
    at: int


def controls(text: str) -> list[Control]:
    """Every control sequence of ``text``, in order."""
    found: list[Control] = []
    for match in _TOKEN.finditer(text):
        inner = match.group(1)
        target, _, label = inner.partition("|")
        if target.startswith("@"):
            kind = "user"
        elif target.startswith("#"):
            kind = "channel"
        elif target in BROADCASTS:
            kind = "broadcast"
        elif target.startswith("!subteam^"):
            kind = "usergroup"
        elif target.startswith("!"):
            kind = "special"  # !date^…, the deprecated !group
        else:
            kind = "link"
        found.append(Control(match.group(0), kind, target, label, match.start()))
    return found


def bare_ampersands(text: str) -> list[int]:
    """Offsets of ``&`` that begin none of the three entities (Slack wants ``&amp;`` there)."""
    return [m.start() for m in re.finditer("&", text) if not _ENTITY.match(text, m.start())]


def stray_brackets(text: str) -> list[int]:
    """Offsets of ``<`` or ``>`` outside any control sequence (unescaped, so Slack may misread them)."""
    inside = {i for m in _TOKEN.finditer(text) for i in range(m.start(), m.end())}
    return [i for i, c in enumerate(text) if c in "<>" and i not in inside]


def unescape(text: str) -> str:
    return text.replace("&lt;", "<").replace("&gt;", ">").replace("&amp;", "&")


def mrkdwn_texts(blocks: object, pointer: str = "/blocks") -> list[tuple[str, str]]:
    """Every ``mrkdwn`` text object in ``blocks`` as (JSON pointer, text)."""
    found: list[tuple[str, str]] = []
    if isinstance(blocks, dict):
        if blocks.get("type") == "mrkdwn" and isinstance(blocks.get("text"), str):
            found.append((pointer + "/text", blocks["text"]))
        for key, value in blocks.items():
            found += mrkdwn_texts(value, f"{pointer}/{key}")
    elif isinstance(blocks, list):
        for index, value in enumerate(blocks):
            found += mrkdwn_texts(value, f"{pointer}/{index}")
    return found


@dataclass(frozen=True, slots=True)
class Flag:
    """Markup Slack would act on that the app most likely did not mean (``WebApi.flags``)."""

    method: str
    pointer: str
    what: str
    raw: str

    def __str__(self) -> str:
        return f"{self.method} {self.pointer}: {self.what}: {self.raw!r}"


def audit(method: str, pointer: str, text: str, outside: list[str], broadcasts_allowed: bool) -> list[Flag]:
    """What in ``text`` would notify a channel, or came from ``outside`` and still acts as markup.

    ``outside`` holds strings a test says came from outside the app (a Slurm job name, an alert's
    description): any control sequence found inside one of them means the app put foreign text into
    mrkdwn unescaped. A bare ``&`` anywhere is flagged too: Slack asks for ``&amp;`` always. So is a
    "link" with no address (``<id>`` in a usage line): Slack shows it as a link, not as text."""
    flags: list[Flag] = []
    for control in controls(text):
        if control.kind == "broadcast" and not broadcasts_allowed:
            flags.append(Flag(method, pointer, "notifies the whole channel", control.raw))
        elif any(control.raw in s for s in outside):
            flags.append(Flag(method, pointer, f"a {control.kind} from outside, unescaped", control.raw))
        elif control.kind == "link" and not _ADDRESS.match(control.target):
            # Slack formats every remaining <…> as a link, its label after the pipe: `<id>` shows as
            # a link named "id", `<node|incident>` as "incident" (formatting docs, "Parsing").
            flags.append(Flag(method, pointer, "a placeholder Slack shows as a link", control.raw))
    for offset in bare_ampersands(text):
        flags.append(Flag(method, pointer, "a bare & (Slack wants &amp;)", text[offset : offset + 12]))
    return flags
