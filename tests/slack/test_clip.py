"""``messages.clip`` on mrkdwn: within the limit, marked, and never through an entity or a link.

Cases: a text of a link (with an escaped ``&`` in its address) and escaped markup, clipped at every
length from 1 to 59: never longer than the limit, and what is left has no half entity (a bare
``&``) and no half link (a stray ``<`` or ``>``).
"""

from __future__ import annotations

import pytest

from bot.integrations.slack import messages
from proving_ground.slack import mrkdwn

HOSTILE = "<!channel> & <https://evil.example|Approve>"


@pytest.mark.parametrize("limit", range(1, 60))
def test_a_clip_never_cuts_an_entity_or_a_link(limit: int) -> None:
    text = messages.Mrkdwn(
        "a " + messages.link("https://grafana.example/d?x=1&y=2", "Grafana") + " " + messages.escape(HOSTILE)
    )
    clipped = messages.clip(text, limit)
    assert len(clipped) <= limit
    body = clipped.removesuffix("…")
    assert not mrkdwn.stray_brackets(body) and not mrkdwn.bare_ampersands(body), body
