"""Re-export: the stand-in on its own thread lives in ``bot.demo.slack.threaded`` (the demo runs it so)."""

from bot.demo.slack.threaded import ThreadedStandin, threaded_standin

__all__ = ["ThreadedStandin", "threaded_standin"]
