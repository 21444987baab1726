"""The kill switch at the wire: while pitcrew is paused, no call that changes a far side goes out.

The flow holds a mutating step before it starts (``IncidentFlow._enter``); this gate holds
every call that changes a far side once a step or an undo is already under way, so a pause
set in the middle of a drain or of a rollback stops the very next change, and a rollback
resumed after a restart while paused changes nothing. Steps and undos reach the far sides
only through the gated ports (``EngineDeps.step_deps``); what reads (a node's state, a job)
passes through. A held call raises ``Held`` before it is sent: the executor records the step
``held`` (its progress kept) and the flow waits for resume; a held rollback stays under way
and goes on after resume. Only a forced rollback (``pitcrew rollback --force``, audited) uses
the ports ungated.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import replace
from typing import Any, cast

from bot.engine.context import Ports
from bot.engine.ports import Cluster, NodeValidator, Scheduler
from bot.store.base import Store

#: The switch that pauses pitcrew (``pitcrew pause``).
PAUSE = "pause"

#: The port methods that change a far side, per port: everything else only reads.
WRITES: Mapping[str, frozenset[str]] = {
    "scheduler": frozenset({"down", "drain", "resume", "requeue", "signal_job"}),
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
    """A port whose writes first ask the store whether pitcrew is paused."""

    def __init__(self, inner: object, writes: frozenset[str], store: Store) -> None:
        self._inner = inner
        self._writes = writes
        self._store = store

    def __getattr__(self, name: str) -> Any:
        target = getattr(self._inner, name)
        if name not in self._writes:
            return target

        async def gated(*args: Any, **kwargs: Any) -> Any:
            by = await paused_by(self._store)
            if by is not None:
                raise Held(name, by)
            call = cast(Callable[..., Awaitable[Any]], target)
            return await call(*args, **kwargs)

        return gated


class _GatedValidator(_Gated):
    """A gated cluster that can validate a node: ``validate`` spelled out, so ``isinstance(...,
    NodeValidator)`` sees it however the Python version looks up protocol members."""

    async def validate(self, name: str, *, incident_id: str) -> bool | None:
        call = cast(Callable[..., Awaitable[bool | None]], self.__getattr__("validate"))
        return await call(name, incident_id=incident_id)


def gated(ports: Ports, store: Store) -> Ports:
    """The same ports, every write held while paused (reads and notices pass)."""
    cluster = ports.cluster
    kind = _GatedValidator if isinstance(cluster, NodeValidator) else _Gated
    return replace(
        ports,
        scheduler=cast(Scheduler, _Gated(ports.scheduler, WRITES["scheduler"], store)),
        cluster=None if cluster is None else cast(Cluster, kind(cluster, WRITES["cluster"], store)),
    )
