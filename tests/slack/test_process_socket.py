"""``pitcrew serve`` as a real process in Socket Mode: it builds the app before its event loop runs,
connects to the stand-in with the app-level token, and answers ``/pitcrew status`` in the ack."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from proving_ground.slack import signing
from proving_ground.slack.threaded import ThreadedStandin
from proving_ground.slack.world import APP_TOKEN, BOT_TOKEN
from tests.harness.pitcrew import Pitcrew


def test_serve_in_socket_mode(pitcrew_factory: Any, tmp_path: Path) -> None:
    (tmp_path / "bot.token").write_text(BOT_TOKEN)
    (tmp_path / "app.token").write_text(APP_TOKEN)
    threaded = ThreadedStandin().start()
    try:
        slack = threaded.standin
        server: Pitcrew = pitcrew_factory(
            "socket",
            config={
                "mode": "observe",
                "integrations": {"notifier": "slack"},
                "slack": {
                    "bot_token_file": str(tmp_path / "bot.token"),
                    "app_token_file": str(tmp_path / "app.token"),
                    "channel": "C0GPUOPS",
                    "approvers": ["U0ALICE"],
                    "base_url": slack.base_url,
                },
            },
        ).start()
        threaded.run(slack.socket.connected(timeout=20), timeout=25)

        async def status() -> dict[str, Any]:
            envelope = await slack.socket.send("slash_commands", signing.slash_fields("status"))
            return await slack.socket.ack(envelope)

        ack = threaded.run(status())
        assert "mode *observe*" in ack["payload"]["text"]
        assert server.alive
    finally:
        threaded.stop()
