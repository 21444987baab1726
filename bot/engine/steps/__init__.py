"""pitcrew's steps, one module per concern; importing this package registers every step in
``bot.engine.registry.REGISTRY`` — the one list of what a playbook may say."""

from bot.engine.registry import REGISTRY
from bot.engine.steps import back, capacity, checkpoint, cluster, notify, repair, requeue, resumed, slurm

__all__ = [
    "REGISTRY",
    "back",
    "capacity",
    "checkpoint",
    "cluster",
    "notify",
    "repair",
    "requeue",
    "resumed",
    "slurm",
]
