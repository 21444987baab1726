"""Slurm's JSON (slurmrestd, ``squeue --json``, ``sinfo --json``) into pitcrew's records.

Pure translation, shared by the REST backend and by tests of the CLI's JSON output (and, for
partitions, by the ``scontrol`` backend, whose lines become the same ``Partition``): the
v0.0.38 shapes of Slurm 22.05 (``"state": "down"`` + ``state_flags``, plain integer times)
and the v0.0.39+ shapes of 23.02 and later (state lists, ``{"set", "number"}`` times). Also
reads a server's OpenAPI document to learn which API version and operations it offers.
It must not do I/O and never raises anything but ``ValueError`` on a malformed document.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any
from urllib.parse import quote

from bot.domain.goodput import gpus_in_gres, job_gpus
from bot.domain.jobs import NO_REQUEUE, NOT_BATCH, JobSnapshot, SlurmNodeState, expand_hostlist
from bot.engine.ports import PartitionNodes

#: Slurm error numbers that mean "no such object" (slurm_errno.h), across versions.
ESLURM_INVALID_JOB_ID = 2017
ESLURM_INVALID_NODE_NAME = 2018
#: A state change the node's state does not allow (a RESUME of a node in service), slurm_errno.h.
ESLURM_INVALID_NODE_STATE = 2028
#: 26.05's number for it: "Invalid node state transition", HTTP 422 (captured from 26.05.5's
#: slurmrestd, ``tests/fixtures/slurm/26.05/rest/v0.0.45/wire/node-resume-in-service.http``).
INVALID_NODE_STATE_TRANSITION = 2180
#: slurmctld refused the credential (an expired or wrongly signed token): 23.11 answers it as HTTP
#: 500, 24.05.5+ as 511 (slurmrestd's operations.c); 401 only for a missing or malformed header.
SLURM_PROTOCOL_AUTHENTICATION_ERROR = 1007
#: "Job is pending execution": a requeue of a job that waits requeued already (26.05's v0.0.45
#: answers it with HTTP 422).
ESLURM_JOB_PENDING = 2024
#: slurmctld's refusals to requeue a job (``job_mgr.c`` ``_job_requeue_op``): one submitted not
#: requeueable, "Requested operation is presently disabled"; one that is not a batch job (``srun``,
#: ``salloc``), "Only batch jobs are accepted or processed" (slurm_errno.h, slurm_errno.c).
ESLURM_DISABLED, ESLURM_BATCH_ONLY = 2037, 2039
#: A backup slurmctld not in control yet (HA takeover): "Slurm backup controller in standby mode",
#: and "Controller is in standby mode, try a different controller" (slurm_errno.h). 24.11 answers
#: them as HTTP 500, 26.05 as 422 like every slurmctld error (src/common/http.c).
ESLURM_IN_STANDBY_MODE, ESLURM_IN_STANDBY_USE_BACKUP = 2027, 2131

_BASE_JOB_STATES = frozenset(
    {"PENDING", "RUNNING", "SUSPENDED", "COMPLETED", "CANCELLED", "FAILED", "TIMEOUT", "NODE_FAIL"}
    | {"PREEMPTED", "BOOT_FAIL", "DEADLINE", "OUT_OF_MEMORY"}
)
_VERSION = re.compile(r"^/slurm/(v0\.0\.(\d+))/")
#: The slurmrestd API versions whose shapes pitcrew reads (Slurm 22.05 to 26.05), oldest first:
#: each read from a real server's answers (``tests/fixtures/slurm``; 26.05 serves v0.0.42 to
#: v0.0.45, and a Slurm dropping the oldest of its three keeps the others). Any other is refused by
#: name rather than read by guesswork: its fields may have moved again.
KNOWN_VERSIONS = ("v0.0.38", "v0.0.39", "v0.0.40", "v0.0.41", "v0.0.42", "v0.0.43", "v0.0.44", "v0.0.45")


def requeue_refusal(said: str, errno: int | None = None) -> str | None:
    """What slurmctld's refusal of a requeue means, by its number or its words (``scontrol
    requeue`` prints ``slurm_strerror``; 26.05's REST answer says "Requeue JobID=<id> failed" and
    the number), or ``None`` if it is no refusal that holds for the job's life."""
    text = said.lower()
    if errno == ESLURM_DISABLED or "presently disabled" in text:
        return NO_REQUEUE
    if errno == ESLURM_BATCH_ONLY or "only batch jobs" in text:
        return NOT_BATCH
    return None


@dataclass(frozen=True, slots=True)
class SlurmError:
    """One entry of a response's ``errors`` list, bounded for logs."""

    errno: int
    message: str

    @property
    def unknown_job(self) -> bool:
        return self.errno == ESLURM_INVALID_JOB_ID or "invalid job id" in self.message.lower()

    @property
    def unknown_node(self) -> bool:
        """No such node. 23.11-24.11 read an unknown name as a query that found nothing: no error of
        its own, "Failure to query node <name>" with the errno left as it was (0)."""
        said = self.message.lower()
        return (
            self.errno == ESLURM_INVALID_NODE_NAME
            or "invalid node name" in said
            or (self.errno == 0 and said.startswith("failure to query node "))
        )

    @property
    def job_pending(self) -> bool:
        """The job waits in the queue already (a requeue asked again: done)."""
        return self.errno == ESLURM_JOB_PENDING or "pending execution" in self.message.lower()

    @property
    def requeue_refused(self) -> str | None:
        """What it means, if it is a refusal to requeue that holds for the job's life (the answer
        to a requeue only: ``ESLURM_DISABLED`` names any operation switched off)."""
        return requeue_refusal(self.message, self.errno)

    @property
    def invalid_node_state(self) -> bool:
        return (
            self.errno in (ESLURM_INVALID_NODE_STATE, INVALID_NODE_STATE_TRANSITION)
            or "invalid node state" in self.message.lower()
        )

    @property
    def controller_standby(self) -> bool:
        """The controller answering is a backup not in control yet: wait, as for a lost one."""
        return (
            self.errno in (ESLURM_IN_STANDBY_MODE, ESLURM_IN_STANDBY_USE_BACKUP)
            or "standby mode" in self.message.lower()
        )

    @property
    def refused_credential(self) -> bool:
        return self.errno == SLURM_PROTOCOL_AUTHENTICATION_ERROR


@dataclass(frozen=True, slots=True)
class RestApi:
    """What a slurmrestd offers: the version pitcrew uses and whether nodes can be updated."""

    version: str
    node_update: bool
    versions: tuple[str, ...] = ()
    spellings: tuple[tuple[str, str], ...] = ()
    #: The server requeues a job over REST (v0.0.45, Slurm 26.05 on: ``GET job/{job_id}/requeue``).
    job_requeue: bool = False

    def path(self, template: str, **params: str) -> str:
        """The server's own spelling of ``/slurm/<version>/<template>``, parameters filled in."""
        spelled = dict(self.spellings).get(template, f"/slurm/{self.version}/{template}")
        return spelled.format(**{k: quote(v, safe="") for k, v in params.items()})


_TAILS = ("nodes", "jobs", "node/{node_name}", "job/{job_id}", "partitions", "job/{job_id}/requeue")


def discover_api(document: Mapping[str, Any], pinned: str = "auto") -> RestApi:
    """Pick the highest ``slurm/v0.0.XX`` pitcrew knows (``KNOWN_VERSIONS``) that can read nodes
    and jobs; a server offering none of them, or a pinned version pitcrew does not know, is
    refused with both lists named.

    Node updates are used only when the document lists ``post`` on the node path: Slurm
    22.05 (v0.0.38) answers 405 there, 23.02+ (v0.0.39+) accepts an ``update_node_msg``.
    Collection paths end with ``/`` from v0.0.40 on (``/nodes/``), so the document's own
    spelling is kept.
    """
    paths = document.get("paths")
    if not isinstance(paths, Mapping):
        raise ValueError("OpenAPI document has no paths")
    found: dict[str, int] = {}
    for path in paths:
        match = _VERSION.match(str(path))
        if match:
            found[match.group(1)] = int(match.group(2))
    usable = sorted(
        (
            v
            for v in found
            if v in KNOWN_VERSIONS
            and _spelling(paths, v, "nodes", "get")
            and _spelling(paths, v, "job/{job_id}", "get")
        ),
        key=found.__getitem__,
    )
    offered = ", ".join(sorted(found, key=found.__getitem__)) or "none"
    known = ", ".join(KNOWN_VERSIONS)
    if pinned != "auto":
        if pinned not in KNOWN_VERSIONS:
            raise ValueError(f"pitcrew does not know slurm/{pinned}; it knows {known}")
        if pinned not in found:
            raise ValueError(f"server does not offer slurm/{pinned}; it offers {offered}")
        version = pinned
    elif usable:
        version = usable[-1]
    else:
        raise ValueError(
            f"server offers no slurm API version pitcrew knows that reads nodes and jobs: "
            f"it offers {offered}; pitcrew knows {known}"
        )
    spellings = tuple((t, s) for t in _TAILS if (s := _spelling(paths, version, t, "get")))
    node_update = _spelling(paths, version, "node/{node_name}", "post") is not None
    requeue = _spelling(paths, version, "job/{job_id}/requeue", "get") is not None
    return RestApi(version, node_update, tuple(usable), spellings, requeue)


def _spelling(paths: Mapping[str, Any], version: str, tail: str, method: str) -> str | None:
    for spelling in (f"/slurm/{version}/{tail}", f"/slurm/{version}/{tail}/"):
        ops = paths.get(spelling)
        if isinstance(ops, Mapping) and method in ops:
            return spelling
    return None


def errors_of(payload: Mapping[str, Any]) -> list[SlurmError]:
    """The ``errors`` list of a response (22.05 uses ``errno``, later ``error_number``)."""
    out = []
    for item in payload.get("errors") or ():
        if not isinstance(item, Mapping):
            continue
        number = item.get("error_number", item.get("errno", -1))
        text = str(item.get("description") or item.get("error") or "error")
        out.append(SlurmError(int(number) if isinstance(number, int) else -1, text[:200]))
    return out


def node_from_json(raw: Mapping[str, Any]) -> SlurmNodeState:
    """One node of ``nodes[]`` (``/nodes``, ``/node/{name}``, ``sinfo --json``)."""
    state = raw.get("state")
    states = {s.upper() for s in (state if isinstance(state, list) else [state or "UNKNOWN"])}
    states.update(str(f).upper() for f in raw.get("state_flags") or ())
    user = raw.get("reason_set_by_user") or None
    return SlurmNodeState(
        name=str(raw["name"]),
        states=frozenset(states),
        reason=str(raw.get("reason") or ""),
        reason_user=str(user) if user else None,
        reason_time=_time(raw.get("reason_changed_at")),
        slurmd_started_at=_time(raw.get("slurmd_start_time")),
        gpus=gpus_in_gres(str(raw.get("gres") or "")),
    )


def job_from_json(raw: Mapping[str, Any]) -> JobSnapshot:
    """One job of ``jobs[]`` (``/jobs``, ``/job/{id}``, ``squeue --json``, or slurmdb/``sacct``)."""
    accounting = raw.get("state")
    if isinstance(accounting, Mapping):
        # slurmdb records one entry per run of a job: {"state": {"current": "NODE_FAIL"}, ...}
        times = raw.get("time")
        start = times.get("start") if isinstance(times, Mapping) else None
        return replace(
            job_from_json({**raw, "state": None, "job_state": accounting.get("current")}),
            start_time=_time(start),
        )
    state = raw.get("job_state")
    if isinstance(state, list):
        # v0.0.40+ lists the base state together with flags such as REQUEUED or COMPLETING.
        upper = [str(s).upper() for s in state]
        state = next((s for s in upper if s in _BASE_JOB_STATES), upper[0] if upper else "UNKNOWN")
    nodes = raw.get("nodes")
    reason = str(raw.get("state_reason") or "")
    return JobSnapshot(
        job_id=str(raw["job_id"]),
        name=str(raw.get("name") or ""),
        user=str(raw.get("user_name") or raw.get("user") or raw.get("user_id") or ""),
        state=str(state or "UNKNOWN").upper(),
        nodes=expand_hostlist(nodes) if isinstance(nodes, str) else (),
        restarts=int(raw.get("restart_cnt") or 0),
        requeue=bool(raw.get("requeue", True)),
        batch=bool(raw.get("batch_flag", True)),
        reason="" if reason in ("", "None") else reason,
        start_time=_time(raw.get("start_time")),
        gpus=job_gpus(
            str(raw.get("tres_per_node") or ""),
            str(_count(raw.get("node_count")) or ""),
            str(raw.get("tres_alloc_str") or ""),
        ),
    )


@dataclass(frozen=True, slots=True)
class Partition:
    """One Slurm partition: its name, its nodes as Slurm prints them (a hostlist or ``ALL``)
    and, where Slurm says, its node count."""

    name: str
    nodes: str
    total: int | None = None

    @property
    def everything(self) -> bool:
        return self.nodes.strip().upper() == "ALL"


def partition_from_json(raw: Mapping[str, Any]) -> Partition:
    """One partition of ``partitions[]``: v0.0.38/39 ``nodes`` + ``total_nodes``, v0.0.40+
    ``nodes: {configured, total}``."""
    nodes = raw.get("nodes")
    if isinstance(nodes, Mapping):
        return Partition(str(raw["name"]), str(nodes.get("configured") or ""), _count(nodes.get("total")))
    return Partition(str(raw["name"]), str(nodes or ""), _count(raw.get("total_nodes")))


def partitions_from_payload(payload: Mapping[str, Any]) -> list[Partition]:
    return [partition_from_json(p) for p in _items(payload, "partitions")]


def member_partitions(partitions: Sequence[Partition], node: str) -> PartitionNodes | None:
    """The partitions ``node`` is in and how many distinct nodes they hold together (a node in
    two partitions counts once); ``None`` when it is in none."""
    members = [p for p in partitions if p.everything or node in expand_hostlist(p.nodes)]
    if not members:
        return None
    names = {n for p in members if not p.everything for n in expand_hostlist(p.nodes)}
    # ``ALL`` is every node of the cluster: its count is the partition's own.
    whole = max((p.total or 0 for p in members if p.everything), default=0)
    return PartitionNodes(max(len(names), whole), tuple(p.name for p in members))


def nodes_from_payload(payload: Mapping[str, Any]) -> list[SlurmNodeState]:
    return [node_from_json(n) for n in _items(payload, "nodes")]


def jobs_from_payload(payload: Mapping[str, Any]) -> list[JobSnapshot]:
    return [job_from_json(j) for j in _items(payload, "jobs")]


def jobs_running_on(jobs: Sequence[JobSnapshot], node: str) -> list[JobSnapshot]:
    """Running jobs whose expanded node list includes ``node`` (squeue --json ignores -w)."""
    return [j for j in jobs if j.running and node in j.nodes]


def _items(payload: Mapping[str, Any], key: str) -> list[Mapping[str, Any]]:
    items = payload.get(key)
    if not isinstance(items, list):
        raise ValueError(f"response has no {key} list")
    return [i for i in items if isinstance(i, Mapping)]


def _count(value: object) -> int | None:
    if isinstance(value, Mapping):  # v0.0.39+ numbers: {"set", "infinite", "number"}
        value = value.get("number") if value.get("set") else None
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def _time(value: object) -> datetime | None:
    if isinstance(value, Mapping):
        # v0.0.39+: {"set": bool, "infinite": bool, "number": int}
        if not value.get("set") or value.get("infinite"):
            return None
        value = value.get("number")
    if isinstance(value, int) and value > 0:
        return datetime.fromtimestamp(value, tz=UTC)
    return None
