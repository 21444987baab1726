"""An alert pitcrew raises itself (the Slurm watch, the hung-job watch): its identity and words.

Such a record enters the store like one of Alertmanager's, so everything after it - dedupe, one
incident per node, guards, the playbook - is the same as for a Prometheus alert. Pure: data only.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime


@dataclass(frozen=True, slots=True)
class Sourced:
    """One alert of pitcrew's own sources: the node it is about, an identity that repeats for as
    long as the same condition lasts (so every look is a redelivery), and its labels and words."""

    node: str
    fingerprint: str
    starts_at: datetime
    labels: dict[str, str]
    annotations: dict[str, str]
