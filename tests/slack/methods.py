"""Re-export: the stand-in's Web API methods live in ``bot.demo.slack.methods`` (the demo runs them too)."""

from bot.demo.slack.methods import METHODS, PITCREW_METHODS, SCOPES

__all__ = ["METHODS", "PITCREW_METHODS", "SCOPES"]
