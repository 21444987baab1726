"""The demo's notifier: pitcrew's real Slack adapter talking to the Slack stand-in, over HTTP mode.

``SlackFarSide`` wraps the cluster far side (the Kubernetes API emulator: whatever ``FarSide`` is
given) and adds Slack: it starts the stand-in
(``proving_ground.slack``) on its own thread with throw-away tokens written into the run directory,
sets ``integrations.notifier: slack`` in pitcrew's configuration, and reads what people were told
from the stand-in's record. Approving clicks the parent message's Approve button: the stand-in
builds the ``block_actions`` payload Slack would send, signs it with the app's signing secret and
POSTs it to pitcrew's ``/slack/events`` — the very path a person's click takes.

HTTP mode rather than Socket Mode: it is the path where the signing secret is checked (a forged
or stale click is refused with 401), and a click from another terminal (``scripts/demo --click``)
needs nothing but the stand-in's address; Socket Mode is covered by ``tests/slack`` against the
same stand-in.
"""

from __future__ import annotations

import secrets
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from proving_ground.farside import FarSide, Notice
from proving_ground.pitcrew import Pitcrew
from proving_ground.proc import DemoError, wait_until
from proving_ground.slack.clicks import ClickError, Interactivity, find_button
from proving_ground.slack.server import SlackStandin
from proving_ground.slack.threaded import ThreadedStandin
from proving_ground.slack.transcript import Reader, channel_lines
from proving_ground.slack.webapi import Call, Message
from proving_ground.slack.world import World

CHANNEL = "C0GPUOPS"
#: The person who approves in the demo: an allowlisted approver of the stand-in's workspace.
APPROVER = "U0ALICE"
#: How long a person waits for the Approve button to show (Slack may be slow; the outbox retries).
BUTTON_WAIT = 60.0
#: Web API calls after which the transcript file is written again.
_CHANGES = frozenset({"chat.postMessage", "chat.update", "chat.postEphemeral"})


class SlackFarSide:
    """A cluster far side, plus the Slack stand-in behind pitcrew's real Slack adapter."""

    def __init__(self, cluster: FarSide) -> None:
        self.cluster = cluster
        self.description = f"{cluster.description}; Slack: the stand-in, behind pitcrew's real Slack adapter"
        self._threaded: ThreadedStandin | None = None
        self._secret = ""
        self.transcript: Path | None = None

    # ------------------------------------------------------------------ lifecycle
    def start(self, workdir: Path, nodes: Sequence[str]) -> None:
        self.cluster.start(workdir, nodes)
        slack_dir = workdir / "slack"
        slack_dir.mkdir(parents=True, exist_ok=True)
        bot_token = f"xoxb-demo-{secrets.token_hex(12)}"
        self._secret = secrets.token_hex(16)
        for name, value in (("bot.token", bot_token), ("signing.secret", self._secret)):
            path = slack_dir / name
            path.write_text(value + "\n")
            path.chmod(0o600)
        self._files = slack_dir
        self.transcript = workdir / "slack-transcript.txt"
        world = World(bot_tokens={bot_token}, app_tokens=set())
        self._threaded = ThreadedStandin(world).start()
        self._standin.api.on_call = self._changed

    @property
    def _standin(self) -> SlackStandin:
        if self._threaded is None:
            raise DemoError("the Slack stand-in is not running")
        return self._threaded.standin

    def pitcrew(self, workdir: Path, config: Mapping[str, Any], env: Mapping[str, str], port: int) -> Pitcrew:
        slack = {
            "integrations": {"notifier": "slack"},
            "slack": {
                "bot_token_file": str(self._files / "bot.token"),
                "transport": "http",
                "signing_secret_file": str(self._files / "signing.secret"),
                "channel": CHANNEL,
                "approvers": [APPROVER],
                "base_url": self._standin.base_url,
                "retry_backoff_max": "2s",
            },
        }
        server = self.cluster.pitcrew(workdir, _merged(config, slack), env, port)
        self._standin.interactivity = Interactivity(
            self._standin.api, f"{server.url}/slack/events", self._secret
        )
        return server

    def stop(self) -> None:
        try:
            if self._threaded is not None:
                self._write_transcript()
                self._threaded.stop()
                self._threaded = None
        finally:
            self.cluster.stop()

    # ------------------------------------------------------------------ the cluster half
    def replacements(self) -> list[str]:
        return self.cluster.replacements()

    def resets(self) -> list[str]:
        return self.cluster.resets()

    def reboots(self) -> list[str]:
        return self.cluster.reboots()

    def node_ready(self, node: str) -> str:
        return self.cluster.node_ready(node)

    def node_calls(self, node: str) -> list[str]:
        return self.cluster.node_calls(node)

    # ------------------------------------------------------------------ what people were told
    def _on_loop(self, read: Any) -> Any:
        """Run ``read()`` on the stand-in's own loop: its record only changes there."""
        assert self._threaded is not None

        async def reading() -> Any:
            return read()

        return self._threaded.run(reading())

    def _parent(self, incident_id: str) -> Message | None:
        api = self._standin.api
        for m in api.messages:
            payload = (m.metadata or {}).get("event_payload") or {}
            if m.channel == CHANNEL and m.thread_ts is None and payload.get("incident_id") == incident_id:
                return m
        return None

    def thread(self, incident_id: str | None = None) -> list[Notice]:
        """One incident's Slack thread (parent then replies), or every message the channel shows."""

        def read() -> list[Notice]:
            api = self._standin.api
            if incident_id is None:
                shown = api.channel_view(CHANNEL)
            else:
                parent = self._parent(incident_id)
                shown = api.thread(CHANNEL, parent.ts) if parent is not None else []
            reader = Reader(api.world.users)
            return [_notice(reader.message(m)) for m in shown]

        result: list[Notice] = self._on_loop(read)
        return result

    def thread_opened(self, incident_id: str) -> tuple[float, str] | None:
        def read() -> tuple[float, str] | None:
            parent = self._parent(incident_id)
            if parent is None:
                return None
            return parent.posted_at, f"#gpu-ops: {parent.text}"

        found: tuple[float, str] | None = self._on_loop(read)
        return found

    def approve(self, server: Pitcrew, incident_id: str) -> str:
        """The approver clicks Approve on the incident's parent message (a signed block_actions),
        once the message shows the button (the outbox delivers it a moment after the request)."""
        wait_until(
            lambda: self._on_loop(lambda: self._shows("Approve", incident_id)),
            timeout=BUTTON_WAIT,
            interval=0.1,
            what=f"the Approve button of {incident_id} in #gpu-ops",
        )
        try:
            answer = self.click("Approve", incident_id, APPROVER)
        except ClickError as exc:
            raise DemoError(f"cannot click Approve: {exc}") from exc
        if answer["status"] != 200:
            raise DemoError(f"pitcrew answered the signed click with HTTP {answer['status']}")
        name = self._standin.api.world.users[APPROVER]  # the workspace's people never change
        return (
            f"{name} ({APPROVER}) clicked Approve in #gpu-ops; pitcrew told them: {answer['answer'] or '-'}"
        )

    def _shows(self, button: str, incident_id: str) -> bool:
        try:
            find_button(self._standin.api, CHANNEL, button, incident_id)
        except ClickError:
            return False
        return True

    def click(self, button: str, incident_id: str, user: str) -> dict[str, Any]:
        assert self._threaded is not None
        interactivity = self._standin.interactivity
        if interactivity is None:
            raise DemoError("pitcrew is not started: no request URL for clicks")
        answer = self._threaded.run(interactivity.click(CHANNEL, button, incident_id, user))
        result: dict[str, Any] = answer.as_json()
        return result

    def state(self) -> dict[str, Any]:
        """For ``scripts/demo --click`` from another terminal, and scripts."""
        return {
            **self.cluster.state(),
            "slack_click_url": self._standin.click_url,
            "slack_channel": CHANNEL,
            "slack_approver": APPROVER,
            "slack_transcript": str(self.transcript),
        }

    def where(self, incident_id: str | None) -> list[str]:
        click = f"scripts/demo --click approve {incident_id or 'ID'}"
        return [
            *self.cluster.where(incident_id),
            f"Slack         {self.transcript} (the #gpu-ops channel and its threads, rewritten as it changes)",
            f"              Web API stand-in {self._standin.base_url}; a click as alice: {click}",
        ]

    def refused(self) -> list[str]:
        """The Web API methods pitcrew called that the stand-in does not serve (each answered
        ``unknown_method``, as Slack answers a name it has no method by), and the cluster's."""
        names = self._on_loop(lambda: sorted({c.method for c in self._standin.api.unserved}))
        mine = [
            f"Slack: pitcrew called {name}, a Web API method the stand-in does not serve" for name in names
        ]
        return [*self.cluster.refused(), *mine]

    def click_help(self, incident_id: str) -> str:
        return f"scripts/demo --click approve {incident_id}   (alice clicks Approve in #gpu-ops)"

    # ------------------------------------------------------------------ the transcript file
    def _changed(self, call: Call) -> None:
        if call.method in _CHANGES and call.answer is not None and call.answer.get("ok"):
            self._write_transcript_now()

    def _write_transcript(self) -> None:
        if self._threaded is not None:
            self._on_loop(self._write_transcript_now)

    def _write_transcript_now(self) -> None:
        if self.transcript is None:
            return
        tmp = self.transcript.with_suffix(".tmp")
        tmp.write_text("\n".join(channel_lines(self._standin.api, CHANNEL)) + "\n")
        tmp.replace(self.transcript)


def _notice(lines: list[str]) -> Notice:
    return Notice("slack", lines[0], tuple(line.strip() for line in lines[1:]))


def _merged(config: Mapping[str, Any], extra: Mapping[str, Any]) -> dict[str, Any]:
    out = {k: (dict(v) if isinstance(v, Mapping) else v) for k, v in config.items()}
    for key, value in extra.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), dict):
            out[key] = {**out[key], **value}
        else:
            out[key] = value
    return out
