"""Block Kit validation as Slack's chat.postMessage / chat.update apply it, and the echo Slack stores.

Limits and error wording come from ``fixtures/slack/limits.md`` and ``error-invalid-blocks.json``: the
error names the JSON pointer and "limit + 1". This module is pure (no I/O) so the Web API stand-in and a
table test over every notice pitcrew builds can share it.
"""

from __future__ import annotations

import copy
import hashlib
from typing import Any

MAX_BLOCKS = 50
SECTION_TEXT = 3000
SECTION_FIELDS = 10
SECTION_FIELD_TEXT = 2000
HEADER_TEXT = 150
BUTTON_TEXT = 75
BUTTON_VALUE = 2000
BUTTON_URL = 3000
ACTION_ID = 255
BLOCK_ID = 255
ACTIONS_ELEMENTS = 25
CONTEXT_ELEMENTS = 10
#: All the text of a message's blocks together: past it Slack answers ``msg_blocks_too_long``,
#: however small each part. Undocumented; Slack's developers give 12,000 characters "with a buffer
#: for block containers" (slackapi/bolt-js#2867), and messages were refused from about 13,200
#: (#2509).
BLOCKS_TEXT = 12_000

KNOWN_BLOCKS = frozenset(
    {"section", "header", "actions", "context", "divider", "image", "rich_text", "input", "file", "video"}
)


def _too_long(errors: list[str], obj: Any, pointer: str, limit: int) -> None:
    """A text object over its limit: Slack reports the schema miss on the object and the length on text."""
    if not isinstance(obj, dict) or not isinstance(obj.get("text"), str):
        errors.append(f"failed to match all allowed schemas [json-pointer:{pointer}]")
        return
    if len(obj["text"]) > limit:
        errors.append(f"failed to match all allowed schemas [json-pointer:{pointer}]")
        errors.append(f"must be less than {limit + 1} characters [json-pointer:{pointer}/text]")


def _check_id(
    errors: list[str], obj: dict[str, Any], key: str, pointer: str, limit: int, seen: set[str]
) -> None:
    """``obj[key]`` (a ``block_id`` or an ``action_id``): at most ``limit`` characters, unique in the message."""
    value = obj.get(key)
    if not isinstance(value, str):
        return
    if len(value) > limit:
        errors.append(f"must be less than {limit + 1} characters [json-pointer:{pointer}/{key}]")
    elif value in seen:
        errors.append(f'`{key}` "{value}" already exists [json-pointer:{pointer}/{key}]')
    seen.add(value)


def _check_element(errors: list[str], el: Any, pointer: str, action_ids: set[str]) -> None:
    if not isinstance(el, dict):
        errors.append(f"failed to match all allowed schemas [json-pointer:{pointer}]")
        return
    _check_id(errors, el, "action_id", pointer, ACTION_ID, action_ids)
    if el.get("type") == "button":
        _too_long(errors, el.get("text"), f"{pointer}/text", BUTTON_TEXT)
        if len(str(el.get("value", ""))) > BUTTON_VALUE:
            errors.append(f"must be less than {BUTTON_VALUE + 1} characters [json-pointer:{pointer}/value]")
        if len(str(el.get("url", ""))) > BUTTON_URL:
            errors.append(f"must be less than {BUTTON_URL + 1} characters [json-pointer:{pointer}/url]")


def _check_block(errors: list[str], block: Any, pointer: str, ids: tuple[set[str], set[str]]) -> None:
    block_ids, action_ids = ids
    if not isinstance(block, dict) or block.get("type") not in KNOWN_BLOCKS:
        errors.append(f"failed to match all allowed schemas [json-pointer:{pointer}]")
        return
    _check_id(errors, block, "block_id", pointer, BLOCK_ID, block_ids)
    kind = block["type"]
    if kind == "header":
        _too_long(errors, block.get("text"), f"{pointer}/text", HEADER_TEXT)
    elif kind == "section":
        if "text" in block:
            _too_long(errors, block["text"], f"{pointer}/text", SECTION_TEXT)
        fields = block.get("fields", [])
        if len(fields) > SECTION_FIELDS:
            errors.append(f"no more than {SECTION_FIELDS} items allowed [json-pointer:{pointer}/fields]")
        for i, field in enumerate(fields):
            _too_long(errors, field, f"{pointer}/fields/{i}", SECTION_FIELD_TEXT)
        if "text" not in block and not fields:
            errors.append(f"must provide text or fields [json-pointer:{pointer}]")
        if "accessory" in block:
            _check_element(errors, block["accessory"], f"{pointer}/accessory", action_ids)
    elif kind in ("actions", "context"):
        elements = block.get("elements")
        limit = ACTIONS_ELEMENTS if kind == "actions" else CONTEXT_ELEMENTS
        if not isinstance(elements, list) or not elements:
            errors.append(f"failed to match all allowed schemas [json-pointer:{pointer}/elements]")
            return
        if len(elements) > limit:
            errors.append(f"no more than {limit} items allowed [json-pointer:{pointer}/elements]")
        for i, el in enumerate(elements):
            _check_element(errors, el, f"{pointer}/elements/{i}", action_ids)


def validate(blocks: Any) -> list[str]:
    """Every reason Slack would answer ``invalid_blocks`` for these blocks; empty when they pass."""
    if not isinstance(blocks, list):
        return ["failed to match all allowed schemas [json-pointer:/blocks]"]
    errors: list[str] = []
    if len(blocks) > MAX_BLOCKS:
        errors.append(f"no more than {MAX_BLOCKS} items allowed [json-pointer:/blocks]")
    ids: tuple[set[str], set[str]] = (set(), set())
    for i, block in enumerate(blocks):
        _check_block(errors, block, f"/blocks/{i}", ids)
    return errors


def text_total(blocks: Any) -> int:
    """Characters of every text object's ``text`` in ``blocks`` (mrkdwn and plain_text alike)."""
    if isinstance(blocks, dict):
        own = (
            len(blocks["text"])
            if blocks.get("type") in {"mrkdwn", "plain_text"} and isinstance(blocks.get("text"), str)
            else 0
        )
        return own + sum(text_total(v) for v in blocks.values())
    if isinstance(blocks, list):
        return sum(text_total(v) for v in blocks)
    return 0


def invalid_blocks_body(errors: list[str]) -> dict[str, Any]:
    """The HTTP 200 answer of ``error-invalid-blocks.json``."""
    return {
        "ok": False,
        "error": "invalid_blocks",
        "errors": errors,
        "response_metadata": {"messages": [f"[ERROR] {e}" for e in errors]},
    }


def _stored_text(obj: dict[str, Any]) -> None:
    if obj.get("type") == "plain_text":
        obj.setdefault("emoji", True)
    elif obj.get("type") == "mrkdwn":
        obj.setdefault("verbatim", False)


def _walk(node: Any) -> None:
    if isinstance(node, dict):
        if node.get("type") in ("plain_text", "mrkdwn") and "text" in node:
            _stored_text(node)
        for value in node.values():
            _walk(value)
    elif isinstance(node, list):
        for value in node:
            _walk(value)


def stored(blocks: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The blocks as Slack echoes them: a generated ``block_id`` where none was sent, ``emoji``/``verbatim``."""
    out = copy.deepcopy(blocks)
    for i, block in enumerate(out):
        if "block_id" not in block:
            digest = hashlib.sha1(f"{i}:{block!r}".encode(), usedforsecurity=False).digest()
            block["block_id"] = "".join(chr(65 + b % 26 + (b & 32)) for b in digest[:5])
        _walk(block)
    return out
