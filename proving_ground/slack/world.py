"""Who exists in the stand-in's workspace: the fixtures' team, bot, channel, users and approvers group.

Values are those of ``fixtures/slack/README.md`` ("The world in these files"); tests may add channels,
members or groups before a call. Plain data, no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass, field

BOT_TOKEN = "xoxb-0000000000-pitcrew-test"
#: The bot token of a test's own client (the ``bot`` fixture): the same bot, so calls with it are
#: told apart from pitcrew's (``proving_ground.slack.webapi.RECORDED``).
TESTER_TOKEN = "xoxb-0000000000-pitcrew-tester"
APP_TOKEN = "xapp-1-A0PITCREW-0000000000-test"
SIGNING_SECRET = "8e3c5a1f0b7d49e2a6c4f1d3b5e7a9c0"


@dataclass
class Channel:
    id: str
    name: str
    members: set[str]
    is_private: bool = False


@dataclass
class World:
    team_id: str = "T0PITCREW"
    team: str = "Pit Crew"
    domain: str = "pitcrew"
    app_id: str = "A0PITCREW"
    bot_id: str = "B0PITBOT"
    bot_user: str = "U0PITBOT"
    bot_name: str = "pitcrew"
    bot_tokens: set[str] = field(default_factory=lambda: {BOT_TOKEN, TESTER_TOKEN})
    app_tokens: set[str] = field(default_factory=lambda: {APP_TOKEN})
    #: Scopes of the app-level token; Socket Mode needs ``connections:write``.
    app_token_scopes: set[str] = field(default_factory=lambda: {"connections:write"})
    #: The workspace's message edit setting: seconds after posting within which a message may still
    #: be edited (``chat.update`` answers ``edit_window_closed`` after it). ``None`` is Slack's
    #: default, any time; an admin may choose never (0) or a period from one minute to one week.
    edit_window: float | None = None
    #: 2026-11-29T08:46:39Z, the fixtures' incident message; ts values count up from here.
    epoch: int = 1795941999
    channels: dict[str, Channel] = field(
        default_factory=lambda: {
            "C0GPUOPS": Channel("C0GPUOPS", "gpu-ops", {"U0PITBOT", "U0ALICE", "U0MALLORY", "U0BOB"}),
            "C0ELSEWHERE": Channel("C0ELSEWHERE", "elsewhere", {"U0ALICE"}),
        }
    )
    usergroups: dict[str, list[str]] = field(default_factory=lambda: {"S0APPROVERS": ["U0ALICE"]})
    users: dict[str, str] = field(
        default_factory=lambda: {"U0ALICE": "alice", "U0MALLORY": "mallory", "U0BOB": "bob"}
    )
    #: Scopes granted to the bot token; a method needing another answers ``missing_scope``.
    scopes: set[str] = field(
        default_factory=lambda: {
            "chat:write",
            "channels:read",
            "groups:read",
            "channels:history",
            "groups:history",
            "usergroups:read",
            "commands",
        }
    )
