"""Re-export: the stand-in's server lives in ``bot.demo.slack.server`` (the demo runs it too)."""

from bot.demo.slack.server import SlackStandin

__all__ = ["SlackStandin"]
