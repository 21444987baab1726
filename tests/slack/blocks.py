"""Re-export: Block Kit validation lives in ``bot.demo.slack.blocks`` (the demo's stand-in applies it)."""

from bot.demo.slack.blocks import MAX_BLOCKS, SECTION_TEXT, invalid_blocks_body, stored, validate

__all__ = ["MAX_BLOCKS", "SECTION_TEXT", "invalid_blocks_body", "stored", "validate"]
