"""Slack's answer to ``pitcrew check-config --live``: the bot token works and the bot is in the channel,
and in Socket Mode the app-level token opens connections.

Needs only the Web API client and the channel, not the store, so ``check-config`` reaches Slack
without opening pitcrew's database. Changes nothing in Slack (two reads; in Socket Mode also
``apps.connections.open``, whose single-use URL is left to expire unused). A scope Slack refuses
(``missing_scope`` with ``needed``) is named, so the installer knows what to add to the app. The
app token is checked because nothing else would: slack_sdk's Socket Mode client retries a refused
token forever without raising.
"""

from __future__ import annotations

from slack_sdk.errors import SlackApiError
from slack_sdk.web.async_client import AsyncWebClient

from bot.engine.ports import Probe


class SlackProbe:
    far_side = "slack"

    def __init__(self, client: AsyncWebClient, channel: str, app_token: str | None = None) -> None:
        self.client = client
        self.channel = channel
        self._app_token = app_token

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
        if self._app_token is not None:
            refused = await self._app_token_refused()
            if refused is not None:
                return refused
        return Probe(
            "slack",
            True,
            f"bot {identity.get('user')} in team {identity.get('team')}, channel {self.channel}"
            + (", Socket Mode app token ok" if self._app_token is not None else ""),
        )

    async def _app_token_refused(self) -> Probe | None:
        """``apps.connections.open`` with the app-level token: ``None`` when Slack answers ``ok``."""
        setting = "slack.app_token_file"
        try:
            await self.client.apps_connections_open(app_token=self._app_token or "")
        except SlackApiError as exc:
            data = exc.response.data if isinstance(exc.response.data, dict) else {}
            error = str(data.get("error", "error"))
            if exc.response.status_code == 429:
                return Probe(
                    "slack",
                    False,
                    "Slack rate limited apps.connections.open (about once a minute); try again",
                )
            if error == "missing_scope":
                needed = tuple(s for s in str(data.get("needed", "connections:write")).split(",") if s)
                return Probe(
                    "slack", False, f"the app-level token ({setting}) lacks scope {', '.join(needed)}", needed
                )
            if error == "not_allowed_token_type":
                return Probe(
                    "slack",
                    False,
                    f"{setting} holds another kind of token; Socket Mode needs an app-level token (xapp-) "
                    "with scope connections:write",
                    (setting, "connections:write"),
                )
            return Probe(
                "slack", False, f"Slack refused the app-level token ({setting}): {error}", (setting,)
            )
        except Exception as exc:  # the probe reports, never raises
            return Probe("slack", False, f"Slack unreachable: {type(exc).__name__}")
        return None
