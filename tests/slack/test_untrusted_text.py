"""Text from outside reaches Slack as text: never a mention, never a link, always within the limits.

Cases: a Slurm job named ``<!channel> & <https://evil.example|Approve>`` (its user too) on the
faulty node, beside a job whose name is 3,000 ``<`` (escaped, four times as long), and an alert
whose description carries the same markup; the incident runs to its summary (auto mode). The
stand-in parses the mrkdwn of every message, edit and ephemeral answer and flags any control
sequence found inside that outside text and any bare ``&``: none. No message in the channel
notifies the channel or links anywhere but pitcrew's own links; the job name is shown as it is
(read back through Slack's entities); every post and edit passed Slack's Block Kit limits (the
stand-in refuses anything over them) and no notice failed. And the pure side: every message
builder, fed that markup at any length, shows it as text and stays within the limits.
Failed before escaping: the stand-in flagged ``<!channel>`` and the link, and the bare ``&``.
"""

from __future__ import annotations

import json
import sqlite3
from datetime import UTC, datetime
from pathlib import Path

import pytest

from bot.integrations.slack import messages
from bot.integrations.slack.messages import Decision, DigestEntry, ParentView
from proving_ground.slack import blocks as blockkit
from proving_ground.slack import mrkdwn
from proving_ground.slack.server import SlackStandin
from tests.harness.scenarios import delivery, gpu_node, inventory
from tests.slack.pitcrew_app import CHANNEL, SlackPitcrew, until

HOSTILE = "<!channel> & <https://evil.example|Approve>"
BRACKETS = "<" * 3000
OURS = ("https://grafana.example/", "https://runbooks.example/")
AT = datetime(2026, 11, 29, tzinfo=UTC)


def _texts(slack: SlackStandin) -> list[str]:
    """The mrkdwn of every version of every message in the channel, and of every ephemeral answer."""
    found: list[str] = []
    for m in [*slack.api.messages, *slack.api.deleted]:
        for version in [{"text": m.text, "blocks": m.blocks}, *m.updates]:
            found.append(str(version["text"]))
            found += [text for _, text in mrkdwn.mrkdwn_texts(version["blocks"])]
    found += [str(e["text"]) for e in slack.api.ephemeral]
    return found


async def test_a_hostile_job_name_is_shown_as_text(slack: SlackStandin, tmp_path: Path) -> None:
    slack.api.outside += [HOSTILE, BRACKETS]
    world = inventory(
        tmp_path / "inventory.yaml",
        {"gpu-node-02": gpu_node("ml-train/worker-2")},
        [
            {"job_id": "301", "name": HOSTILE, "user": HOSTILE, "node": "gpu-node-02"},
            {"job_id": "302", "name": BRACKETS, "user": "dana", "node": "gpu-node-02"},
        ],
    )
    body = json.loads(delivery(node="gpu-node-02"))
    for alert in body["alerts"]:
        alert["annotations"]["description"] = HOSTILE
    async with SlackPitcrew(tmp_path / "p", slack, config={"mode": "auto"}, inventory=world) as pitcrew:
        incident = (await pitcrew.post_alerts(json.dumps(body).encode()))["opened"][0]
        done = await pitcrew.wait_incident(incident, "resolved", "failed", timeout=60)
        db = pitcrew.workdir / "pitcrew.db"

        def drained() -> bool:
            with sqlite3.connect(db) as conn:
                return bool(
                    conn.execute("SELECT COUNT(*) FROM outbox WHERE delivered_at IS NULL").fetchone()[0] == 0
                )

        await until(drained, what="every notice delivered")
        await pitcrew.quiet()
        done = await pitcrew.incident(incident)

    assert not slack.api.flags, "\n".join(str(f) for f in slack.api.flags)
    assert not [e for e in done["events"] if e["kind"] == "notice_failed"]
    texts = _texts(slack)
    for text in texts:
        for control in mrkdwn.controls(text):
            assert control.kind in {"link", "user"}, (control, text[:200])
            if control.kind == "link":
                assert control.target.startswith(OURS), control
    assert any(HOSTILE in mrkdwn.unescape(t) for t in texts), "the job name is not shown"
    summary = [m for m in slack.api.channel_view(CHANNEL) if m.reply_broadcast]
    assert len(summary) == 1


def _hostile_messages() -> list[tuple[str, messages.Message]]:
    long = (HOSTILE + " ") * 400
    view = ParentView(
        incident_id="pc-" + long,
        node=long,
        title=long,
        lines=tuple([long] * 50),
        severity="critical",
        mode=HOSTILE,
        plan=long,
        gpu=long,
        state=HOSTILE,
        status=long,
        grafana="https://grafana.example/d/x?a=1&b=<2>|x",
        runbook="https://runbooks.example/" + long,
        decisions=(Decision(HOSTILE, HOSTILE, AT),),
        offer=("approve", "reject", "rollback"),
        jobs=tuple([long] * 20),
        capacity=long,
    )
    entries = [DigestEntry(HOSTILE, long, HOSTILE, HOSTILE, n % 2 == 0) for n in range(300)]
    return [
        ("parent", messages.parent(view)),
        ("reply", messages.reply(long, [long] * 100, HOSTILE)),
        ("summary", messages.summary(long, [long] * 100, HOSTILE)),
        ("digest", messages.digest(entries, HOSTILE, HOSTILE)),
        ("channel notice", messages.channel_notice(long, [long], "critical")),
    ]


@pytest.mark.parametrize(
    ("name", "message"), _hostile_messages(), ids=lambda v: v if isinstance(v, str) else ""
)
def test_every_builder_escapes_then_clips(name: str, message: messages.Message) -> None:
    assert blockkit.validate(message.blocks) == [], name
    flags = []
    for pointer, text in [("/text", message.text), *mrkdwn.mrkdwn_texts(message.blocks)]:
        flags += mrkdwn.audit("build", pointer, text, [HOSTILE], broadcasts_allowed=False)
        assert not mrkdwn.stray_brackets(text), (pointer, text[:200])
        for control in mrkdwn.controls(text):
            assert control.kind in {"link", "user"} and not control.target.startswith("https://evil"), control
    assert not flags, [str(f) for f in flags]
