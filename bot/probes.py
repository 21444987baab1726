"""``pitcrew check-config --live``: reach every configured far side once, change nothing, and name
what is missing.

The ports come from the composition root (``bot.runtime.build_ports``), and so do the far sides
the outbox delivers to rather than a port (Slack's notices, Grafana's annotations:
``bot.runtime.outbox_far_sides``), so what is probed is exactly what ``pitcrew serve`` would
talk to. Each adapter implementing ``Probeable`` (``bot.engine.ports``) answers for its own far
side — an integration joins by implementing ``probe()`` and being a port or an outbox far side;
a port that is only the dry-run journal or the log has nothing to reach and says so. A probe that hangs or raises is a failed probe, never a crash:
the installer needs the whole list, not the first problem.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass

from bot.config import Config
from bot.config_sections import StoreSettings
from bot.domain.policy import Mode
from bot.engine.context import Ports
from bot.engine.ports import Probe, Probeable
from bot.runtime import build_ports, outbox_far_sides
from bot.store.factory import build_store

#: Longer than any adapter's own timeouts and retries (scontrol 20 s, HTTP 10 s with retries).
PROBE_TIMEOUT = 45.0


@dataclass(frozen=True, slots=True)
class FarSide:
    """One configured adapter and the roles it plays (the journal can be scheduler and cluster)."""

    roles: tuple[str, ...]
    adapter: object


@dataclass(frozen=True, slots=True)
class Checked:
    """A far side's answer; ``reached`` is false where there was nothing to reach."""

    roles: tuple[str, ...]
    probe: Probe
    reached: bool


def far_sides(ports: Ports, extra: Sequence[tuple[str, object]] = ()) -> list[FarSide]:
    """The distinct adapters behind ``ports`` (and ``extra`` ones), in port order."""
    named: list[tuple[str, object | None]] = [
        ("scheduler", ports.scheduler),
        ("cluster", ports.cluster),
        ("notifier", ports.notifier),
        ("query", ports.query),
        *extra,
    ]
    roles: dict[int, list[str]] = {}
    adapters: dict[int, object] = {}
    for role, adapter in named:
        if adapter is not None:
            roles.setdefault(id(adapter), []).append(role)
            adapters[id(adapter)] = adapter
    return [FarSide(tuple(roles[key]), adapters[key]) for key in adapters]


async def probe_far_sides(sides: Sequence[FarSide], *, within: float = PROBE_TIMEOUT) -> list[Checked]:
    """Every side probed at once; one answer each, in the order given."""
    return list(await asyncio.gather(*(_probe(side, within) for side in sides)))


async def _probe(side: FarSide, within: float) -> Checked:
    role = "/".join(side.roles)
    if not isinstance(side.adapter, Probeable):
        kind = str(getattr(side.adapter, "far_side", type(side.adapter).__name__))
        return Checked(
            side.roles, Probe(kind, True, "nothing to reach: pitcrew only writes it down"), reached=False
        )
    try:
        async with asyncio.timeout(within):
            probe = await side.adapter.probe()
    except TimeoutError:
        probe = Probe(role, False, f"no answer within {within:g}s", missing=(f"{role} answering in time",))
    except Exception as exc:  # a broken probe must not hide the other far sides' answers
        probe = Probe(role, False, f"probe failed: {type(exc).__name__}: {exc}", missing=(role,))
    return Checked(side.roles, probe, reached=True)


class StoreSide:
    """The incident store as ``check-config --live`` sees it: inspected, never opened (nothing is
    created, migrated or written), ``bot.store`` saying what it found."""

    far_side = "store"

    def __init__(self, settings: StoreSettings) -> None:
        self._settings = settings

    async def probe(self) -> Probe:
        seen = await build_store(self._settings).inspect()
        return Probe(seen.system, seen.ok, seen.detail, missing=seen.missing)


async def live_check(config: Config, *, within: float = PROBE_TIMEOUT) -> list[Checked]:
    """Build the configured ports, probe each far side and the store, close what was opened."""
    sides = far_sides(
        build_ports(config), [*outbox_far_sides(config), ("store", StoreSide(config.settings.store))]
    )
    try:
        return await probe_far_sides(sides, within=within)
    finally:
        for side in sides:
            close = getattr(side.adapter, "aclose", None)
            if close is not None:
                await close()


def render(checked: Sequence[Checked]) -> list[str]:
    """One line per far side: ``ok``, ``FAIL`` (with what is missing) or ``-`` (nothing to reach)."""
    lines = []
    for item in checked:
        status = "-" if not item.reached else "ok" if item.probe.ok else "FAIL"
        missing = f" — missing: {'; '.join(item.probe.missing)}" if item.probe.missing else ""
        roles = "/".join(item.roles)
        lines.append(f"  {status:<4} {item.probe.system:<11} ({roles}) {item.probe.detail}{missing}")
    return lines


def unable(config: Config, checked: Sequence[Checked]) -> list[str]:
    """One line per operation a reachable far side cannot do here that an acting playbook needs.

    Only the scheduler's ``requeue`` so far: the ``drain`` step requeues the jobs still running
    when a DRAIN's grace period ends (``slurm_drain_grace_seconds``), which any playbook with
    ``slurm_down`` and ``drain`` may reach unless it always sets DOWN (``slurm_action: down``).
    Slinky's operator always drains (``slurm.node_mapping: slinky``, whatever ``slurm_action``), and
    its jobs are requeued alike. ``requeue_job`` always requeues: a playbook with it is named when
    the catalog gives it to a fault (``requeue-hung-job`` is shipped, and opted into).
    """
    lines = []
    used = config.catalog.playbooks_used()
    for item in checked:
        for operation, why in item.probe.unable:
            if operation != "requeue":
                continue
            acting = {
                name: {spec.step for spec in playbook.steps}
                for name, playbook in sorted(config.playbooks.playbooks.items())
                if config.policy.mode_for(name) is not Mode.OBSERVE
            }
            draining = [
                name
                for name, steps in acting.items()
                if (
                    config.playbooks.get(name).slurm_action != "down"
                    or config.settings.slurm.node_mapping == "slinky"
                )
                and {"slurm_down", "drain"} <= steps
            ]
            if draining:
                lines.append(
                    f"{item.probe.system}: requeue, which {', '.join(draining)} need after a DRAIN's grace "
                    f"period: {why}; use the scontrol image (docker build --target scontrol), set "
                    f"slurm_action: down on those playbooks, or run them in observe mode"
                )
            requeueing = [name for name, steps in acting.items() if "requeue_job" in steps and name in used]
            if requeueing:
                lines.append(
                    f"{item.probe.system}: requeue, which {', '.join(requeueing)} need for a hung job: {why}; "
                    f"use the scontrol image (docker build --target scontrol), give job-hung another "
                    f"playbook, or run it in observe mode"
                )
    return lines


def missing(checked: Sequence[Checked]) -> list[str]:
    """``system: what`` for every failed far side (the exit line of ``check-config --live``)."""
    return [
        f"{item.probe.system}: {', '.join(item.probe.missing) or item.probe.detail}"
        for item in checked
        if not item.probe.ok
    ]
