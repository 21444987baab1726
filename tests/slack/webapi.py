"""Re-export: the Web API stand-in lives in ``bot.demo.slack.webapi`` (the demo runs it too)."""

from bot.demo.slack.webapi import RECORDED, ApiError, Call, Fault, Handler, Message, WebApi

__all__ = ["RECORDED", "ApiError", "Call", "Fault", "Handler", "Message", "WebApi"]
