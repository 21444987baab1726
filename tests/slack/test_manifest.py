"""The Slack app manifest (``deploy/slack-app.yaml``) grants exactly what pitcrew was seen using.

Cases: its bot scopes are the scopes of the Web API methods the Slack stand-in recorded pitcrew
calling during this test session (``proving_ground.slack.webapi.RECORDED``: calls with pitcrew's bot
token, across every test that talks to a stand-in — the incident flow, approvals, storms,
Socket Mode, crash redelivery, ``check-config --live``), plus ``commands`` for the slash
command; a recorded method with no known scope fails. The one slash command is ``/pitcrew``;
interactivity and Socket Mode are on. The test runs last (``tests/slack/conftest.py``), after
the tests that record; run alone, nothing was recorded and it fails saying so.
"""

from __future__ import annotations

from pathlib import Path

import yaml

from proving_ground.slack.methods import SCOPES
from proving_ground.slack.webapi import RECORDED

MANIFEST = Path(__file__).resolve().parents[2] / "deploy" / "slack-app.yaml"


def test_manifest_scopes_are_exactly_what_pitcrew_was_recorded_calling() -> None:
    assert RECORDED, "no Slack stand-in recorded a pitcrew call in this session: run it with tests/slack"
    unknown = RECORDED - set(SCOPES)
    assert not unknown, f"pitcrew called methods whose scope tests/slack/methods.py does not know: {unknown}"
    needed = {scope for m in RECORDED if (scope := SCOPES.get(m))} | {"commands"}
    manifest = yaml.safe_load(MANIFEST.read_text())
    assert set(manifest["oauth_config"]["scopes"]["bot"]) == needed, sorted(RECORDED)
    assert [c["command"] for c in manifest["features"]["slash_commands"]] == ["/pitcrew"]
    assert manifest["settings"]["interactivity"]["is_enabled"] is True
    assert manifest["settings"]["socket_mode_enabled"] is True
