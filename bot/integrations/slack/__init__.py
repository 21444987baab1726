"""Slack: incident threads, Approve / Reject / Rollback, ``/pitcrew``, HTTP or Socket Mode.

The only package of pitcrew that imports ``slack_sdk`` and ``slack_bolt`` (an import-linter
contract holds it to that). ``build_slack`` makes the pieces the composition root wires:
the outbox destination (``outbound``), the approvers (``approvers``), and, once the engine's
commands exist, the inbound side (``inbound``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import aiohttp
from prometheus_client import CollectorRegistry
from slack_sdk.web.async_client import AsyncWebClient
from slack_sdk.web.async_slack_response import AsyncSlackResponse

from bot.config import GrafanaSettings, SlackSettings, read_secret
from bot.domain.policy import Policy
from bot.engine.commands import Commands
from bot.integrations.fenced import last_check
from bot.integrations.slack.approvers import Approvers, SecondApproverRule
from bot.integrations.slack.inbound import SlackInbound
from bot.integrations.slack.outbound import EVENTS, NAME, SlackDestination, SlackLinks
from bot.integrations.slack.probe import SlackProbe
from bot.integrations.slack.socket import SocketMode
from bot.store.base import Store
from bot.store.lease import Fence

__all__ = [
    "EVENTS",
    "NAME",
    "FencedWebClient",
    "Slack",
    "SlackDestination",
    "SlackInbound",
    "SlackProbe",
    "SocketMode",
    "build_slack",
    "slack_probe",
]


@dataclass
class Slack:
    settings: SlackSettings
    client: AsyncWebClient
    destination: SlackDestination
    approvers: Approvers

    def inbound(self, commands: Commands, store: Store, clock: Callable[[], datetime]) -> SlackInbound:
        secret = None
        if self.settings.transport == "http" and self.settings.signing_secret_file is not None:
            secret = read_secret(self.settings.signing_secret_file, "slack.signing_secret_file")
        return SlackInbound(
            self.client,
            commands,
            store,
            self.approvers,
            clock,
            channel=self.settings.channel,
            signing_secret=secret,
        )

    def socket_mode(
        self, inbound: SlackInbound, registry: CollectorRegistry | None = None
    ) -> SocketMode | None:
        """Socket Mode's worker, its state counted in ``registry`` (``pitcrew_slack_socket_connected``)."""
        if self.settings.transport != "socket" or self.settings.app_token_file is None:
            return None
        token = read_secret(self.settings.app_token_file, "slack.app_token_file")
        return SocketMode(inbound.app, token, registry, give_up=self.settings.socket_give_up.total_seconds())

    async def aclose(self) -> None:
        """Close the outbox client's session (``FencedWebClient``), once its sender has stopped."""
        if isinstance(self.destination.client, FencedWebClient):
            await self.destination.client.aclose()


class FencedWebClient(AsyncWebClient):
    """The outbox's own Web API client: every call first asks the process's ``Fence``.

    A delivery is several calls (the reply, then the parent's update; a lookup before a redelivered
    post), and only its start is a fenced write (``outbox_attempt``). A leader stopped in the middle
    of one (SIGSTOP, a frozen VM: seen in the fencing e2e, the stop landing while it awaited
    ``chat.postMessage``'s answer) woke past its lease and sent the rest — a ``chat.update`` after
    another process had taken the thread over. As the engine's gated ports do for Slurm and
    Kubernetes, each call now raises ``Deposed`` instead once the lease may have lapsed; the outbox
    sender stops there. Slash commands and buttons answer on the plain client (any replica answers).

    The fence is asked twice: at the call's start (a deposed leader opens no connection), and
    once the connection is held, just before the request is written (``bot.integrations.fenced``):
    the fencing e2e saw a leader stopped while it connected wake and send its ``chat.update``.
    That needs a session of the client's own (slack_sdk makes one per call otherwise), made on the
    first call and closed by ``aclose`` at shutdown; it keeps its connections to Slack alive."""

    def __init__(self, fence: Fence, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.fence = fence

    async def api_call(self, *args: Any, **kwargs: Any) -> AsyncSlackResponse:
        self.fence.token()
        if self.session is None or self.session.closed:
            self.session = aiohttp.ClientSession(
                timeout=aiohttp.ClientTimeout(total=self.timeout), trace_configs=[last_check(self.fence)]
            )
        return await super().api_call(*args, **kwargs)

    async def aclose(self) -> None:
        if self.session is not None:
            await self.session.close()
            self.session = None


def _client(settings: SlackSettings, fence: Fence | None = None) -> AsyncWebClient:
    assert settings.bot_token_file is not None, "bot.config refuses notifier slack without a bot token"
    token = read_secret(settings.bot_token_file, "slack.bot_token_file")
    base_url = settings.base_url or AsyncWebClient.BASE_URL
    if fence is not None:
        return FencedWebClient(fence, token=token, base_url=base_url)
    return AsyncWebClient(token=token, base_url=base_url)


def slack_probe(settings: SlackSettings) -> SlackProbe:
    """What ``check-config --live`` asks Slack: the same client ``pitcrew serve`` builds, no store;
    in Socket Mode the app-level token too."""
    app_token = None
    if settings.transport == "socket" and settings.app_token_file is not None:
        app_token = read_secret(settings.app_token_file, "slack.app_token_file")
    return SlackProbe(_client(settings), settings.channel, app_token)


def build_slack(
    settings: SlackSettings,
    policy: Policy,
    store: Store,
    clock: Callable[[], datetime],
    grafana: GrafanaSettings | None = None,
    on_thread: Callable[[str, str], None] = lambda incident_id, url: None,
    fence: Fence | None = None,
) -> Slack:
    """The Web API client and what needs only it and the store (the config was checked at load);
    with ``fence``, the outbox destination posts through a ``FencedWebClient`` of its own."""
    client = _client(settings)
    links = SlackLinks(
        channel=settings.channel,
        grafana=grafana or GrafanaSettings(),
        runbook_url=settings.runbook_url,
        digest_window=settings.digest_window,
        digest_threshold=settings.digest_threshold,
    )
    breaker = policy.guards.breaker
    rule = SecondApproverRule(
        nodes=settings.second_approver_nodes,
        fraction=settings.second_approver_fraction,
        fleet_size=breaker.fleet_size,
        window=breaker.window,
    )
    approvers = Approvers(
        client, tuple(settings.approvers), settings.approver_group, settings.group_cache, rule, store, clock
    )
    posting = _client(settings, fence) if fence is not None else client
    destination = SlackDestination(posting, store, links, clock, on_thread)
    return Slack(settings, client, destination, approvers)
