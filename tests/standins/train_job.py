"""Re-export: the checkpointing training job now lives in ``bot.demo.train_job``."""

from bot.demo.train_job import (
    METRIC,
    ProgressServer,
    exposition,
    read_checkpoint,
    read_events,
    read_progress,
    train,
)

__all__ = [
    "METRIC",
    "ProgressServer",
    "exposition",
    "read_checkpoint",
    "read_events",
    "read_progress",
    "train",
]
