"""The dry-run journal: what pitcrew would have done, written down and never done.

``DryRunJournal`` stands behind the Scheduler and Cluster ports where no real system is
configured (``integrations.scheduler: journal``, ``integrations.cluster: journal``): every
call that would change something becomes one JSON line marked ``"dry_run": true`` with the
operation and its arguments, flushed and fsynced (off the event loop) before the call
returns, so the journal is a durable audit of observe mode. It holds no model of the far
side: reads know nothing and say so (``PermanentError(reason=Reason.DRY_RUN)``) or answer
empty, so nothing downstream can mistake a written line for an effect. pitcrew refuses to
start when a mutating step could run against it in approve or auto mode (``bot.safety``).

``LogNotifier`` stands behind the Notifier port until a chat adapter exists: every notice is
one structured log record and, with a journal, one journal line.

Simulated far sides (state, inventory, requeue, replacement) are test tools and live in
``tests/simulator``, never here.
"""

from __future__ import annotations

import asyncio
import fcntl
import json
import logging
import os
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, NoReturn

from bot.domain.jobs import JobSnapshot
from bot.domain.nodemap import SlurmdPod
from bot.engine.errors import PermanentError, Reason
from bot.engine.ports import Notice, OldNodeLook, PodRef

notice_log = logging.getLogger("pitcrew.notice")


class DryRunJournal:
    """Scheduler and Cluster that only append what they were asked to do."""

    #: What stands behind the ports (``bot.safety`` and ``bot.runtime`` read it).
    far_side = "journal"

    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock = asyncio.Lock()

    async def append(self, op: str, **arguments: Any) -> None:
        """One line for ``op``; durable before it returns (the fsync runs in a worker thread)."""
        line = {"at": datetime.now(UTC).isoformat(), "op": op, "dry_run": True, **arguments}
        async with self._lock:  # one writer at a time keeps lines whole and in call order
            await asyncio.to_thread(self._write, json.dumps(line, sort_keys=True) + "\n")

    def _write(self, text: str) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self.path.open("a", encoding="utf-8") as handle:
            fcntl.flock(handle, fcntl.LOCK_EX)  # another process appending to the same file
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())

    # ------------------------------------------------------------ reads: nothing is known
    async def node(self, name: str) -> NoReturn:
        """Neither Slurm's nor Kubernetes' view of a node: a dry run has none."""
        raise PermanentError(f"dry run: the journal does not know node {name}", reason=Reason.DRY_RUN)

    async def count_nodes(self) -> NoReturn:
        raise PermanentError("dry run: the journal does not know the fleet", reason=Reason.DRY_RUN)

    async def nodes(self) -> NoReturn:
        """Neither Slurm's nor Kubernetes' list of nodes: a dry run knows none out of service."""
        raise PermanentError("dry run: the journal does not know the fleet's nodes", reason=Reason.DRY_RUN)

    async def partition_nodes(self, name: str) -> NoReturn:
        """No partitions either: the breaker must not take a written line for a fleet."""
        raise PermanentError(
            f"dry run: the journal does not know the partitions of {name}", reason=Reason.DRY_RUN
        )

    async def jobs_on_node(self, name: str) -> list[JobSnapshot]:
        return []

    async def job(self, job_id: str) -> JobSnapshot | None:
        return None

    async def pods_on_node(self, name: str) -> list[PodRef]:
        return []

    async def slurmd_pods(self, namespace: str, selector: Mapping[str, str]) -> list[SlurmdPod]:
        return []

    async def replacement_started(self, name: str, *, incident_id: str) -> bool:
        return False

    async def cancel_replacement(self, name: str, *, incident_id: str) -> bool:
        return False

    async def repair_owner(self, name: str) -> str | None:
        return None

    async def replacement_handle(self, name: str, *, strategy: str) -> str | None:
        return None

    async def successor(self, name: str, *, handle: str | None) -> NoReturn:
        raise PermanentError(
            f"dry run: the journal does not know what replaced {name}", reason=Reason.DRY_RUN
        )

    async def held_up(self, name: str, *, handle: str) -> str | None:
        return None

    async def termination_held(self, name: str, *, handle: str) -> OldNodeLook:
        return OldNodeLook(gone=True)

    # ------------------------------------------------------------ Scheduler writes
    async def down(self, name: str, reason: str) -> None:
        await self.append("slurm_down", node=name, reason=reason)

    async def drain(self, name: str, reason: str) -> None:
        await self.append("slurm_drain", node=name, reason=reason)

    async def resume(self, name: str) -> None:
        await self.append("slurm_resume", node=name)

    async def requeue(self, job_id: str) -> None:
        await self.append("requeue", job_id=job_id)

    async def signal_job(self, job_id: str, signal: str) -> None:
        await self.append("signal_job", job_id=job_id, signal=signal)

    # ------------------------------------------------------------ Cluster writes
    async def cordon(self, name: str, *, incident_id: str, reason: str) -> None:
        await self.append("cordon", node=name, incident_id=incident_id, reason=reason)

    async def uncordon(self, name: str, *, incident_id: str) -> None:
        await self.append("uncordon", node=name, incident_id=incident_id)

    async def set_annotations(self, name: str, annotations: Mapping[str, str | None]) -> None:
        await self.append("annotate", node=name, annotations=dict(annotations))

    async def set_labels(self, name: str, labels: Mapping[str, str | None]) -> None:
        await self.append("label", node=name, labels=dict(labels))

    async def evict(self, pod: PodRef) -> None:
        await self.append("evict", pod=pod.ref)

    async def delete_pod(self, pod: PodRef, *, force: bool) -> None:
        await self.append("delete_pod", pod=pod.ref, force=force)

    async def replace(
        self,
        name: str,
        *,
        strategy: str,
        incident_id: str,
        slurm_nodes: Sequence[str] = (),
        nodeset_pods: Sequence[str] = (),
    ) -> str:
        await self.append("replace", node=name, strategy=strategy, incident_id=incident_id)
        return f"dry-run:{strategy}:{name}"

    async def reboot(self, name: str, *, incident_id: str, rung: str = "") -> None:
        await self.append("reboot", node=name, incident_id=incident_id, rung=rung)

    async def reset_gpu(self, name: str, gpus: Sequence[str], *, incident_id: str, rung: str = "") -> None:
        await self.append("reset_gpu", node=name, gpus=list(gpus), incident_id=incident_id, rung=rung)


class LogNotifier:
    """Notices as structured log records (logger ``pitcrew.notice``) and, given one, journal lines."""

    far_side = "log"

    def __init__(self, journal: DryRunJournal | None = None) -> None:
        self._journal = journal
        self._count = 0

    async def post(self, notice: Notice) -> str | None:
        self._count += 1
        notice_log.log(
            logging.WARNING if notice.severity in {"warning", "critical"} else logging.INFO,
            notice.title,
            extra={
                "incident": notice.incident_id,
                "kind": notice.kind,
                "severity": notice.severity,
                "title": notice.title,
                "lines": list(notice.lines),
            },
        )
        if self._journal is not None:
            await self._journal.append("notice", **notice.record())
        return f"log-{self._count}"
