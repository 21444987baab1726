"""Refuse, before anything starts, a configuration that could act on real nodes half-blind.

A mutating step run in approve or auto mode through a port that is only the dry-run journal
"succeeds" without changing anything, and the playbook goes on as if it had: with a real
Slurm behind the scheduler and the journal behind the cluster, ``replace`` is written down,
nothing is repaired, and ``slurm_resume`` returns the broken node to the training jobs.
``port_problems`` names every such combination, one line per port, with the keys to change;
``pitcrew check-config`` and ``pitcrew serve`` print them and exit 1, and
``bot.runtime.build_app`` raises them. Observe mode never acts, so it may use the journal.
"""

from __future__ import annotations

from dataclasses import dataclass

from bot.config import Config
from bot.domain.policy import Mode
from bot.engine.registry import StepRegistry
from bot.engine.steps import REGISTRY

#: What each port can be set to instead of the journal, for the refusal message.
_ALTERNATIVES = {
    "scheduler": "integrations.scheduler: slurm",
    "cluster": "integrations.cluster: none (Slurm-only sites: Kubernetes steps are skipped, replace, "
    "reboot and reset_gpu are handed to humans), integrations.cluster: kubernetes (act on the cluster)",
}
#: Settings that stand for no real system that acts on nodes.
_INERT = frozenset({"journal", "none"})


@dataclass(frozen=True, slots=True)
class _Offender:
    mode: Mode
    key: str  # the setting that gives the playbook its mode
    playbook: str
    steps: tuple[str, ...]  # the playbook's steps through the journalled port


def port_problems(config: Config, steps: StepRegistry = REGISTRY) -> list[str]:
    """One line per port set to ``journal`` that a mutating step of an approve/auto playbook needs
    (each step declares its port in the step registry)."""
    settings = config.settings
    kinds = {"scheduler": settings.integrations.scheduler, "cluster": settings.integrations.cluster}
    problems = []
    for port, kind in kinds.items():
        if kind != "journal":
            continue
        offenders = []
        for name, playbook in sorted(config.playbooks.playbooks.items()):
            mode = config.policy.mode_for(name)
            names = [spec.step for spec in playbook.steps if spec.step in steps]
            if mode is Mode.OBSERVE or not any(steps[s].mutating and steps[s].port == port for s in names):
                continue
            through = tuple(s for s in names if steps[s].port == port)
            offenders.append(_Offender(mode, _mode_key(config, name), name, through))
        if offenders:
            real = [f"integrations.{other}: {k}" for other, k in kinds.items() if k not in _INERT]
            problems.append(_line(port, offenders, real))
    mapping = settings.slurm.node_mapping
    if settings.integrations.cluster == "none" and mapping != "identity":
        problems.append(
            f"slurm.node_mapping: {mapping} reads Kubernetes nodes, but integrations.cluster: none means "
            "there are none; set slurm.node_mapping: identity"
        )
    return problems


def _mode_key(config: Config, playbook: str) -> str:
    return f"playbook_modes.{playbook}" if playbook in config.settings.playbook_modes else "mode"


def _line(port: str, offenders: list[_Offender], real: list[str]) -> str:
    groups: dict[tuple[Mode, str], list[_Offender]] = {}
    for offender in offenders:
        groups.setdefault((offender.mode, offender.key), []).append(offender)
    runs = " and ".join(
        f"mode {mode.value}{'' if key == 'mode' else f' ({key})'} runs "
        + ", ".join(f"{o.playbook} ({', '.join(o.steps)})" for o in group)
        for (mode, key), group in groups.items()
    )
    acting = f", while {' and '.join(real)} acts on real nodes" if real else ""
    observe = ", ".join(f"{key}: observe" for key in dict.fromkeys(o.key for o in offenders))
    return (
        f"{runs} through integrations.{port}: journal, a dry-run journal that changes nothing{acting}; "
        f"set {_ALTERNATIVES[port]} or {observe}"
    )
