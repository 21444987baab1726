"""The demo's cluster and notifier far sides: the one seam where Kubernetes and Slack plug in.

Everything else of the proving ground is real (Prometheus, Alertmanager, Slurm, the training
job, pitcrew itself). ``FarSide`` is what the demo asks of them. Slack is the Slack stand-in
behind pitcrew's real Slack adapter (``bot.demo.slackside.SlackFarSide``, which wraps a cluster
far side). Kubernetes is, for now, the simulated far side (``SimulatedFarSide``:
``bot.demo.simulator``, a journal that models cordon, drain, replace and notices, run inside
pitcrew's process by ``python -m bot.demo.simulator.serve``). The Kubernetes API emulator with the
real Kubernetes adapter replaces it by implementing the same Protocol (start its server, name it
in pitcrew's configuration, make a replaced node's successor Ready) and being handed to
``SlackFarSide`` in ``far_side()``. Nothing outside this module knows which far sides run.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import yaml

from bot.demo.pitcrew import DESTRUCTIVE_OPS, Pitcrew
from bot.demo.proc import DemoError
from bot.demo.simulator.world import Journal


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
        """Start whatever serves the far side (nothing for the simulator: it runs inside pitcrew)."""

    def pitcrew(self, workdir: Path, config: Mapping[str, Any], env: Mapping[str, str], port: int) -> Pitcrew:
        """The pitcrew process (not started; ``port`` 0: a free one) with its cluster and notifier
        pointed at this far side."""

    def replacements(self) -> list[str]:
        """Nodes whose replacement pitcrew has asked for, in order, each once."""

    def resets(self) -> list[str]:
        """Nodes whose GPU reset or reboot pitcrew has asked for, in order, each once."""

    def node_ready(self, node: str) -> None:
        """The replacement of ``node`` has joined: report it Ready from now on."""

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

    def stop(self) -> None:
        """Stop what ``start`` started."""


class SimulatedFarSide:
    """The simulated cluster and notifier (``bot.demo.simulator``), inside pitcrew's process."""

    description = "simulated Kubernetes and notifier (journal)"

    def __init__(self) -> None:
        self._journal: Journal | None = None
        self._pitcrew: Pitcrew | None = None
        self._opened: dict[str, tuple[float, str]] = {}

    def start(self, workdir: Path, nodes: Sequence[str]) -> None:
        self._inventory = workdir / "inventory.yaml"
        self._inventory.write_text(yaml.safe_dump({"nodes": {n: {"partitions": ["gpu"]} for n in nodes}}))

    def pitcrew(self, workdir: Path, config: Mapping[str, Any], env: Mapping[str, str], port: int) -> Pitcrew:
        world = {"inventory": str(self._inventory), "external_replacement": True}
        server = Pitcrew(workdir, config=config, world=world, env=env, port=port)
        self._journal = Journal(server.journal)
        self._pitcrew = server
        return server

    def _records(self) -> list[dict[str, Any]]:
        if self._journal is None:
            raise DemoError("the far side has no pitcrew yet")
        return self._journal.records()

    def replacements(self) -> list[str]:
        return self._nodes_asked(("replace",))

    def resets(self) -> list[str]:
        return self._nodes_asked(("reset_gpu", "reboot"))

    def _nodes_asked(self, ops: tuple[str, ...]) -> list[str]:
        seen: list[str] = []
        for record in self._records():
            if record.get("op") in ops and record.get("node") not in seen:
                seen.append(str(record["node"]))
        return seen

    def node_ready(self, node: str) -> None:
        # The journal is the simulated cluster's state: one fsynced line, read by pitcrew's world.
        assert self._journal is not None
        asyncio.run(self._journal.append({"op": "node_ready", "node": node}))

    def thread(self, incident_id: str | None = None) -> list[Notice]:
        return [
            Notice(str(r.get("kind")), str(r.get("title")), tuple(str(line) for line in r.get("lines") or ()))
            for r in self._records()
            if r.get("op") == "notice" and (incident_id is None or r.get("incident_id") == incident_id)
        ]

    def thread_opened(self, incident_id: str) -> tuple[float, str] | None:
        # The journal keeps no post time: when the story first sees the notice (it polls often).
        seen = self._opened.get(incident_id)
        if seen is None and self.thread(incident_id):
            seen = self._opened[incident_id] = (time.time(), "notice in the simulated journal")
        return seen

    def node_calls(self, node: str) -> list[str]:
        return [
            str(r["op"]) for r in self._records() if r.get("op") in DESTRUCTIVE_OPS and r.get("node") == node
        ]

    def approve(self, server: Pitcrew, incident_id: str) -> str:
        status, answer = server.command(f"/api/v1/incidents/{incident_id}/approve", "demo")
        if status != 200:
            raise DemoError(f"approve {incident_id} answered {status}: {answer}")
        return f"approved through pitcrew's API as demo: {answer.get('message') or answer}"

    def click_help(self, incident_id: str) -> str | None:
        return None

    def state(self) -> dict[str, Any]:
        return {}

    def where(self, incident_id: str | None) -> list[str]:
        journal = self._pitcrew.journal if self._pitcrew is not None else "-"
        return [f"notices       {journal} (the incident thread, one JSON line per notice)"]

    def stop(self) -> None:
        return None


def far_side() -> FarSide:
    """The far side the demo runs against (the one place to switch to the emulators)."""
    from bot.demo.slackside import SlackFarSide  # it builds on this module's Protocol and Notice

    return SlackFarSide(SimulatedFarSide())
