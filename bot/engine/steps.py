"""The step registry: one reconcile function per step name of the shared vocabulary.

``approve`` is not here: the executor handles it, because it waits on humans rather than
on a far side.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from bot.engine import steps_cluster, steps_notify, steps_slurm
from bot.engine.context import Done, StepContext, Wait

Handler = Callable[[StepContext], Awaitable[Done | Wait]]

HANDLERS: dict[str, Handler] = {
    "notify": steps_notify.notify,
    "slurm_down": steps_slurm.slurm_down,
    "cordon": steps_cluster.cordon,
    "drain": steps_cluster.drain,
    "reset_gpu": steps_cluster.reset_gpu,
    "reboot": steps_cluster.reboot,
    "replace": steps_cluster.replace,
    "wait_ready": steps_cluster.wait_ready,
    "slurm_resume": steps_slurm.slurm_resume,
    "confirm_resumed": steps_slurm.confirm_resumed,
    "close": steps_notify.close,
}

#: The only steps observe mode runs; every other step is recorded as would-run.
OBSERVE_RUNS = frozenset({"notify", "close"})

#: What observe mode says instead of running a step.
WOULD = {
    "slurm_down": "set the Slurm node {action} with a pitcrew: reason (after recording its jobs)",
    "cordon": "cordon and taint the node, annotated with the incident id",
    "drain": "evict the node's pods through the Eviction API",
    "reset_gpu": "reset the faulty GPU(s)",
    "reboot": "reboot the node",
    "replace": "start a replacement of the node",
    "slurm_resume": "RESUME the Slurm node and uncordon it",
    "wait_ready": "wait for the node (or its replacement) to be Ready and its slurmd registered",
    "confirm_resumed": "confirm that every job recorded on the node runs again elsewhere",
}
