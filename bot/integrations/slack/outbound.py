"""The outbox's Slack destination: one thread per incident, one digest per storm, nothing twice.

``SlackDestination.deliver`` gets one outbox item at a time, in order per incident
(``bot.engine.outbox``), and turns it into Web API calls:

- the incident notice posts the **parent** message (its ts kept in the store as the thread);
- step outcomes, decisions and later notices are **replies** in that thread; the summary is
  broadcast to the channel (``reply_broadcast``);
- after each (or after the last of a run of them waiting together), the parent is **updated**
  from the store (``parent.ParentViews``): state, current step, who decided what when, and only
  the buttons still possible; edits wait for a turn under ``chat.update``'s tier (``updates``);
- a parent a person (or a retention policy) **deleted** — ``chat.update`` answers
  ``message_not_found`` — is replaced: a new parent says so, becomes the thread, takes this item's
  reply, and its permalink replaces the old one (the read API's Slack link follows it); so is a
  parent Slack will **no longer let pitcrew edit** (``edit_window_closed``: the workspace's edit
  window has closed on it; ``cant_update_message``), which stays, with its replies, as it was; if
  the new parent takes no edits either (a workspace that allows none), it stays the thread and is
  no longer asked to change (``frozen:<id>``): one new parent, not one a notice;
- when ``digest_threshold`` incidents open within ``digest_window``, later ones join one **digest**
  message (``digest``), updated at most once a second, instead of a thread each;
- notices about pitcrew as a whole (the breaker) are top-level channel messages.

Every post carries message metadata naming its outbox item. A delivery begun before a crash
(``item.attempts > 1``) first looks for that metadata in the channel or thread (``lookup``) and,
if Slack already has the message, records its ts instead of posting again. Text is escaped by
``messages``; what is built here from outside text (a step's name, an actor) is escaped too.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from slack_sdk.web.async_client import AsyncWebClient

from bot import logger
from bot.config import GrafanaSettings
from bot.engine.errors import PermanentError, PitcrewError
from bot.engine.outbox import create_once
from bot.engine.ports import Notice, Probe
from bot.integrations.slack import messages
from bot.integrations.slack.digest import PREFIX as DIGEST
from bot.integrations.slack.digest import StormDigest
from bot.integrations.slack.errors import MessageClosed, MessageGone, MessageUneditable, call
from bot.integrations.slack.lookup import METADATA_TYPE, find_posted, posted_since
from bot.integrations.slack.messages import Message, Mrkdwn, escape
from bot.integrations.slack.parent import ParentViews, who
from bot.integrations.slack.probe import SlackProbe
from bot.integrations.slack.updates import ChatUpdates
from bot.store.base import IncidentRecord, OutboxItem, Store, incident_ref, link_key

log = logger(__name__)

NAME = "slack"
#: Timeline events that reach Slack (``SqliteStore.route_events``): step outcomes and decisions
#: become replies; state changes only update the parent.
EVENTS = frozenset(
    {
        "step_finished",
        "step_skipped",
        "approved",
        "rejected",
        "approve_refused",
        "reject_refused",
        "rollback_refused",
        "rollback_requested",
        "rollback_done",
        "approval_vote",
        "state",
    }
)
_DECISIONS = EVENTS - {"step_finished", "step_skipped", "state"}


@dataclass(frozen=True, slots=True)
class SlackLinks:
    channel: str
    #: Grafana's settings: the incident's dashboard link is theirs to make (``incident_dashboard``).
    grafana: GrafanaSettings = field(default_factory=GrafanaSettings)
    runbook_url: str | None = None
    digest_window: timedelta = timedelta(minutes=2)
    digest_threshold: int = 5


class SlackDestination:
    def __init__(
        self,
        client: AsyncWebClient,
        store: Store,
        links: SlackLinks,
        clock: Callable[[], datetime],
        on_thread: Callable[[str, str], None] = lambda incident_id, url: None,
    ) -> None:
        self.client = client
        self._store = store
        self._links = links
        self._clock = clock
        #: Told each incident's thread permalink (``Metrics.incidents.link``: the Grafana table).
        self._on_thread = on_thread
        self._updates = ChatUpdates(client, links.channel)
        self._views = ParentViews(store, links.grafana, links.runbook_url, _DECISIONS)
        self._digest = StormDigest(
            self._updates, store, links.channel, links.digest_window, links.digest_threshold, clock
        )

    @property
    def name(self) -> str:
        return NAME

    @property
    def channel(self) -> str:
        return self._links.channel

    # ----------------------------------------------------------------- deliver
    async def deliver(self, item: OutboxItem, *, more: bool = False) -> str | None:
        if item.incident_id is None:
            notice = Notice.from_record(item.payload)
            message = messages.channel_notice(notice.title, notice.lines, notice.severity)
            return await self._post(item, message)
        incident = await self._store.incident(item.incident_id)
        if incident is None:
            return None  # written in the same transaction as the incident: only a test store lacks it
        thread = await self._store.outbox_ref(NAME, incident_ref("thread", incident.id))
        if thread is None:
            storm = await self._digest.joins(incident)
            if not storm and _is_event(item) and item.kind not in _DECISIONS:
                return None  # before the incident notice: the parent will show it
            if storm:
                ref = await self._digest.show(item, incident, None, self._post)
                await self._store.set_outbox_ref(
                    NAME, incident_ref("thread", incident.id), ref, self._clock()
                )
                return ref
            if not _is_event(item):
                await self._store.set_outbox_ref(
                    NAME, incident_ref("parent", incident.id), json.dumps(dict(item.payload)), self._clock()
                )
            ts = await self._post(item, await self._parent(incident))
            await self._store.set_outbox_ref(NAME, incident_ref("thread", incident.id), ts, self._clock())
            await self._permalink(incident.id, ts)
            return ts
        if thread.startswith(DIGEST):
            return await self._digest.show(item, incident, thread, self._post)
        posted: str | None = None
        try:
            posted = await self._reply(item, incident, thread)
            # The last of a run of this incident's items updates the parent for all of them.
            if not more and await self._store.outbox_ref(NAME, incident_ref("frozen", incident.id)) != thread:
                await self._updates.update(thread, await self._parent(incident))
        except PermanentError as exc:
            if not isinstance(exc, MessageClosed):
                raise
            if (
                isinstance(exc, MessageUneditable)
                and await self._store.outbox_ref(NAME, incident_ref("replaced-why", incident.id))
                == MessageUneditable.moved
            ):
                # The parent that continued an uneditable one takes no edits either (a workspace
                # that allows none): it stays the thread, its replies go on, and it is not asked
                # to change again, rather than a new parent posted with every notice.
                log.warning(
                    "the Slack message of %s can no longer be edited either (%s); its thread goes on "
                    "without updates to it",
                    incident.id,
                    exc,
                    extra={"incident": incident.id, "reason": "message_uneditable"},
                )
                await self._store.set_outbox_ref(
                    NAME, incident_ref("frozen", incident.id), thread, self._clock()
                )
                return posted or thread
            if isinstance(exc, MessageGone):
                await self._withdraw(incident, thread)
                posted = None  # withdrawn if it was posted: it goes under the new parent
            # Deleted, or no longer editable: the incident goes on under a new parent (built from
            # the store just now, so it shows everything), this item's reply with it unless it is
            # already in the earlier parent's thread, which stays.
            thread = await self._rehome(item, incident, thread, exc)
            if posted is None:
                posted = await self._reply(item, incident, thread)
            await self._permalink(incident.id, thread, renew=True)
            return posted or thread
        if not more:
            await self._permalink(incident.id, thread)
        return posted or thread

    async def _reply(self, item: OutboxItem, incident: IncidentRecord, thread: str) -> str | None:
        """This item's reply in the thread (none for the incident notice, which only feeds the parent)."""
        if item.kind == "incident" and not _is_event(item):
            await self._store.set_outbox_ref(
                NAME, incident_ref("parent", incident.id), json.dumps(dict(item.payload)), self._clock()
            )
            return None
        if item.kind == "state":
            return None
        built = self.reply_for(item)
        if built is None:
            return None
        return await self._post(item, built, thread_ts=thread, broadcast=item.kind == "summary")

    async def _withdraw(self, incident: IncidentRecord, gone: str) -> None:
        """Delete the replies to ``gone`` posted after it was deleted: Slack takes a reply to a
        deleted parent without an error and shows it at the channel's top level, alone (its
        developers: the app "has to delete (or cancel to post) its reply"). They are the incident's
        top-level posts after the parent that are not a parent themselves. The one being delivered
        is posted again under the new parent; the new parent, built from the store, shows what the
        others said."""
        strays = await posted_since(
            self.client,
            self.channel,
            gone,
            lambda p: p.get("incident_id") == incident.id and "replaces" not in p,
        )
        for ts in strays:
            with contextlib.suppress(MessageGone):  # gone already (a retry after a crash, a person)
                await call(self.client.chat_delete(channel=self.channel, ts=ts))

    async def _rehome(
        self, item: OutboxItem, incident: IncidentRecord, earlier: str, closed: MessageClosed
    ) -> str:
        """A new parent for an incident whose parent ``earlier`` was deleted or can no longer be edited
        (``closed`` says which); its ts, kept as the thread. Posted once: after a crash it is found
        by the metadata naming the message it replaces."""
        log.warning(
            "the Slack message of %s %s (%s); a new one continues its thread",
            incident.id,
            closed.why,
            closed,
            extra={"incident": incident.id, "reason": f"message_{closed.moved}"},
        )
        await self._store.set_outbox_ref(NAME, incident_ref("replaced", incident.id), earlier, self._clock())
        await self._store.set_outbox_ref(
            NAME, incident_ref("replaced-why", incident.id), closed.moved, self._clock()
        )
        message = messages.parent(await self._views.view(incident))
        metadata = {"outbox_id": item.id, "incident_id": incident.id, "replaces": earlier}

        async def post() -> str:
            answer = await call(
                self.client.chat_postMessage(
                    channel=self.channel,
                    metadata={"event_type": METADATA_TYPE, "event_payload": metadata},
                    **_content(message),
                )
            )
            return str(answer["ts"])

        ts = await create_once(
            item,
            lambda: self._find(None, lambda p: p.get("replaces") == earlier),
            post,
            "new parent in Slack",
        )
        await self._store.set_outbox_ref(NAME, incident_ref("thread", incident.id), ts, self._clock())
        return ts

    async def _permalink(self, incident_id: str, thread_ts: str, *, renew: bool = False) -> None:
        """Keep the thread's permalink (``chat.getPermalink``, once; again after the parent was
        replaced, ``renew``) where the read API and ``pitcrew incidents show`` find it, and tell
        ``on_thread`` (again after a restart). Best effort: a failure is logged and the next delivery
        of the incident tries again; it never holds a notice back."""
        url = await self._store.outbox_ref(NAME, link_key(incident_id))
        if url is None or (renew and _ts_of(url) != thread_ts):
            try:
                answer = await call(self.client.chat_getPermalink(channel=self.channel, message_ts=thread_ts))
            except PitcrewError as exc:
                log.warning("no permalink for the Slack thread of %s yet: %s", incident_id, exc)
                return
            url = str(answer["permalink"])
            await self._store.set_outbox_ref(NAME, link_key(incident_id), url, self._clock())
        self._on_thread(incident_id, url)

    def reply_for(self, item: OutboxItem) -> Message | None:
        p = item.payload
        if not _is_event(item):
            notice = Notice.from_record(p)
            if item.kind == "summary":
                return messages.summary(notice.title, notice.lines, notice.incident_id)
            return messages.reply(notice.title, notice.lines, notice.incident_id)
        detail = str(p.get("detail") or "")
        actor = who(str(p["actor"])) if p.get("actor") else None
        if item.kind in {"step_finished", "step_skipped"}:
            outcome = str(p.get("outcome") or "")
            mark = {"ok": ":white_check_mark:", "failed": ":x:", "skipped": ":fast_forward:"}.get(
                outcome, "•"
            )
            title = Mrkdwn(f"{mark} {escape(str(p.get('step')))}: {escape(outcome)}")
            return messages.reply(title, [detail] if detail else [], item.incident_id)
        titles = {
            "approved": f":white_check_mark: approved by {actor}",
            "rejected": f":no_entry: rejected by {actor}: nothing will be done",
            "approve_refused": f":lock: approval by {actor} refused",
            "reject_refused": f":lock: rejection by {actor} refused",
            "rollback_refused": f":lock: rollback by {actor} refused",
            "rollback_requested": f":leftwards_arrow_with_hook: rollback requested by {actor}",
            "rollback_done": f":leftwards_arrow_with_hook: rollback by {actor} done",
            "approval_vote": f":ballot_box_with_check: first approval by {actor}; a second, different approver is needed",
        }
        title = Mrkdwn(titles[item.kind]) if item.kind in titles else escape(item.kind)
        return messages.reply(title, [detail] if detail else [], item.incident_id)

    # ----------------------------------------------------------------- posting
    async def _post(
        self, item: OutboxItem, message: Message, thread_ts: str | None = None, broadcast: bool = False
    ) -> str:
        """Post ``message`` once: a delivery begun before a crash first looks for what it posted."""

        async def post() -> str:
            answer = await call(
                self.client.chat_postMessage(
                    channel=self.channel,
                    thread_ts=thread_ts,
                    reply_broadcast=True if broadcast else None,
                    metadata={
                        "event_type": METADATA_TYPE,
                        "event_payload": {"outbox_id": item.id, "incident_id": item.incident_id or ""},
                    },
                    **_content(message),
                )
            )
            return str(answer["ts"])

        return await create_once(
            item,
            lambda: self._find(thread_ts, lambda p: p.get("outbox_id") == item.id and "replaces" not in p),
            post,
            "notice in Slack",
        )

    async def _find(self, thread_ts: str | None, match: Callable[[Mapping[str, Any]], bool]) -> str | None:
        return await find_posted(self.client, self.channel, thread_ts, match)

    # ----------------------------------------------------------------- the parent
    async def _parent(self, incident: IncidentRecord) -> Message:
        return messages.parent(await self._views.view(incident))

    # ----------------------------------------------------------------- probe
    async def probe(self) -> Probe:
        """``auth.test`` and the bot's membership of the channel (``bot.integrations.slack.probe``)."""
        return await SlackProbe(self.client, self.channel).probe()


def _ts_of(permalink: str) -> str:
    """The message ts a permalink names (``…/p1795941999000200`` → ``1795941999.000200``)."""
    digits = permalink.rsplit("/p", 1)[-1].split("?", 1)[0]
    return f"{digits[:-6]}.{digits[-6:]}" if digits.isdigit() and len(digits) > 6 else ""


def _is_event(item: OutboxItem) -> bool:
    return bool(item.payload.get("event"))


def _content(message: Message) -> dict[str, Any]:
    return {"text": message.text, "blocks": message.blocks}
