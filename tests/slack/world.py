"""Re-export: the stand-in's workspace lives in ``bot.demo.slack.world`` (the demo runs it too)."""

from bot.demo.slack.world import APP_TOKEN, BOT_TOKEN, SIGNING_SECRET, TESTER_TOKEN, Channel, World

__all__ = ["APP_TOKEN", "BOT_TOKEN", "SIGNING_SECRET", "TESTER_TOKEN", "Channel", "World"]
