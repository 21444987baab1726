"""Re-export: the Web API stand-in lives in ``bot.demo.slack.webapi`` (the demo runs it too)."""

from bot.demo.slack.webapi import ApiError, Call, Fault, Handler, Message, WebApi

__all__ = ["ApiError", "Call", "Fault", "Handler", "Message", "WebApi"]
