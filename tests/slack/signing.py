"""Re-export: signed Slack requests are built by ``bot.demo.slack.signing`` (the demo's clicks use it)."""

from bot.demo.slack.signing import (
    SignedRequest,
    block_action,
    form_body,
    interactive,
    sign,
    signature,
    slash_command,
    slash_fields,
)

__all__ = [
    "SignedRequest",
    "block_action",
    "form_body",
    "interactive",
    "sign",
    "signature",
    "slash_command",
    "slash_fields",
]
