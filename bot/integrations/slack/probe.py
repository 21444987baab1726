"""Slack's answer to ``pitcrew check-config --live``: the bot token works and the bot is in the channel.

Needs only the Web API client and the channel, not the store, so ``check-config`` reaches Slack
without opening pitcrew's database. Changes nothing in Slack (two reads). A scope Slack refuses
(``missing_scope`` with ``needed``) is named, so the installer knows what to add to the app.
"""

from __future__ import annotations

from slack_sdk.errors import SlackApiError
from slack_sdk.web.async_client import AsyncWebClient

from bot.engine.ports import Probe


class SlackProbe:
    far_side = "slack"

    def __init__(self, client: AsyncWebClient, channel: str) -> None:
        self.client = client
        self.channel = channel

    async def probe(self) -> Probe:
        """``auth.test`` and the bot's membership of the channel; a refused scope is named."""
        try:
            identity = await self.client.auth_test()
            info = await self.client.conversations_info(channel=self.channel)
        except SlackApiError as exc:
            data = exc.response.data if isinstance(exc.response.data, dict) else {}
            error = str(data.get("error", "error"))
            needed = tuple(s for s in str(data.get("needed", "")).split(",") if s)
            if error == "missing_scope":
                return Probe("slack", False, f"the bot token lacks scope {', '.join(needed)}", needed)
            if error in {"channel_not_found", "not_in_channel"}:
                return Probe("slack", False, f"channel {self.channel}: {error}", (f"channel {self.channel}",))
            return Probe("slack", False, f"Slack refused: {error}")
        except Exception as exc:  # the probe reports, never raises
            return Probe("slack", False, f"Slack unreachable: {type(exc).__name__}")
        channel = info.get("channel") or {}
        if not channel.get("is_member"):
            return Probe(
                "slack",
                False,
                f"the bot is not in channel {self.channel}: /invite it",
                (f"channel {self.channel}",),
            )
        return Probe(
            "slack",
            True,
            f"bot {identity.get('user')} in team {identity.get('team')}, channel {self.channel}",
        )
