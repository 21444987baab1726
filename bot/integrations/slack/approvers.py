"""Who may decide from Slack: an allowlist of user ids and/or a user group, and the two-approver rule.

The group's members come from ``usergroups.users.list`` and are cached for ``group_cache``; when
Slack cannot be asked, the last answer stands (never an empty list that would lock everyone out,
never a guess that would let someone in). The two-approver rule asks a second, different approver
when approving would put more nodes under remediation at once than the operator allows
(``slack.second_approver_nodes`` / ``second_approver_fraction``); the first approval is then a
vote in the timeline (``approval_vote``), read back from the store, so it survives a restart.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta

from slack_sdk.web.async_client import AsyncWebClient

from bot import logger
from bot.engine.errors import PitcrewError
from bot.integrations.slack.errors import call
from bot.store.base import IncidentRecord, Store

log = logger(__name__)
SLACK = "slack:"


@dataclass(frozen=True, slots=True)
class SecondApproverRule:
    nodes: int | None = None
    fraction: float | None = None
    fleet_size: int | None = None
    window: timedelta = timedelta(hours=1)

    def needs_second(self, under_remediation: int) -> bool:
        """``under_remediation`` counts the nodes being remediated, the one to approve included."""
        if self.nodes is not None and under_remediation > self.nodes:
            return True
        if self.fraction is not None and self.fleet_size:
            return under_remediation > max(math.floor(self.fraction * self.fleet_size), 1)
        return False


class Approvers:
    def __init__(
        self,
        client: AsyncWebClient,
        allowlist: tuple[str, ...],
        group: str | None,
        cache: timedelta,
        rule: SecondApproverRule,
        store: Store,
        clock: Callable[[], datetime],
    ) -> None:
        self._client = client
        self._allowlist = frozenset(allowlist)
        self._group = group
        self._cache = cache.total_seconds()
        self._rule = rule
        self._store = store
        self._clock = clock
        self._members: frozenset[str] | None = None
        self._fetched = -math.inf

    async def allows(self, user_id: str) -> bool:
        if user_id in self._allowlist:
            return True
        return user_id in await self._group_members()

    async def vouch(self, actor: str) -> bool:
        """For ``Commands``: an actor ``slack:<user id>`` this workspace's rules let decide."""
        return actor.startswith(SLACK) and await self.allows(actor.removeprefix(SLACK))

    async def _group_members(self) -> frozenset[str]:
        if self._group is None:
            return frozenset()
        if self._members is None or time.monotonic() - self._fetched >= self._cache:
            try:
                answer = await call(self._client.usergroups_users_list(usergroup=self._group))
            except PitcrewError as exc:
                log.warning("approver group not read; using the last answer", extra={"reason": exc.reason})
                return self._members or frozenset()
            self._members = frozenset(str(u) for u in answer.get("users") or [])
            self._fetched = time.monotonic()
        return self._members

    async def second_needed(self, incident: IncidentRecord) -> bool:
        if self._rule.nodes is None and self._rule.fraction is None:
            return False
        since = self._clock() - self._rule.window
        others = await self._store.nodes_in_remediation(since, exclude_node=incident.node)
        return self._rule.needs_second(len(others) + 1)

    async def earlier_votes(self, incident: IncidentRecord, since: datetime) -> set[str]:
        """Actors who cast a first approval of the pending approval (requested at ``since``)."""
        return {
            e.actor
            for e in await self._store.events_of(incident.id)
            if e.kind == "approval_vote" and e.actor and e.at >= since
        }
