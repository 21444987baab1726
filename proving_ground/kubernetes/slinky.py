"""The Slurm side the emulator's slurm-operator stand-in reads and drains.

slurm-operator (SlinkyProject/slurm-operator, ``internal/controller/nodeset``) talks to Slurm
through slurmrestd: it reads each NodeSet pod's Slurm node (state and reason), drains it when the
Kubernetes node is cordoned, and keeps the pod's ``pod-protect`` label while the Slurm node is busy.
``MemorySlurm`` is that Slurm in memory (integration tests); ``ScontrolSlurm`` is a real cluster of
the harness (end-to-end tests), read and drained with ``scontrol``.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Protocol
from unicodedata import category

import attrs

if TYPE_CHECKING:
    from proving_ground.slurm import SlurmCluster

#: What the operator puts before every reason it writes; a reason without it is someone else's.
OPERATOR_PREFIX = "slurm-operator: "
#: Slurm states in which the node is doing work (slurm_conditions.IsNodeBusy).
BUSY = frozenset({"ALLOCATED", "MIXED", "COMPLETING"})


#: The operator's limit on a reason it writes (runes), after sanitizing.
MAX_REASON = 256


def slurm_reason(text: str) -> str:
    """The operator's sanitizeSlurmReason: tabs and line breaks become spaces, other control
    characters go, the ends are trimmed, and at most ``MAX_REASON`` characters are kept."""
    kept = "".join(" " if c in "\t\n\r" else c for c in text if c in "\t\n\r" or category(c) != "Cc")
    return kept.strip()[:MAX_REASON].strip()


class SlurmSide(Protocol):
    async def state(self, hostname: str) -> tuple[bool, str]:
        """Whether the Slurm node is busy, and its reason ("" when none)."""
        ...

    async def drain(self, hostname: str, reason: str) -> None: ...


@attrs.define
class MemorySlurm:
    """Slurm nodes in memory: busy while a job runs (``busy``), their reasons (``reasons``)."""

    busy: dict[str, bool] = attrs.field(factory=dict)
    reasons: dict[str, str] = attrs.field(factory=dict)
    drained: set[str] = attrs.field(factory=set)

    async def state(self, hostname: str) -> tuple[bool, str]:
        return self.busy.get(hostname, False), self.reasons.get(hostname, "")

    async def drain(self, hostname: str, reason: str) -> None:
        self.drained.add(hostname)
        self.reasons[hostname] = reason


@attrs.define
class ScontrolSlurm:
    """A harness cluster, through ``scontrol`` (run off the emulator's loop)."""

    cluster: SlurmCluster

    async def state(self, hostname: str) -> tuple[bool, str]:
        node = await asyncio.to_thread(self.cluster.node, hostname)
        return bool(node.states & BUSY), node.reason

    async def drain(self, hostname: str, reason: str) -> None:
        await asyncio.to_thread(
            self.cluster.run, "scontrol", "update", f"NodeName={hostname}", "State=DRAIN", f"Reason={reason}"
        )
