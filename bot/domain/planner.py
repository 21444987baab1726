"""The planner: (faults on a node, node history, policy, now) → plan.

A pure function. The most severe fault on a node decides its playbook; repeats inside the
escalation window climb the ladder (reset-gpu → reboot-node → replace-node); the mode
decides whether an ``approve`` step is inserted and whether mutating steps run at all.
Every decision is written down in ``Plan.reasons`` in words an operator can check.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Literal

from bot.domain.catalog import HANDS_OFF, severity
from bot.domain.durations import format_duration
from bot.domain.faults import Fault
from bot.domain.playbooks import APPROVE, PlaybookSet, Vocabulary
from bot.domain.policy import Mode, Policy

SlurmAction = Literal["down", "drain", "none"]


@dataclass(frozen=True, slots=True)
class PastIncident:
    """What the planner needs to know about an earlier incident on the same node."""

    incident_id: str
    playbook: str
    opened_at: datetime
    acted: bool


@dataclass(frozen=True, slots=True)
class Decision:
    """One guard's answer about a plan, in words an operator can check."""

    guard: str
    ok: bool
    words: str


@dataclass(frozen=True, slots=True)
class Plan:
    """What pitcrew will do for one node, and why — the record the engine runs and stores.

    The planner fills the first fields; admission adds the guards' verdict (``admitted``).
    """

    node: str
    faults: tuple[Fault, ...]
    decisive: Fault | None
    playbook: str
    mode: Mode
    steps: tuple[str, ...]
    slurm_action: SlurmAction
    reasons: tuple[str, ...]
    #: Whether any step would change a far side (before the mode is applied).
    acts: bool = False
    #: The node is a lemon: its earlier remediations in the lemon window (incident ids, oldest first).
    lemon: tuple[str, ...] = ()
    guards: tuple[Decision, ...] = ()
    guards_enforced: bool = False
    allowed: bool = True

    @property
    def runs_mutating_steps(self) -> bool:
        return self.acts and self.mode is not Mode.OBSERVE

    @property
    def summary(self) -> str:
        """The decisive fault in a few words (``XID 79 gpu3``): Slurm reasons and titles use it."""
        return self.decisive.short if self.decisive is not None else self.playbook

    def admitted(self, decisions: tuple[Decision, ...], allowed: bool) -> Plan:
        """This plan with the guards' verdict; guards bind only a plan that would change something."""
        enforced = self.runs_mutating_steps
        return replace(self, guards=decisions, guards_enforced=enforced, allowed=allowed or not enforced)


def choose_decisive(faults: Sequence[Fault]) -> Fault | None:
    """The fault that decides the playbook: most severe playbook, then job-fatal, then known."""
    if not faults:
        return None
    return max(faults, key=lambda f: (severity(f.playbook), f.job_fatal, f.known, -(f.xid or 0)))


def plan(
    node: str,
    faults: Sequence[Fault],
    history: Sequence[PastIncident],
    policy: Policy,
    playbooks: PlaybookSet,
    now: datetime,
    vocabulary: Vocabulary,
) -> Plan:
    reasons: list[str] = []
    ordered = tuple(sorted(faults, key=lambda f: (-severity(f.playbook), f.key)))
    decisive = choose_decisive(ordered)
    if decisive is None:
        return Plan(
            node, (), None, "ignore", policy.mode, ("close",), "none", ("no active fault on the node",)
        )

    reasons.append(
        f"{decisive.describe()} → {decisive.playbook}" + (f": {decisive.detail}" if decisive.detail else "")
    )
    if not decisive.known:
        reasons.append("not in the fault catalog: a human decides, pitcrew takes no action")
    for other in ordered:
        if other is not decisive:
            reasons.append(
                f"also {other.describe()} → {other.playbook} (less severe, covered by {decisive.playbook})"
            )

    playbook_name = _escalate(decisive.playbook, history, policy, now, reasons)
    lemon = _lemon(playbook_name, history, policy, now)
    if lemon:
        reasons.append(
            f"lemon: remediation {len(lemon) + 1} on this node within {format_duration(policy.lemon.window)}"
            f" (earlier: incidents {', '.join(lemon)}) → {policy.lemon.playbook}; the node is labelled"
            f" {policy.lemon.label} and humans are asked for an RMA with its history"
        )
        if severity(policy.lemon.playbook) > severity(playbook_name):
            playbook_name = policy.lemon.playbook
    playbook = playbooks.get(playbook_name)
    mode = policy.mode_for(playbook_name)
    steps = [spec.name for spec in playbook.steps]

    acts = playbook.acts(vocabulary)
    slurm_action: SlurmAction = "none"
    if "slurm_down" in steps:
        if playbook.slurm_action == "auto":
            slurm_action = "down" if decisive.job_fatal else "drain"
            why = "the fault kills the running job" if decisive.job_fatal else "the running job can finish"
            reasons.append(f"Slurm {slurm_action.upper()}: {why}")
        else:
            slurm_action = playbook.slurm_action
            reasons.append(f"Slurm {slurm_action.upper()}: set by playbook {playbook_name}")

    if playbook_name in HANDS_OFF or not acts:
        reasons.append(f"{playbook_name} never changes the node")
    elif mode is Mode.OBSERVE:
        skipped = ", ".join(s for s in steps if s in vocabulary and vocabulary[s].mutating)
        reasons.append(f"mode observe: {skipped} are recorded as would-run and not executed")
    elif mode is Mode.APPROVE:
        first = next(
            (
                i
                for i, spec in enumerate(playbook.steps)
                if spec.step in vocabulary and spec.needs_approval(vocabulary[spec.step])
            ),
            None,
        )
        if first is not None:
            steps.insert(first, APPROVE)
            approvers = (
                ", ".join(policy.approvals.approvers) or "nobody is configured: set approvals.approvers"
            )
            reasons.append(
                f"mode approve: {playbook.steps[first].name} and later steps wait for approval "
                f"(approvers: {approvers}; deadline {format_duration(policy.approvals.timeout)}, "
                f"then nothing is done)"
            )
    else:
        reasons.append("mode auto: steps run without approval")
    return Plan(
        node=node,
        faults=ordered,
        decisive=decisive,
        playbook=playbook_name,
        mode=mode,
        steps=tuple(steps),
        slurm_action=slurm_action,
        reasons=tuple(reasons),
        acts=acts,
        lemon=lemon,
    )


def _lemon(playbook: str, history: Sequence[PastIncident], policy: Policy, now: datetime) -> tuple[str, ...]:
    """The node's earlier remediations in the lemon window when this one makes it a lemon, else ``()``.

    Any fault counts; only incidents that changed the node do (a notice is no remediation), and a
    fault that would itself change nothing does not turn into a replacement.
    """
    if playbook in HANDS_OFF:
        return ()
    window = policy.lemon.window
    earlier = sorted(
        (h for h in history if h.acted and now - window <= h.opened_at <= now), key=lambda h: h.opened_at
    )
    if len(earlier) + 1 < policy.lemon.incidents:
        return ()
    return tuple(h.incident_id for h in earlier)


def _escalate(
    playbook: str, history: Sequence[PastIncident], policy: Policy, now: datetime, reasons: list[str]
) -> str:
    ladder = policy.escalation.ladder
    if playbook not in ladder:
        return playbook
    window = policy.escalation.window
    recent = [h for h in history if h.acted and h.playbook in ladder and now - window <= h.opened_at <= now]
    if not recent:
        return playbook
    last = max(recent, key=lambda h: (ladder.index(h.playbook), h.opened_at))
    rung = max(ladder.index(playbook), ladder.index(last.playbook) + 1)
    chosen = ladder[min(rung, len(ladder) - 1)]
    if chosen != playbook:
        reasons.append(
            f"repeat: {last.playbook} already ran on this node (incident {last.incident_id}, "
            f"{format_duration(now - last.opened_at)} ago, within {format_duration(window)}) → escalate to {chosen}"
        )
    elif ladder.index(last.playbook) >= ladder.index(playbook):
        reasons.append(f"repeat within {format_duration(window)}; {chosen} is already the top of the ladder")
    return chosen
