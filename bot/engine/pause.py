"""The kill switch at the wire: while pitcrew is paused, no call that changes a far side goes out.

The flow holds a mutating step before it starts (``IncidentFlow._enter``); this gate holds
every call that changes a far side once a step or an undo is already under way, so a pause
set in the middle of a drain or of a rollback stops the very next change, and a rollback
resumed after a restart while paused changes nothing. Steps and undos reach the far sides
only through the gated ports (``EngineDeps.step_deps``); what reads (a node's state, a job)
passes through. A held call raises ``Held`` before it is sent: the executor records the step
``held`` (its progress kept) and the flow waits for resume; a held rollback stays under way
and goes on after resume. Only a forced rollback (``pitcrew rollback --force``, audited) uses
the ports without the pause (the fence below still applies).

The same wire is where a leader's term is checked last: a leader stopped (SIGSTOP, a long GC, a
frozen VM) between a step's intent write and its call, past its lease, wakes with the call still
to send while another process has taken over and made it. The fenced intent write cannot catch
that — it committed in time. So every write first asks the process's ``Fence`` (``token``, a
local monotonic check, no I/O): once the lease may have lapsed the call is not sent and
``Deposed`` ends the worker, as a refused fenced write does. The call may still wait after this
check (its turn in a client's rate limit, a connection), so ``pitcrew serve``'s HTTP clients
(Slurm REST, Kubernetes, Slack, Grafana) ask the fence again once the request holds its
connection (``bot.integrations.fenced``). What is left is the instant between that check and the
bytes leaving (and, for scontrol, the command's start), which only a far side that checks the
epoch itself could close.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import replace
from typing import Any, cast

from bot.engine.context import Ports
from bot.engine.ports import Cluster, NodeValidator, Scheduler
from bot.store.base import Store
from bot.store.lease import Fence

#: The switch that pauses pitcrew (``pitcrew pause``).
PAUSE = "pause"

#: The port methods that change a far side, per port: everything else only reads.
WRITES: Mapping[str, frozenset[str]] = {
    "scheduler": frozenset({"down", "drain", "resume", "requeue", "signal_job", "set_reservation_nodes"}),
    "cluster": frozenset(
        {
            "cordon",
            "uncordon",
            "set_annotations",
            "set_labels",
            "evict",
            "delete_pod",
            "replace",
            "cancel_replacement",
            "reboot",
            "reset_gpu",
            "validate",
            "lend",
            "join",
            "lend_back",
            "keep_lent",
            "pool_command",
        }
    ),
}

#: The port methods that only read, per port: every method of a port is in exactly one of
#: ``WRITES`` and ``READS`` (``tests/unit/test_pause_gate.py``), so a new one must be placed.
READS: Mapping[str, frozenset[str]] = {
    "scheduler": frozenset({"node", "jobs_on_node", "job", "nodes", "partition_nodes", "reservation"}),
    "cluster": frozenset(
        {
            "node",
            "count_nodes",
            "nodes",
            "pods_on_node",
            "slurmd_pods",
            "replacement_started",
            "replacement_handle",
            "repair_owner",
            "successor",
            "held_up",
            "termination_held",
            "pool_nodes",
        }
    ),
}


class Held(Exception):
    """A call that changes a far side was not sent: pitcrew is paused."""

    def __init__(self, call: str, paused_by: str | None) -> None:
        super().__init__(f"paused by {paused_by or 'someone'}: {call} held until resume")
        self.call = call
        self.paused_by = paused_by


async def paused_by(store: Store) -> str | None:
    """Who paused pitcrew (``"unknown"`` when the switch does not say), or ``None``: not paused."""
    pause = await store.switch(PAUSE)
    return None if pause is None else str(pause.get("set_by") or "unknown")


class _Gated:
    """A port whose writes first ask the store whether pitcrew is paused (unless ``hold`` is
    off: a forced rollback), then the fence whether this process still leads."""

    def __init__(
        self, inner: object, writes: frozenset[str], store: Store, fence: Fence | None, *, hold: bool
    ) -> None:
        self._inner = inner
        self._writes = writes
        self._store = store
        self._fence = fence
        self._hold = hold

    def __getattr__(self, name: str) -> Any:
        target = getattr(self._inner, name)
        if name not in self._writes:
            return target

        async def gated(*args: Any, **kwargs: Any) -> Any:
            if self._hold:
                by = await paused_by(self._store)
                if by is not None:
                    raise Held(name, by)
            if self._fence is not None:
                self._fence.token()  # Deposed: the lease may have lapsed while we waited
            call = cast(Callable[..., Awaitable[Any]], target)
            return await call(*args, **kwargs)

        return gated


class _GatedValidator(_Gated):
    """A gated cluster that can validate a node: ``validate`` spelled out, so ``isinstance(...,
    NodeValidator)`` sees it however the Python version looks up protocol members."""

    async def validate(self, name: str, *, incident_id: str, rung: str) -> bool | None:
        call = cast(Callable[..., Awaitable[bool | None]], self.__getattr__("validate"))
        return await call(name, incident_id=incident_id, rung=rung)


def gated(ports: Ports, store: Store, fence: Fence | None = None, *, hold: bool = True) -> Ports:
    """The same ports, every write held while paused (``hold``) and refused once ``fence`` says
    this process may no longer lead (reads and notices pass)."""
    cluster = ports.cluster
    kind = _GatedValidator if isinstance(cluster, NodeValidator) else _Gated
    scheduler = _Gated(ports.scheduler, WRITES["scheduler"], store, fence, hold=hold)
    return replace(
        ports,
        scheduler=cast(Scheduler, scheduler),
        cluster=None
        if cluster is None
        else cast(Cluster, kind(cluster, WRITES["cluster"], store, fence, hold=hold)),
    )
