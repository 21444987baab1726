"""A SIGKILL of pitcrew between Slack posting the parent and pitcrew recording its ts: no duplicate.

Cases (pitcrew as a real process, the simulated far side, the stand-in in its own thread): the
stand-in kills pitcrew (SIGKILL) the moment it has stored the incident's parent message, before
answering; pitcrew restarts, finds the message by the metadata naming its outbox item
(``conversations.history``) and records it instead of posting again; the incident goes on and the
same parent is updated afterwards (its buttons, then the approval). One parent, posted once.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from proving_ground.slack.methods import PITCREW_METHODS
from proving_ground.slack.threaded import threaded_standin
from proving_ground.slack.webapi import Call
from proving_ground.slack.world import BOT_TOKEN, SIGNING_SECRET
from tests.harness.engine_scans import scrape, wait_scans
from tests.harness.pitcrew import Crash, Pitcrew
from tests.harness.proc import wait_until
from tests.harness.scenarios import delivery


def test_sigkill_after_posting_the_parent_does_not_post_it_twice(
    pitcrew_factory: Any, tmp_path: Path
) -> None:
    (tmp_path / "bot.token").write_text(BOT_TOKEN)
    (tmp_path / "signing.secret").write_text(SIGNING_SECRET)
    with threaded_standin() as slack:
        server: Pitcrew = pitcrew_factory(
            "crash",
            config={
                "mode": "approve",
                "approvals": {"approvers": ["alice"], "timeout": "10m"},
                "guards": {"breaker": {"max_nodes": 10, "max_fraction": 1.0}},
                "integrations": {"notifier": "slack"},
                "slack": {
                    "bot_token_file": str(tmp_path / "bot.token"),
                    "signing_secret_file": str(tmp_path / "signing.secret"),
                    "transport": "http",
                    "channel": "C0GPUOPS",
                    "approvers": ["U0ALICE"],
                    "base_url": slack.base_url,
                    "retry_backoff_max": "0.5s",
                },
            },
        )
        crash = Crash(server)

        def kill_after_parent(call: Call) -> None:
            if call.method == "chat.postMessage" and not call.args.get("thread_ts"):
                crash.fire()  # Slack has the message; pitcrew never hears

        slack.api.on_call = kill_after_parent
        server.start()
        _, body = server.post_alerts(delivery(node="gpu-node-02"))
        incident = body["opened"][0]
        crash.wait("the parent to be posted")
        assert len(slack.api.messages) == 1

        server.start()
        server.wait_incident(incident, "awaiting_approval")
        parent = slack.api.messages[0]
        wait_until(lambda: bool(parent.updates), timeout=30, what="the recovered parent to be updated")
        wait_scans(scrape(server))  # the engine looked again, three times: still no second post
        tops = [m for m in slack.api.messages if m.thread_ts is None]
        assert len(tops) == 1, [m.text for m in tops]
        assert len([c for c in slack.api.calls_to("chat.postMessage") if not c.args.get("thread_ts")]) == 1
        assert slack.api.calls_to("conversations.history"), "the restarted pitcrew did not look first"
        assert tops[0].metadata and tops[0].metadata["event_payload"]["incident_id"] == incident
        assert {c.method for c in slack.api.calls} <= PITCREW_METHODS  # the manifest grants these
        ids = [e["action_id"] for b in parent.blocks if b["type"] == "actions" for e in b["elements"]]
        assert ids == ["pitcrew_approve", "pitcrew_reject", "pitcrew_rollback"]
