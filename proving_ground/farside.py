"""The demo's cluster and notifier far sides: the one seam where Kubernetes and Slack plug in.

Everything else of the proving ground is real (Prometheus, Alertmanager, Slurm, the training
job, pitcrew itself). ``FarSide`` is what the demo asks of them. Kubernetes is the Kubernetes API
emulator behind pitcrew's real Kubernetes adapter (``proving_ground.kubeside.KubernetesFarSide``);
Slack is the Slack stand-in behind pitcrew's real Slack adapter (``proving_ground.slackside.SlackFarSide``,
which wraps the cluster far side). ``far_side()`` puts them together; nothing outside this module
knows which far sides run.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from proving_ground.pitcrew import Pitcrew


@dataclass(frozen=True, slots=True)
class Notice:
    """One message of an incident's thread, as humans read it."""

    kind: str
    title: str
    lines: tuple[str, ...]

    def text(self) -> str:
        return "\n".join([self.title, *(f"    {line}" for line in self.lines)])


class FarSide(Protocol):
    """What the demo needs of the Kubernetes and notifier far sides."""

    #: Shown in the demo's banner: which far side stands behind the cluster and notifier ports.
    description: str

    def start(self, workdir: Path, nodes: Sequence[str]) -> None:
        """Start whatever serves the far side, with one cluster node per Slurm node."""

    def pitcrew(self, workdir: Path, config: Mapping[str, Any], env: Mapping[str, str], port: int) -> Pitcrew:
        """The pitcrew process (not started; ``port`` 0: a free one) with its cluster and notifier
        pointed at this far side."""

    def replacements(self) -> list[str]:
        """Nodes whose replacement pitcrew has asked for, in order, each once."""

    def resets(self) -> list[str]:
        """Nodes whose GPU reset or reboot pitcrew has asked for, in order, each once."""

    def reboots(self) -> list[str]:
        """The node of each reboot pitcrew has asked for, in order (a node rebooted twice, twice)."""

    def node_ready(self, node: str) -> str:
        """The replacement of ``node`` has joined: report it Ready from now on; its name."""

    def thread(self, incident_id: str | None = None) -> list[Notice]:
        """What humans were told (one incident's thread, or what the channel shows), oldest first."""

    def thread_opened(self, incident_id: str) -> tuple[float, str] | None:
        """When (Unix time) and where the incident's thread was opened; ``None``: not yet, or unknown."""

    def node_calls(self, node: str) -> list[str]:
        """The destructive calls that reached the cluster or Slurm for ``node`` (``cordon``, ...)."""

    def approve(self, server: Pitcrew, incident_id: str) -> str:
        """Approve the incident's pending step as a person would; what happened, in words."""

    def click_help(self, incident_id: str) -> str | None:
        """The command that approves as a person's click would (``--interactive``); ``None``: none."""

    def state(self) -> dict[str, Any]:
        """What other commands need to reach this far side (written into the demo's state file)."""

    def where(self, incident_id: str | None) -> list[str]:
        """Lines telling a user where to look at this far side (``--keep``)."""

    def refused(self) -> list[str]:
        """What pitcrew asked of this far side that the real system has not got, in words (a
        Slack Web API method Slack lacks); empty when nothing. The demo fails on any: the stand-in
        answered as the real system would, but the run did not show what production would do."""

    def stop(self) -> None:
        """Stop what ``start`` started."""


def far_side() -> FarSide:
    """The far sides the demo runs against: the Slack stand-in in front of the Kubernetes API emulator."""
    # Both build on this module's Protocol and Notice.
    from proving_ground.kubeside import KubernetesFarSide
    from proving_ground.slackside import SlackFarSide

    return SlackFarSide(KubernetesFarSide())
