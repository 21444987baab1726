"""pitcrew's whole service in this process, talking to the Slack stand-in over real HTTP / websocket.

``SlackPitcrew`` writes a configuration with ``integrations.notifier: slack`` pointed at the
stand-in, builds the service exactly as ``pitcrew serve`` does (``bot.runtime.build_app``, with the
simulated Slurm/cluster of ``tests/simulator`` as in ``tests.simulator.serve``) and serves it on a
loopback port. Tests then deliver Alertmanager bodies, click buttons (signed HTTP requests, or
Socket Mode envelopes) and read incidents through the read API, all on one event loop and in real
time (short engine intervals keep it fast). Nothing in pitcrew is replaced.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import secrets
import sqlite3
import time
import weakref
from collections.abc import Callable, Mapping
from pathlib import Path
from types import TracebackType
from typing import Any

import aiohttp
import yaml
from aiohttp import web

from bot.config import load_config
from bot.runtime import build_app
from bot.store.base import PAGE_MAX
from bot.web.app import DEPS
from proving_ground.proc import hold_port
from proving_ground.slack import signing
from proving_ground.slack.clicks import TIMED_OUT, deliver
from proving_ground.slack.methods import PITCREW_METHODS
from proving_ground.slack.server import SlackStandin
from proving_ground.slack.webapi import Message
from proving_ground.slack.world import APP_TOKEN, BOT_TOKEN, SIGNING_SECRET
from tests.harness.scenarios import delivery, destructive_calls, gpu_node, inventory
from tests.simulator.serve import WorldFile, simulated_ports

CHANNEL = "C0GPUOPS"
_CLICKS = itertools.count(1)
FIXTURES = Path(__file__).parent / "fixtures"


def fixture(name: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((FIXTURES / name).read_text())
    return data


def click(action: str, incident_id: str, user: str, name: str) -> dict[str, Any]:
    """The fixture's block_actions payload for ``action`` on ``incident_id`` by ``user``: a click of its
    own, as every click is (a new ``trigger_id`` and ``action_ts``), so two clicks never sign alike."""
    payload = signing.block_action(fixture("block-actions-approve.json"), user, name)
    now = time.time()
    payload["trigger_id"] = f"{int(now)}.{next(_CLICKS)}.{secrets.token_hex(16)}"
    payload["actions"][0].update({"action_id": action, "value": incident_id, "action_ts": f"{now:.6f}"})
    return payload


def _merge(into: dict[str, Any], extra: Mapping[str, Any]) -> None:
    for key, value in extra.items():
        if isinstance(value, Mapping) and isinstance(into.get(key), dict):
            _merge(into[key], value)
        else:
            into[key] = value


class SlackPitcrew:
    def __init__(
        self,
        workdir: Path,
        slack: SlackStandin,
        *,
        transport: str = "http",
        config: Mapping[str, Any] | None = None,
        inventory: Path | None = None,
        replace_seconds: float = 0.0,
        connect_timeout: float = 10.0,
        wait_connected: bool = True,
    ) -> None:
        self.workdir = workdir
        self.slack = slack
        self.transport = transport
        self.connect_timeout = connect_timeout
        self.wait_connected = wait_connected
        workdir.mkdir(parents=True, exist_ok=True)
        self._held = hold_port(shared=True)  # until closed: bound beside it, taken by nobody else
        weakref.finalize(self, self._held.close)  # a start that failed never reaches __aexit__
        self.port = int(self._held.getsockname()[1])
        self.url = f"http://127.0.0.1:{self.port}"
        secrets = {
            "webhook.token": "test-webhook-token",
            "read.token": "test-read-token",
            "admin.token": "test-admin-token",
            "slack-bot.token": BOT_TOKEN,
            "slack-signing.secret": SIGNING_SECRET,
            "slack-app.token": APP_TOKEN,
        }
        for name, value in secrets.items():
            (workdir / name).write_text(value + "\n")
        settings: dict[str, Any] = {
            "server": {
                "listen": f"127.0.0.1:{self.port}",
                "auth": {
                    "bearer_token_file": str(workdir / "webhook.token"),
                    "read_token_file": str(workdir / "read.token"),
                    "admin_token_file": str(workdir / "admin.token"),
                },
            },
            "store": {"path": str(workdir / "pitcrew.db"), "synchronous": "normal"},
            "integrations": {"notifier": "slack", "journal_path": str(workdir / "dry-run-journal.jsonl")},
            "engine": {"poll_interval": "0.2s", "retry_backoff": "0.05s", "retry_backoff_max": "0.5s"},
            "guards": {"breaker": {"max_nodes": 10, "max_fraction": 1.0}, "node": {"cooldown": "0s"}},
            "grafana": {"url": "https://grafana.example"},  # links only: no token, no annotations
            "slack": {
                "bot_token_file": str(workdir / "slack-bot.token"),
                "transport": transport,
                "channel": CHANNEL,
                "approvers": ["U0ALICE"],
                "base_url": slack.base_url,
                "runbook_url": "https://runbooks.example/gpu",
                "retry_backoff_max": "1s",
                **(
                    {"signing_secret_file": str(workdir / "slack-signing.secret")}
                    if transport == "http"
                    else {"app_token_file": str(workdir / "slack-app.token")}
                ),
            },
        }
        _merge(settings, config or {})
        self.config_path = workdir / "pitcrew.yaml"
        self.config_path.write_text(yaml.safe_dump(settings))
        self.journal = workdir / "simulated-far-side.jsonl"
        self.world = WorldFile(self.journal, inventory, 0.0, replace_seconds)
        self._runner: web.AppRunner | None = None
        self._session: aiohttp.ClientSession | None = None

    async def __aenter__(self) -> SlackPitcrew:
        config = load_config(self.config_path)
        app = build_app(config, ports=simulated_ports(config, self.world), allow_simulated=True)
        self._runner = web.AppRunner(app, shutdown_timeout=2.0)
        await self._runner.setup()
        await web.TCPSite(self._runner, "127.0.0.1", self.port).start()
        self._session = aiohttp.ClientSession()
        if self.transport == "socket" and self.wait_connected:
            await self.slack.socket.connected(timeout=self.connect_timeout)
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, error: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._session is not None:
            await self._session.close()
        if self._runner is not None:
            await self._runner.cleanup()
        self._held.close()

    # ------------------------------------------------------------------ requests
    async def request(
        self, method: str, path: str, body: bytes | None = None, headers: Mapping[str, str] | None = None
    ) -> tuple[int, bytes]:
        assert self._session is not None
        async with self._session.request(method, self.url + path, data=body, headers=headers) as response:
            return response.status, await response.read()

    async def post_alerts(self, body: bytes) -> dict[str, Any]:
        status, raw = await self.request(
            "POST", "/api/v1/alerts", body, {"Authorization": "Bearer test-webhook-token"}
        )
        assert status == 200, raw
        answer: dict[str, Any] = json.loads(raw)
        return answer

    async def incident(self, incident_id: str) -> dict[str, Any]:
        path = f"/api/v1/incidents/{incident_id}?alerts_limit={PAGE_MAX}&events_limit={PAGE_MAX}"
        found: dict[str, Any] = {}
        while True:
            status, raw = await self.request("GET", path, headers={"Authorization": "Bearer test-read-token"})
            assert status == 200, raw
            page = json.loads(raw)
            if not found:
                found = page
            else:
                found["events"] += page["events"]
            if page["events_next"] is None:
                return found
            path = (
                f"/api/v1/incidents/{incident_id}?events_limit={PAGE_MAX}&events_after={page['events_next']}"
            )

    async def wait_incident(self, incident_id: str, *states: str, timeout: float = 30.0) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while True:
            found = await self.incident(incident_id)
            if found["state"] in states:
                return found
            assert time.monotonic() < deadline, f"{incident_id} in {states}: {found['state']}"
            await asyncio.sleep(0.1)

    async def events(self, incident_id: str, kind: str) -> list[dict[str, Any]]:
        return [e for e in (await self.incident(incident_id))["events"] if e["kind"] == kind]

    def calls(self) -> Any:
        records = (
            [json.loads(line) for line in self.journal.read_text().splitlines() if line.strip()]
            if self.journal.exists()
            else []
        )
        return destructive_calls(records)

    # ------------------------------------------------------------------ Slack
    async def interact(self, payload: dict[str, Any]) -> int:
        """Deliver an interactive payload as Slack would on this transport; the HTTP status (or 200 on ack)."""
        if self.transport == "socket":
            envelope = await self.slack.socket.send("interactive", payload)
            await self.slack.socket.ack(envelope)
            return 200
        signed = signing.interactive(SIGNING_SECRET, payload)
        status, _ = await deliver(self.url + "/slack/events", signed)
        assert status != TIMED_OUT, "pitcrew did not answer the click within Slack's 3 s"
        return status

    async def slash(
        self,
        text: str,
        user: str = "U0ALICE",
        name: str = "alice",
        channel: tuple[str, str] = (CHANNEL, "gpu-ops"),
    ) -> str:
        """``/pitcrew <text>`` typed in ``channel`` (id, name); the ephemeral answer (the ack's text, or
        the follow-up, through the command's response_url or otherwise). Slack's 3 s apply to the ack."""
        response_url = self.slack.response_url(user, channel[0])
        fields = signing.slash_fields(text, user, name, channel=channel, response_url=response_url)
        before = len(self.slack.api.ephemeral)
        if self.transport == "socket":
            envelope = await self.slack.socket.send("slash_commands", fields)
            ack = await self.slack.socket.ack(envelope)
            answer = (ack.get("payload") or {}).get("text", "")
        else:
            signed = signing.slash_command(SIGNING_SECRET, fields)
            status, raw = await deliver(self.url + "/slack/events", signed)
            assert status == 200, (status, raw)
            answer = json.loads(raw).get("text", "") if raw else ""
        if answer.startswith("Working on it"):
            await until(lambda: len(self.slack.api.ephemeral) > before)
            answer = self.slack.api.ephemeral[-1]["text"]
        return str(answer)

    async def quiet(self, seconds: float = 0.5, timeout: float = 30.0) -> None:
        """Until the outbox has caught up: nothing of Slack's is left in it, and no Slack call has
        been made for ``seconds`` (one begun before its item was marked delivered lands meanwhile;
        answers to clicks and commands do not go through the outbox). Quiet alone was not enough:
        a loop stalled for ``seconds`` on a loaded machine woke with the time passed and the
        outbox's work still to do."""
        assert self._runner is not None
        store = self._runner.app[DEPS].store
        deadline = time.monotonic() + timeout
        seen, since = len(self.slack.api.calls), time.monotonic()
        while time.monotonic() - since < seconds or await store.outbox_pending("slack", limit=1):
            assert time.monotonic() < deadline, "Slack calls never stopped"
            await asyncio.sleep(0.05)
            if len(self.slack.api.calls) != seen:
                seen, since = len(self.slack.api.calls), time.monotonic()

    def thread(self, incident_id: str) -> list[Any]:
        """The incident's thread as a human sees it (parent first), found by the parent's metadata."""
        for message in self.slack.api.messages:
            meta = (message.metadata or {}).get("event_payload", {})
            if message.thread_ts is None and meta.get("incident_id") == incident_id:
                return self.slack.api.thread(CHANNEL, message.ts)
        return []


def pending_notices(db: Path) -> int:
    """Outbox rows of the SQLite store at ``db`` not yet delivered."""
    with sqlite3.connect(db) as conn:
        return int(conn.execute("SELECT COUNT(*) FROM outbox WHERE delivered_at IS NULL").fetchone()[0])


async def to_the_end(pitcrew: SlackPitcrew, incident: str) -> dict[str, Any]:
    """The incident resolved and every notice of it delivered: the incident as the API shows it."""
    await pitcrew.wait_incident(incident, "resolved", timeout=60)
    db = pitcrew.workdir / "pitcrew.db"
    await until(lambda: pending_notices(db) == 0, what="the outbox drained")
    await pitcrew.quiet()
    return await pitcrew.incident(incident)


async def parent_closed_midway(
    slack: SlackStandin, workdir: Path, close: Callable[[str], object]
) -> tuple[Message, dict[str, Any]]:
    """An incident in auto mode whose parent Slack stops taking edits of once posted (``close`` gets
    its ts: a person deletes it, its edit window closes), run to its end: the first parent, and the
    incident (``to_the_end``)."""
    world = inventory(workdir / "inventory.yaml", {"gpu-node-02": gpu_node("ml-train/worker-2")}, [])
    async with SlackPitcrew(
        workdir / "p", slack, config={"mode": "auto"}, inventory=world, replace_seconds=2
    ) as pitcrew:
        incident = (await pitcrew.post_alerts(delivery(node="gpu-node-02")))["opened"][0]
        await until(lambda: bool(pitcrew.thread(incident)), what="the parent")
        old = pitcrew.thread(incident)[0]
        close(old.ts)
        return old, await to_the_end(pitcrew, incident)


def update_refusals(slack: SlackStandin, error: str) -> int:
    """How many ``chat.update`` calls the stand-in answered with ``error``."""
    return len([c for c in slack.api.calls_to("chat.update") if (c.answer or {}).get("error") == error])


def assert_carried_on(slack: SlackStandin, new: Message, done: dict[str, Any], error: str) -> None:
    """The incident ``done`` went on under parent ``new`` after ``chat.update`` answered ``error``
    once: no notice failed, the new parent was updated to the end, the summary is its broadcast
    reply, the later steps are in its thread, the read API links it, and the refused edit was never
    asked again."""
    assert not [e for e in done["events"] if e["kind"] == "notice_failed"]
    assert "resolved" in repr(new.blocks)  # updated to the end like any parent
    summary = [m for m in slack.api.channel_view(CHANNEL) if m.reply_broadcast]
    assert len(summary) == 1 and summary[0].thread_ts == new.ts and "finished" in summary[0].text
    replies = slack.api.thread(CHANNEL, new.ts)[1:]
    assert any("wait_ready" in m.text for m in replies)  # the steps after the earlier parent closed
    permalink = done["links"]["slack"]
    assert permalink.endswith("/p" + new.ts.replace(".", "")), permalink
    assert update_refusals(slack, error) == 1  # answered once, then never asked again


async def storm_digest_closed(
    slack: SlackStandin, workdir: Path, close: Callable[[str], object]
) -> tuple[str, list[Message]]:
    """A storm of twelve nodes whose digest Slack stops taking edits of after six (``close`` gets
    its ts: a person deletes it, its edit window closes): the digest's first ts, and the channel's
    storm digests once the twelve are delivered."""
    nodes = [f"gpu-{n:03d}" for n in range(1, 13)]
    world = inventory(workdir / "inventory.yaml", {n: gpu_node(f"ml/{n}") for n in nodes}, [])
    config = {"mode": "observe", "slack": {"digest_threshold": 3, "digest_window": "2m"}}
    async with SlackPitcrew(workdir / "p", slack, config=config, inventory=world) as pitcrew:
        for node in nodes[:6]:
            await pitcrew.post_alerts(delivery(node=node))
        await until(lambda: any("storm" in m.text for m in slack.api.messages), what="the digest")
        await pitcrew.quiet()
        digest = next(m for m in slack.api.messages if "storm" in m.text)
        close(digest.ts)
        for node in nodes[6:]:
            await pitcrew.post_alerts(delivery(node=node))
        db = pitcrew.workdir / "pitcrew.db"
        await until(
            lambda: pending_notices(db) == 0 and any("12 nodes" in m.text for m in slack.api.messages)
        )
        await pitcrew.quiet()
    return digest.ts, [m for m in slack.api.channel_view(CHANNEL) if "storm" in m.text]


async def until(predicate: Any, timeout: float = 30.0, what: str = "") -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what or predicate}"
        await asyncio.sleep(0.05)


def assert_thread_whole(
    pitcrew: SlackPitcrew, slack: SlackStandin, incident: str, done: dict[str, Any]
) -> None:
    """After an outage: the incident's thread holds every message exactly once, in the order of the
    timeline, the summary broadcast to the channel, and pitcrew called only what the manifest grants."""
    thread = pitcrew.thread(incident)
    assert thread, "no parent"
    parent, replies = thread[0], thread[1:]
    ids = [m.metadata["event_payload"]["outbox_id"] for m in thread if m.metadata]
    assert len(ids) == len(thread) and len(set(ids)) == len(ids), "a message was posted twice"
    assert ids == sorted(ids), "thread out of order"
    assert any(c.status == 429 for c in slack.api.calls)
    # Every step that finished has its one reply, in the order of the timeline.
    finished = [e["step"] for e in done["events"] if e["kind"] in {"step_finished", "step_skipped"}]
    steps_in_thread = [
        m.text.split(" ", 1)[1].split(":", 1)[0]
        for m in replies
        if m.text.startswith(":") and ":" in m.text.split(" ", 1)[1]
    ]
    assert [s for s in steps_in_thread if s in finished] == finished
    assert {c.method for c in slack.api.calls} <= PITCREW_METHODS  # the manifest grants these
    broadcast = [m for m in replies if m.reply_broadcast]
    assert len(broadcast) == 1 and "finished" in broadcast[0].text  # the summary
    assert "resolved" in repr(parent.blocks)
    channel = slack.api.channel_view("C0GPUOPS")
    assert [m.ts for m in channel] == [parent.ts, broadcast[0].ts]
