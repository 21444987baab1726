"""Re-export: the Socket Mode endpoint lives in ``bot.demo.slack.socket_mode`` (the demo serves it too)."""

from bot.demo.slack.socket_mode import DISCONNECT_REASONS, ENVELOPE_TYPES, SocketModeEndpoint

__all__ = ["DISCONNECT_REASONS", "ENVELOPE_TYPES", "SocketModeEndpoint"]
