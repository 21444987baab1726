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

from prometheus_client import CollectorRegistry
from slack_sdk.web.async_client import AsyncWebClient

from bot.config import GrafanaSettings, SlackSettings, read_secret
from bot.domain.policy import Policy
from bot.engine.commands import Commands
from bot.integrations.slack.approvers import Approvers, SecondApproverRule
from bot.integrations.slack.inbound import SlackInbound
from bot.integrations.slack.outbound import EVENTS, NAME, SlackDestination, SlackLinks
from bot.integrations.slack.probe import SlackProbe
from bot.integrations.slack.socket import SocketMode
from bot.store.base import Store

__all__ = [
    "EVENTS",
    "NAME",
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
        return SocketMode(inbound.app, token, registry)


def _client(settings: SlackSettings) -> AsyncWebClient:
    assert settings.bot_token_file is not None, "bot.config refuses notifier slack without a bot token"
    token = read_secret(settings.bot_token_file, "slack.bot_token_file")
    return AsyncWebClient(token=token, base_url=settings.base_url or AsyncWebClient.BASE_URL)


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
) -> Slack:
    """The Web API client and what needs only it and the store (the config was checked at load)."""
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
    destination = SlackDestination(client, store, links, clock, on_thread)
    return Slack(settings, client, destination, approvers)
