"""The Slack app manifest (``deploy/slack-app.yaml``) grants exactly what pitcrew uses.

Cases: its bot scopes are the scopes of the Web API methods pitcrew calls (``PITCREW_METHODS``,
which the scenario tests hold every recorded call to) plus ``commands``; the one slash command is
``/pitcrew``; interactivity and Socket Mode are on.
"""

from __future__ import annotations

from pathlib import Path

import yaml

from tests.slack.methods import PITCREW_METHODS, SCOPES

MANIFEST = Path(__file__).resolve().parents[2] / "deploy" / "slack-app.yaml"


def test_manifest_scopes_are_exactly_what_pitcrew_calls() -> None:
    manifest = yaml.safe_load(MANIFEST.read_text())
    needed = {SCOPES[m] for m in PITCREW_METHODS if SCOPES.get(m)} | {"commands"}
    assert set(manifest["oauth_config"]["scopes"]["bot"]) == needed
    assert [c["command"] for c in manifest["features"]["slash_commands"]] == ["/pitcrew"]
    assert manifest["settings"]["interactivity"]["is_enabled"] is True
    assert manifest["settings"]["socket_mode_enabled"] is True
